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
#ifndef TFRING_CC_CONTROLLER_H_
#define TFRING_CC_CONTROLLER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cc/common.h"
#include "cc/config.h"
#include "cc/coordinator.h"
#include "cc/response.h"
#include "cc/response_cache.h"
#include "cc/status.h"
#include "cc/transport.h"

namespace tfring {

struct RoundOutcome {
  // To execute now, in this order, on every rank.
  ResponseList responses;
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
  // job ranks; the transport may span a process set).
  Controller(Transport* transport, const Config& config, std::vector<int> world_ranks);

  // Runs one round. `new_requests`: tensors enqueued locally since the last
  // round. `request_shutdown`: this rank wants the job to stop.
  // `process_set_change_staged`: this rank has a process-set change staged.
  Status RunRound(std::vector<Request> new_requests, bool request_shutdown,
                  bool process_set_change_staged, RoundOutcome* outcome);

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
    int64_t total = 0;
  };

  std::vector<uint64_t> BuildBits(bool request_shutdown, bool change_staged,
                                  Clock::time_point now);
  void TakeCachedResponses(const std::vector<uint64_t>& bits, RoundOutcome* outcome);
  Status Negotiate(Clock::time_point now, RoundOutcome* outcome);
  void RemovePending(const std::string& name);

  Transport* transport_;
  const Config& config_;
  const std::vector<int> world_ranks_;
  ResponseCache cache_;
  BitLayout layout_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::vector<Pending> pending_;              // in local submission order
  int64_t negotiation_rounds_ = 0;
};

}  // namespace tfring

#endif  // TFRING_CC_CONTROLLER_H_
