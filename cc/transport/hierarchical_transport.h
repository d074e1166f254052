// HierarchicalTransport: allreduce in three steps when the ranks span hosts.
//
// Why: between hosts the network is the bottleneck. A flat allreduce over
// every rank sends each host's data across the network once per rank on it;
// reducing inside the host first (shared memory or MPI's on-host path),
// then letting each local rank take one slice across the hosts, sends every
// byte across once per host and keeps all the host's links busy at once.
//
// How: (1) local rank j reduces slice j inside the host (a reduce-scatter:
// shared memory reduces nothing else, ReduceScatterAtOffsets), (2) local
// rank j allreduces slice j with local rank j of every other host, (3) the
// host's ranks gather the slices. One slicing (SliceCounts) serves all three
// steps. Slice j is reduced inside each host by one rank, across hosts by
// one allreduce, then copied: every rank of the job ends with the same
// bits. Only allreduces of at least `min_bytes` take this path (three steps
// cost more than one for small messages); negotiation and every other
// collective use the flat transport. When the job leaves the choice to
// tfring, the uncompressed ones among them go flat or hierarchical as
// measured in the job (path_trial.h).
//
// With wire compression (AllreduceWire), step (2) is a CrossHostSum: only
// the slices that cross hosts are encoded; every allreduce so asked takes
// this path, whatever its size.
//
// Requires the same number of ranks on every host (the caller checks), so
// slice j has the same length on every host.
#ifndef TFRING_CC_TRANSPORT_HIERARCHICAL_TRANSPORT_H_
#define TFRING_CC_TRANSPORT_HIERARCHICAL_TRANSPORT_H_

#include <functional>
#include <memory>
#include <vector>

#include "cc/transport.h"
#include "cc/transport/cross_host_sum.h"
#include "cc/transport/path_trial.h"

namespace tfring {

class HierarchicalTransport : public Transport {
 public:
  // `flat`: every rank (borrowed). `local`: this host's ranks. `cross`: the
  // ranks with this rank's local rank, one per host. Uncompressed
  // allreduces below `min_bytes` stay flat (a negative value: all of them).
  // `trials` > 0: the others take the path measured faster after `trials`
  // timed allreduces on each (PathTrial); 0: they all take the hierarchy.
  HierarchicalTransport(Transport* flat, std::unique_ptr<Transport> local,
                        std::unique_ptr<Transport> cross, int64_t min_bytes,
                        int64_t trials = 0);

  // The path uncompressed allreduces take once measured; false while the
  // trials run, or when nothing is measured.
  bool MeasuredPath(PathTrial::Path* path) const;

  int rank() const override { return flat_->rank(); }
  int size() const override { return flat_->size(); }

  Status BitwiseAndAllreduce(std::vector<uint64_t>* words) override {
    return flat_->BitwiseAndAllreduce(words);
  }
  Status GatherToRoot(const std::string& local, std::vector<std::string>* gathered) override {
    return flat_->GatherToRoot(local, gathered);
  }
  Status BroadcastFromRoot(std::string* bytes) override { return flat_->BroadcastFromRoot(bytes); }
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status AllreduceWire(const void* input, void* output, int64_t count, DataType dtype,
                       ReduceOp op, WireCompression compression) override;
  Status AllgatherInt64s(const std::vector<int64_t>& local, std::vector<int64_t>* all) override {
    return flat_->AllgatherInt64s(local, all);
  }
  Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                    const std::vector<int64_t>& bytes_per_rank) override {
    return flat_->Allgatherv(input, input_bytes, output, bytes_per_rank);
  }
  Status Broadcast(void* buffer, int64_t bytes, int root_rank) override {
    return flat_->Broadcast(buffer, bytes, root_rank);
  }
  Status Alltoallv(const void* input, const std::vector<int64_t>& send_bytes, void* output,
                   const std::vector<int64_t>& recv_bytes) override {
    return flat_->Alltoallv(input, send_bytes, output, recv_bytes);
  }
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op) override {
    return flat_->ReduceScatter(input, output, counts, dtype, op);
  }

 private:
  // The three steps of an uncompressed allreduce.
  Status HierarchicalAllreduce(const void* input, void* output, int64_t count, DataType dtype,
                               ReduceOp op);
  // The elements of each local rank's slice: whole cache lines, in rank
  // order, the same on every host.
  static std::vector<int64_t> SliceCounts(int64_t count, int64_t element_bytes, int local_size);
  // Steps (1) and (3) around `cross_step`, which reduces this rank's slice
  // (`elements` at `slice`, in `output`) across hosts in place.
  Status ThreeSteps(const void* input, void* output, int64_t count, DataType dtype, ReduceOp op,
                    const std::function<Status(void* slice, int64_t elements)>& cross_step);
  // The ranks add their PathTrial measurements and take the faster path.
  Status AgreeOnPath();

  Transport* const flat_;
  const std::unique_ptr<Transport> local_;
  const std::unique_ptr<Transport> cross_;
  const int64_t min_bytes_;
  CrossHostSum cross_sum_;
  std::unique_ptr<PathTrial> trial_;  // null: no measurement
};

}  // namespace tfring

#endif  // TFRING_CC_TRANSPORT_HIERARCHICAL_TRANSPORT_H_
