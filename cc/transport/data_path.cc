#include "cc/transport/data_path.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "cc/transport/hierarchical_transport.h"
#include "cc/logging.h"
#include "cc/transport/shm_transport.h"

namespace tfring {
namespace {

// The hierarchical transport, unless TFRING_HIERARCHICAL_ALLREDUCE=0, when
// the ranks span several hosts with the same number (two or more) on each;
// else null. By default (=measured) wire-compressed allreduces take it
// (measured on 2 hosts x 2 ranks at 1 Gbit/s, bf16 across hosts took about
// half the time of encoding every rank's data among all ranks), and
// uncompressed ones take the path the job measures faster: flat at 1 Gbit/s,
// hierarchical at 10 Gbit/s on the same hosts (docs/compression.md).
Status ConnectHierarchical(MpiTransport* flat, const Config& config,
                           std::unique_ptr<Transport>* transport) {
  transport->reset();
  if (config.hierarchical_allreduce == 0) return Status::OK();
  std::vector<int64_t> local_sizes;
  TFRING_RETURN_IF_ERROR(
      flat->AllgatherInt64s({static_cast<int64_t>(flat->topology().local_size)}, &local_sizes));
  const int64_t local_size = local_sizes[0];
  const bool even = std::all_of(local_sizes.begin(), local_sizes.end(),
                                [&](int64_t n) { return n == local_size; });
  const bool several_hosts = local_size < flat->size();
  if (!several_hosts) return Status::OK();
  if (!even) {
    if (flat->rank() == 0 && config.hierarchical_allreduce == 1) {
      TFRING_LOG(kWarning, "TFRING_HIERARCHICAL_ALLREDUCE=1 is ignored: the hosts run different "
                           "numbers of ranks, and the hierarchical allreduce needs the same "
                           "number on each. Start as many ranks on every host (e.g. "
                           "tfringrun -H host1:4,host2:4).");
    }
    return Status::OK();
  }
  if (local_size < 2) return Status::OK();  // one rank per host: nothing to split
  std::unique_ptr<MpiTransport> local_mpi, cross;
  TFRING_RETURN_IF_ERROR(MpiTransport::CreateHostSplit(flat->comm(), &local_mpi, &cross));
  // The host's ranks share memory when they can (errors then name job ranks).
  std::vector<int64_t> job_ranks64;
  TFRING_RETURN_IF_ERROR(local_mpi->AllgatherInt64s({flat->rank()}, &job_ranks64));
  const std::vector<int> job_ranks(job_ranks64.begin(), job_ranks64.end());
  MpiTransport* local_inner = local_mpi.get();
  std::unique_ptr<Transport> local;
  TFRING_RETURN_IF_ERROR(
      ShmTransport::Connect(local_inner, std::move(local_mpi), config, job_ranks, &local));
  // Uncompressed allreduces: all, those above the threshold, or none take
  // the hierarchy.
  int64_t min_bytes = -1;
  int64_t trials = 0;
  if (config.hierarchical_allreduce == 1) min_bytes = 0;
  if (config.hierarchical_allreduce == kHierarchicalAuto) min_bytes = config.hierarchical_threshold;
  if (config.hierarchical_allreduce == kHierarchicalMeasured) {
    min_bytes = config.hierarchical_threshold;
    trials = config.hierarchical_trials;
  }
  transport->reset(
      new HierarchicalTransport(flat, std::move(local), std::move(cross), min_bytes, trials));
  return Status::OK();
}

}  // namespace

Status ChooseDataPath(MpiTransport* flat, const Config& config, DataPath* path,
                      std::unique_ptr<Transport>* transport) {
  std::vector<int> job_ranks(flat->size());
  for (int r = 0; r < flat->size(); ++r) job_ranks[r] = r;
  TFRING_RETURN_IF_ERROR(ShmTransport::Connect(flat, nullptr, config, job_ranks, transport));
  if (*transport) {
    *path = DataPath::kSharedMemory;
    return Status::OK();
  }
  TFRING_RETURN_IF_ERROR(ConnectHierarchical(flat, config, transport));
  *path = *transport ? DataPath::kHierarchical : DataPath::kMpi;
  return Status::OK();
}

}  // namespace tfring
