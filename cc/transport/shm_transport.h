// ShmTransport: the Transport for ranks that all share one host.
//
// Why a wrapper: on one host MPI adds copies and tens of microseconds per
// call that shared memory does not need (shm_collectives.h). This transport
// runs the negotiation messages, allreduce, allgather, broadcast and the
// hierarchical allreduce's reduce-scatter (ReduceScatterAtOffsets) through
// one shared segment and hands everything else (alltoall, the reducescatter
// collective, messages too big for the exchange areas) to the MPI transport
// it wraps, which also stays the way between hosts. Every choice between the
// two depends only on values all ranks share, so the ranks always make
// matching calls.
//
// Set-up (Connect, collective over the wrapped transport's ranks): the ranks
// compare their host identity (host name and /dev/shm's device); rank 0
// creates a segment under a fresh random name and broadcasts the name; the
// others map it; once every rank has, rank 0 unlinks it, so the memory lives
// exactly as long as the job's mappings and a crash leaves nothing in
// /dev/shm. If the ranks span hosts, TFRING_SHM=0, or any step fails (a
// too-small /dev/shm, say), every rank keeps the wrapped transport, and a
// failure is logged with its fix.
//
// Round calls: a rank waiting in a negotiation step for peers calls them
// through the segment (shm_barrier.h); a watcher thread per rank passes the
// call on (WatchRoundCalls), so idle ranks need no rounds of their own.
#ifndef TFRING_CC_TRANSPORT_SHM_TRANSPORT_H_
#define TFRING_CC_TRANSPORT_SHM_TRANSPORT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cc/config.h"
#include "cc/shm/shm_collectives.h"
#include "cc/shm/shm_segment.h"
#include "cc/transport.h"

namespace tfring {

class ShmTransport : public Transport {
 public:
  // Collective over `inner`'s ranks. On success *transport is either a
  // ShmTransport over `inner` (which it borrows, or owns when `owned` is
  // given) or, when shared memory is off or unavailable, the wrapped
  // transport itself: `owned` handed back, or null to mean "use `inner`".
  // `job_ranks[r]` is the job rank of inner's rank r. Fails only when the
  // wrapped transport fails.
  static Status Connect(Transport* inner, std::unique_ptr<Transport> owned,
                        const Config& config, const std::vector<int>& job_ranks,
                        std::unique_ptr<Transport>* transport);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  Status BitwiseAndAllreduce(std::vector<uint64_t>* words) override;
  Status GatherToRoot(const std::string& local, std::vector<std::string>* gathered) override;
  Status BroadcastFromRoot(std::string* bytes) override;
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  bool ReducesSpans() const override { return true; }
  Status AllreduceSpans(const std::vector<ReduceSpan>& spans, DataType dtype,
                        ReduceOp op) override;
  Status AllgatherInt64s(const std::vector<int64_t>& local, std::vector<int64_t>* all) override;
  Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                    const std::vector<int64_t>& bytes_per_rank) override;
  Status Broadcast(void* buffer, int64_t bytes, int root_rank) override;
  Status Alltoallv(const void* input, const std::vector<int64_t>& send_bytes, void* output,
                   const std::vector<int64_t>& recv_bytes) override;
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op) override;
  Status ReduceScatterAtOffsets(const void* input, void* output,
                                const std::vector<int64_t>& counts, DataType dtype,
                                ReduceOp op) override;
  bool WatchRoundCalls(std::function<void()> on_call) override;
  void StopWatchingRoundCalls() override;
  ~ShmTransport() override { StopWatchingRoundCalls(); }

 private:
  // Every rank publishes `bytes` bytes (at most the exchange capacity, the
  // same on every rank); (*messages)[r] is rank r's. Aborted if a rank's
  // length differs: the ranks' calls no longer match.
  Status ExchangeWords(const void* data, size_t bytes, std::vector<const char*>* messages);

  ShmTransport(Transport* inner, std::unique_ptr<Transport> owned,
               std::unique_ptr<ShmSegment> segment, std::unique_ptr<ShmCollectives> shm)
      : inner_(inner), owned_(std::move(owned)), segment_(std::move(segment)),
        shm_(std::move(shm)) {}

  Transport* inner_;
  std::unique_ptr<Transport> owned_;
  std::unique_ptr<ShmSegment> segment_;  // mapped for as long as shm_ uses it
  std::unique_ptr<ShmCollectives> shm_;
  // Sleeps on the segment's round calls and passes each one on.
  std::thread watcher_;
  std::atomic<bool> stop_watching_{false};
};

}  // namespace tfring

#endif  // TFRING_CC_TRANSPORT_SHM_TRANSPORT_H_
