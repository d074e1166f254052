// MpiTransport: the Transport over an MPI communicator.
//
// Negotiation messages use non-blocking MPI calls completed by polling, with
// naps that grow with the wait: a blocking MPI collective busy-waits, and an
// idle background thread doing that every millisecond would take a core from
// TensorFlow (and slow the user's own mpi4py calls). Data collectives use blocking MPI calls,
// which pick MPI's tuned algorithms for large buffers.
//
// tfring always works on its own duplicate of the user's communicator, so its
// messages never match the user's, and with MPI_ERRORS_RETURN so a failure
// becomes a Status instead of an abort inside MPI.
#ifndef TFRING_CC_TRANSPORT_MPI_TRANSPORT_H_
#define TFRING_CC_TRANSPORT_MPI_TRANSPORT_H_

#include <mpi.h>

#include <memory>
#include <vector>

#include "cc/api.h"
#include "cc/transport.h"
#include "cc/transport/cross_host_sum.h"

namespace tfring {

class MpiTransport : public Transport {
 public:
  // Duplicates `comm`. MPI must be initialised. Failures name ranks as
  // ranks of `job` (by default `comm` itself).
  static Status Create(MPI_Comm comm, std::unique_ptr<MpiTransport>* transport,
                       MPI_Comm job = MPI_COMM_NULL);
  // Collective over every rank of `comm`: a transport over the ranks of
  // `comm` listed in `ranks` (sorted). Ranks not listed get null.
  static Status CreateSubset(MPI_Comm comm, const std::vector<int>& ranks,
                             std::unique_ptr<MpiTransport>* transport);
  // Collective over every rank of `comm`: a transport over the ranks of
  // this host (MPI_COMM_TYPE_SHARED) and one over the ranks that have this
  // rank's local rank, one per host.
  static Status CreateHostSplit(MPI_Comm comm, std::unique_ptr<MpiTransport>* local,
                                std::unique_ptr<MpiTransport>* cross);
  MPI_Comm comm() const { return comm_; }
  ~MpiTransport() override;

  int rank() const override { return topology_.rank; }
  int size() const override { return topology_.size; }
  const Topology& topology() const { return topology_; }

  Status BitwiseAndAllreduce(std::vector<uint64_t>* words) override;
  Status GatherToRoot(const std::string& local, std::vector<std::string>* gathered) override;
  Status BroadcastFromRoot(std::string* bytes) override;
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  // Across hosts, a CrossHostSum over every rank (each rank's data crosses
  // encoded, the ranks of a host included); on one host, exact.
  Status AllreduceWire(const void* input, void* output, int64_t count, DataType dtype,
                       ReduceOp op, WireCompression compression) override;
  Status AllgatherInt64s(const std::vector<int64_t>& local, std::vector<int64_t>* all) override;
  Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                    const std::vector<int64_t>& bytes_per_rank) override;
  Status Broadcast(void* buffer, int64_t bytes, int root_rank) override;
  Status Alltoallv(const void* input, const std::vector<int64_t>& send_bytes, void* output,
                   const std::vector<int64_t>& recv_bytes) override;
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op) override;

 private:
  MpiTransport() = default;
  // Completes a non-blocking request: polls, then naps between polls.
  Status Wait(MPI_Request* request, const char* what);
  // The Status for MPI error `code` from `what`, naming the failed ranks
  // where MPI knows them (see mpi_failures.h).
  Status Failure(int code, const char* what) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Group job_group_ = MPI_GROUP_NULL;
  Topology topology_;
  CrossHostSum cross_sum_;
};

}  // namespace tfring

#endif  // TFRING_CC_TRANSPORT_MPI_TRANSPORT_H_
