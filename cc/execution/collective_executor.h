// CollectiveExecutor: moves the data for one round's responses and completes
// the framework's callbacks.
//
// A round runs in three steps, each the same on every rank:
//  1. Outputs. The first dimensions of allgathers and the splits of
//     alltoalls are exchanged in one small collective for the whole round
//     (row_layout.h); every output that depends on them, or on this rank's
//     position (reducescatter), is allocated; the ranks agree on which
//     allocations failed, so they all skip the same tensors.
//  2. Plan: the fusion planner groups what remains into batches.
//  3. Run: a fused batch is packed into the persistent fusion buffer
//     (applying prescale), moved by one collective, and unpacked (applying
//     postscale and the division of Average); a batch of one tensor uses
//     the framework's buffers as they are. Where the transport reduces
//     spans (shared memory), a round's allreduces of one dtype and op are
//     one batch reduced from the framework's buffers, scaled on the way.
//
// Failures come in two kinds, told apart by their status code:
//  - a transport failure (kAborted): the ranks can no longer be assumed to
//    make matching calls, so the batch at hand and every later one fail and
//    the caller stops the job;
//  - a per-tensor failure (any other code): invalid alltoall splits, an
//    output this rank could not allocate, a size limit of the transport, an
//    exception from a callback. Only those tensors fail, on every rank where
//    it applies, and the job goes on. A failure that only one rank sees
//    before data moves (an allocation) is agreed on first, so no rank enters
//    a collective that another rank skips.
#ifndef TFRING_CC_EXECUTION_COLLECTIVE_EXECUTOR_H_
#define TFRING_CC_EXECUTION_COLLECTIVE_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "cc/config.h"
#include "cc/execution/fusion_planner.h"
#include "cc/negotiation/response.h"
#include "cc/execution/row_layout.h"
#include "cc/status.h"
#include "cc/negotiation/tensor_queue.h"
#include "cc/timeline/timeline.h"
#include "cc/transport.h"

namespace tfring {

// Rank 0, while the timeline records: where Execute sends one record per
// tensor, and what the round already knows about each response.
struct RoundTrace {
  Timeline* timeline = nullptr;
  int64_t cycle = 0;
  TimelineClock::time_point agreed;
  // Per response: when each rank submitted it (rank 0's own mark at least).
  std::vector<std::vector<ReadyMark>> ready;
  // Batch ids, unique in the file across rounds and process sets.
  int64_t* next_batch = nullptr;
};

class CollectiveExecutor {
 public:
  // `world_ranks[r]`: the job rank of the transport's rank r (the transport
  // may span a process set): broadcast roots arrive as job ranks, and
  // messages name job ranks.
  CollectiveExecutor(Transport* transport, const Config& config, std::vector<int> world_ranks);

  // Collective, once before the first Execute: reserves the fusion buffer
  // (address space only; pages are touched when a batch first needs them).
  // Fails on every rank when any rank could not reserve it.
  Status Prepare();
  // Instead of Prepare: use `other`'s fusion buffer. The background thread
  // runs one executor at a time, so the executors of all process sets share
  // the global set's buffer.
  void ShareFusionBuffer(const CollectiveExecutor& other) {
    fusion_buffer_ = other.fusion_buffer_;
  }

  // Executes `responses` in order, taking each entry from `queue` and
  // calling its callback exactly once. Returns a transport failure (the job
  // must stop); per-tensor failures only fail their tensors. `trace`: null
  // unless rank 0's timeline records this round.
  Status Execute(const ResponseList& responses, TensorQueue* queue,
                 const RoundTrace* trace = nullptr);

  // The fusion and direct thresholds of the rounds to come (the autotuner's
  // choice; every rank sets the same values in the same round). The fusion
  // threshold never exceeds the configured one, which sized the buffer.
  void SetThresholds(int64_t fusion_threshold, int64_t direct_threshold);
  // Bytes of input moved by successful batches since construction.
  int64_t bytes_moved() const { return bytes_moved_; }

 private:
  // Step 1 for the tensors not yet failed (`outcome[i]` OK): fills
  // layouts_, allocates outputs, and sets `outcome[i]` for the tensors that
  // fail, identically on every rank. Returns the transport's status.
  Status PrepareOutputs(std::vector<TensorEntry>& entries, std::vector<Status>* outcome);
  Status RunBatch(const Batch& batch, std::vector<TensorEntry>& entries);
  // RunBatch, with any exception turned into a per-tensor Internal error.
  Status RunBatchCatching(const Batch& batch, std::vector<TensorEntry>& entries);
  Status RunFusedAllreduce(const std::vector<TensorEntry*>& members);
  Status RunDirectAllreduce(TensorEntry& entry);
  // The members reduced from their own buffers in one collective, scaled on
  // the way (transports that ReducesSpans()).
  Status RunSpansAllreduce(const std::vector<TensorEntry*>& members);
  Status RunFusedAllgather(const std::vector<size_t>& members, std::vector<TensorEntry>& entries);
  Status RunDirectAllgather(size_t index, TensorEntry& entry);
  Status RunFusedReducescatter(const std::vector<size_t>& members,
                               std::vector<TensorEntry>& entries);
  Status RunDirectReducescatter(size_t index, TensorEntry& entry);
  Status RunAlltoall(size_t index, TensorEntry& entry);
  Status RunBroadcast(TensorEntry& entry);
  // Collective: every rank learns which of `local` (one status per tensor,
  // the same tensors on every rank) failed on any rank. On return
  // (*agreed)[i] is OK on every rank, or on every rank an error naming the
  // ranks where tensor i failed (with this rank's own reason where it
  // failed). The returned status is the transport's.
  Status AgreeOnLocalFailures(const std::vector<std::string>& whats,
                              const std::vector<Status>& local, std::vector<Status>* agreed);
  // What `entry`'s reduced sum is divided by: the contributing ranks for
  // Average, else 1.
  static int64_t Divisor(const TensorEntry& entry);
  // Writes `count` reduced elements of `entry` from `src` to `dst`:
  // postscale, then division by the contributing ranks for Average.
  void FinishReduction(const TensorEntry& entry, const void* src, void* dst, int64_t count) const;
  // The entry a joined rank runs for another rank's allreduce: zeros in,
  // output discarded (storage in stand_in_buffers_).
  TensorEntry JoinedStandIn(const Response& response);

  // Job ranks of the transport's ranks in `ranks`, for messages.
  std::vector<int> WorldRanks(const std::vector<int>& ranks) const;
  // Ends a phase of the batch being traced (no-op when not tracing).
  void MarkPhase(OpPhase phase) {
    if (phases_ != nullptr) phases_->Mark(phase);
  }
  // Sends the timeline one record per member of a finished batch (or one
  // failed tensor, with no batch phases).
  void TraceBatch(const RoundTrace& trace, const std::vector<size_t>& members,
                  const std::vector<TensorEntry>& entries,
                  const std::vector<size_t>& response_of_entry, bool fused, int64_t batch_bytes,
                  const BatchPhases& phases, const Status& status) const;

  Transport* transport_;
  const Config& config_;
  const std::vector<int> world_ranks_;
  int64_t fusion_threshold_;
  int64_t direct_threshold_;
  int64_t bytes_moved_ = 0;
  BatchPhases* phases_ = nullptr;  // the batch being traced, or null
  std::shared_ptr<uint8_t[]> fusion_buffer_;
  // This round's layouts, by entry index (allgather, alltoall, reducescatter).
  std::vector<RowLayout> layouts_;
  // This round's scratch inputs of direct reducescatters with a prescale
  // factor, by entry index (allocated in step 1 so a failure is agreed on).
  std::vector<std::unique_ptr<uint8_t[]>> scaled_inputs_;
  // This round's buffers of JoinedStandIn entries.
  std::vector<std::vector<uint8_t>> stand_in_buffers_;
};

}  // namespace tfring

#endif  // TFRING_CC_EXECUTION_COLLECTIVE_EXECUTOR_H_
