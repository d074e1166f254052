// CollectiveExecutor: moves the data for one round's responses and completes
// the framework's callbacks.
//
// It owns the persistent fusion buffer, reserved once at start-up. For a
// fused batch it copies inputs in (applying prescale), reduces the buffer in
// place once, and copies results out (applying postscale and the division of
// Average). Direct allreduces, the allgathers and the broadcasts use the
// framework's buffers as they are.
//
// Failures come in two kinds, told apart by their status code:
//  - a transport failure (kAborted): the ranks can no longer be assumed to
//    make matching calls, so the batch at hand and every later one fail and
//    the caller stops the job;
//  - a per-tensor failure (any other code): an output this rank could not
//    allocate, a size limit of the transport, an exception from a callback.
//    Only that batch's tensors fail, on every rank where it applies, and the
//    job goes on. A failure that only one rank sees before data moves (an
//    allocation) is agreed on first, so no rank enters a collective that
//    another rank skips.
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

  // Collective, once before the first Execute: reserves the fusion buffer
  // (address space only; pages are touched when a batch first needs them).
  // Fails on every rank when any rank could not reserve it.
  Status Prepare();

  // Executes `responses` in order, taking each entry from `queue` and
  // calling its callback exactly once. Returns a transport failure (the job
  // must stop); per-tensor failures only fail their tensors.
  Status Execute(const ResponseList& responses, TensorQueue* queue);

 private:
  Status RunBatch(const Batch& batch, std::vector<TensorEntry>& entries);
  // RunBatch, with any exception turned into a per-tensor Internal error.
  Status RunBatchCatching(const Batch& batch, std::vector<TensorEntry>& entries);
  Status RunFusedAllreduce(const std::vector<TensorEntry*>& members);
  Status RunDirectAllreduce(TensorEntry& entry);
  Status RunAllgather(TensorEntry& entry);
  Status RunBroadcast(TensorEntry& entry);
  // Collective: every rank learns whether `local` failed on any rank. On
  // return *agreed is OK on every rank, or on every rank an error naming the
  // ranks that failed (with this rank's own reason where it failed). The
  // returned status is the transport's.
  Status AgreeOnLocalFailure(const std::string& what, const Status& local, Status* agreed);
  // Writes the reduced `src` to `dst`: postscale, then division by the size
  // for Average.
  void FinishReduction(const Request& request, const void* src, void* dst) const;

  Transport* transport_;
  const Config& config_;
  std::unique_ptr<uint8_t[]> fusion_buffer_;
};

}  // namespace tfring

#endif  // TFRING_CC_COLLECTIVE_EXECUTOR_H_
