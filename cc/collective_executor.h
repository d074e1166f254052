// CollectiveExecutor: moves the data for one round's responses and completes
// the framework's callbacks.
//
// It owns the persistent fusion buffer. For a fused batch it copies inputs in
// (applying prescale), reduces the buffer in place once, and copies results
// out (applying postscale and 1/size for Average). Direct allreduces, the
// allgathers and the broadcasts use the framework's buffers as they are.
#ifndef TFRING_CC_COLLECTIVE_EXECUTOR_H_
#define TFRING_CC_COLLECTIVE_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "cc/config.h"
#include "cc/fusion_planner.h"
#include "cc/response.h"
#include "cc/status.h"
#include "cc/tensor_queue.h"
#include "cc/transport.h"

namespace tfring {

class CollectiveExecutor {
 public:
  CollectiveExecutor(Transport* transport, const Config& config);

  // Executes `responses` in order, taking each entry from `queue` and
  // calling its callback. A transport failure fails the batch at hand and is
  // returned; the caller aborts the job.
  Status Execute(const ResponseList& responses, TensorQueue* queue);

 private:
  Status RunBatch(const Batch& batch, const ResponseList& responses,
                  std::vector<TensorEntry>& entries);
  Status RunFusedAllreduce(const std::vector<TensorEntry*>& members);
  Status RunDirectAllreduce(TensorEntry& entry);
  Status RunAllgather(TensorEntry& entry);
  Status RunBroadcast(TensorEntry& entry);
  // Scale factor applied after the reduction (includes 1/size for Average).
  double PostscaleOf(const Request& request) const;
  uint8_t* FusionBuffer(int64_t bytes);

  Transport* transport_;
  const Config& config_;
  std::unique_ptr<uint8_t[]> fusion_buffer_;
  int64_t fusion_buffer_bytes_ = 0;
};

}  // namespace tfring

#endif  // TFRING_CC_COLLECTIVE_EXECUTOR_H_
