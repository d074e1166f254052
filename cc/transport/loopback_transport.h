// LoopbackTransport: ranks as threads of one process, for testing the
// negotiation and execution logic without MPI.
//
// Every collective is built on one primitive, Exchange (an allgather of byte
// strings through shared memory guarded by a generation barrier). It is slow
// and simple on purpose: tests need it obviously correct, not fast.
#ifndef TFRING_CC_TRANSPORT_LOOPBACK_TRANSPORT_H_
#define TFRING_CC_TRANSPORT_LOOPBACK_TRANSPORT_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cc/transport.h"

namespace tfring {

// State shared by the threads of one simulated world.
class LoopbackWorld {
 public:
  explicit LoopbackWorld(int size);
  int size() const { return size_; }
  // Each rank passes its bytes; returns every rank's bytes in rank order.
  std::vector<std::string> Exchange(int rank, std::string bytes);

 private:
  const int size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> slots_;
  std::vector<std::string> published_;
  int arrived_ = 0;
  int departed_ = 0;
  uint64_t generation_ = 0;
};

class LoopbackTransport : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackWorld> world, int rank);

  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }

  Status BitwiseAndAllreduce(std::vector<uint64_t>* words) override;
  Status GatherToRoot(const std::string& local, std::vector<std::string>* gathered) override;
  Status BroadcastFromRoot(std::string* bytes) override;
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status AllgatherInt64s(const std::vector<int64_t>& local, std::vector<int64_t>* all) override;
  Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                    const std::vector<int64_t>& bytes_per_rank) override;
  Status Broadcast(void* buffer, int64_t bytes, int root_rank) override;
  Status Alltoallv(const void* input, const std::vector<int64_t>& send_bytes, void* output,
                   const std::vector<int64_t>& recv_bytes) override;
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op) override;
  // Writes this rank's slice and fills the rest of `output` with 0xA5
  // bytes (the contract leaves it unspecified), so a caller that reads
  // another rank's slice there fails its test.
  Status ReduceScatterAtOffsets(const void* input, void* output,
                                const std::vector<int64_t>& counts, DataType dtype,
                                ReduceOp op) override;

 private:
  std::shared_ptr<LoopbackWorld> world_;
  const int rank_;
};

}  // namespace tfring

#endif  // TFRING_CC_TRANSPORT_LOOPBACK_TRANSPORT_H_
