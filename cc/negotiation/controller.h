// Controller: one negotiation round per background-loop cycle, run on every
// rank, deciding which tensors are ready everywhere.
//
// A round:
//   1. Every pending local request is looked up in the response cache.
//   2. One bitwise AND over a bit vector tells every rank, at once: which
//      cached tensors all ranks have submitted (hit bits), which cache
//      entries some rank contradicts (invalid bits, stored inverted so AND
//      acts as OR), whether any rank needs full negotiation, which ranks
//      asked to shut down, and whether every rank has staged a process-set
//      change. In steady state this is the only message.
//   3. Only if some rank needs it: requests travel to rank 0 (gather), the
//      coordinator answers with the ordered response list (broadcast).
// Cached responses come first (in slot order), then negotiated ones (in
// rank 0's order): the same list on every rank.
#ifndef TFRING_CC_NEGOTIATION_CONTROLLER_H_
#define TFRING_CC_NEGOTIATION_CONTROLLER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cc/common.h"
#include "cc/config.h"
#include "cc/negotiation/coordinator.h"
#include "cc/negotiation/response.h"
#include "cc/negotiation/response_cache.h"
#include "cc/status.h"
#include "cc/transport.h"

namespace tfring {

// What one rank brings to a round besides its new requests.
struct RoundInputs {
  // This rank wants the job to stop.
  bool request_shutdown = false;
  // This rank has a process-set change staged.
  bool process_set_change_staged = false;
  // Values rank 0 announces to every rank in this round (the tuned knobs,
  // the timeline's state); other ranks' values are ignored. Exactly the
  // controller's num_root_words entries.
  std::vector<uint64_t> root_words;
  // Every rank reports how long each agreed tensor waited on it, for rank
  // 0's timeline (one extra small collective in rounds that agree tensors).
  bool report_readiness = false;
};

struct RoundOutcome {
  // To execute now, in this order, on every rank.
  ResponseList responses;
  // Rank 0's root words (RoundInputs::root_words).
  std::vector<uint64_t> root_words;
  // When the responses were agreed, on this rank's clock: the end of the
  // round, which every rank leaves at (nearly) the same moment.
  std::chrono::steady_clock::time_point agreed;
  // With report_readiness: microseconds response i waited on the
  // transport's rank r before `agreed`, at [i * size + r]; -1 where r never
  // submitted it (it had joined). Empty otherwise.
  std::vector<int64_t> waited_us;
  // The job stops after executing `responses`; pending work fails with the
  // reason.
  bool shutdown = false;
  std::string shutdown_reason;
  // Every rank has staged its process-set change: apply it now.
  bool process_set_change_agreed = false;
};

class Controller {
 public:
  using Clock = std::chrono::steady_clock;

  // `world_ranks[r]`: the job rank of the transport's rank r (messages name
  // job ranks; the transport may span a process set). `num_root_words`:
  // the size of RoundInputs::root_words in every round.
  Controller(Transport* transport, const Config& config, std::vector<int> world_ranks,
             int num_root_words = 0);

  // Runs one round. `new_requests`: tensors enqueued locally since the last
  // round.
  Status RunRound(std::vector<SubmittedRequest> new_requests, const RoundInputs& inputs,
                  RoundOutcome* outcome);

  // Local requests not yet answered.
  size_t num_pending() const { return pending_.size(); }
  // Their names (to fail them when their process set is removed).
  std::vector<std::string> PendingNames() const;
  // Rounds that needed the gather/broadcast path (for tests and tuning).
  int64_t negotiation_rounds() const { return negotiation_rounds_; }

 private:
  struct Pending {
    Request request;
    Clock::time_point since;
    bool sent_to_coordinator = false;
    int64_t cache_slot = -1;  // this round's cache hit, or -1
  };
  // Word layout of the round's bit vector.
  struct BitLayout {
    int64_t flags = 0;            // one word, inverted
    int64_t hits = 1;             // cache words, AND
    int64_t invalid = 0;          // cache words, inverted
    int64_t shutdown_ranks = 0;   // rank words, inverted
    int64_t agreed = 0;           // one word, AND: flags every rank must raise
    int64_t root = 0;             // root words: rank 0's values, all ones elsewhere
    int64_t total = 0;
  };

  std::vector<uint64_t> BuildBits(const RoundInputs& inputs, Clock::time_point now);
  void TakeCachedResponses(const std::vector<uint64_t>& bits, RoundOutcome* outcome);
  Status Negotiate(Clock::time_point now, RoundOutcome* outcome);
  // Fills outcome->waited_us (collective over the transport).
  Status ReportReadiness(RoundOutcome* outcome);
  // Removes the pending request for `name`; returns when it was submitted
  // here (a default time point when this rank never submitted it: allowed
  // after this rank joined, or for a refusal `is_error`).
  Clock::time_point RemovePending(const std::string& name, bool is_error = false);

  Transport* transport_;
  const Config& config_;
  const std::vector<int> world_ranks_;
  ResponseCache cache_;
  BitLayout layout_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::vector<Pending> pending_;              // in local submission order
  // This round's responses' submission times here, parallel to
  // outcome->responses.
  std::vector<Clock::time_point> submitted_;
  int64_t negotiation_rounds_ = 0;
};

}  // namespace tfring

#endif  // TFRING_CC_NEGOTIATION_CONTROLLER_H_
