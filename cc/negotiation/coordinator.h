// Coordinator: rank 0's table of requests submitted so far, by name.
//
// Why rank 0 decides: when every rank has submitted a name, the coordinator
// validates the requests (response_builder) and appends the response to one
// ordered list that rank 0 broadcasts; all ranks then execute the same
// collectives in the same order even though their frameworks submitted them
// in different orders. The table also tells who is late: the stall report.
//
// Join: a rank that has joined counts as present for every tensor (the
// response then says how many ranks contributed); the join itself completes
// when every rank has joined.
#ifndef TFRING_CC_NEGOTIATION_COORDINATOR_H_
#define TFRING_CC_NEGOTIATION_COORDINATOR_H_

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "cc/common.h"
#include "cc/config.h"
#include "cc/negotiation/response.h"
#include "cc/negotiation/stall_report.h"

namespace tfring {

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;

  // `world_ranks[i]`: the job rank of the i-th rank taking part (the ranks
  // of a process set); requests carry job ranks.
  Coordinator(std::vector<int> world_ranks, const Config& config);

  // Records requests gathered this round (each carries its rank).
  void Add(const std::vector<Request>& requests, Clock::time_point now);
  // Responses for names now submitted by every rank, in completion order.
  ResponseList TakeReady();
  // Logs a warning (cc/stall_report.h) for tensors waiting longer than the
  // stall check time. Returns a non-empty shutdown reason, the error every
  // rank's pending collectives fail with, when a tensor waited longer than
  // the stall shutdown time.
  std::string InspectStalls(Clock::time_point now);

 private:
  struct Entry {
    std::vector<Request> by_rank;
    std::vector<bool> submitted;
    int count = 0;
    Clock::time_point first_seen;
    Clock::time_point last_warned;
  };

  // Moves `it` to the ready list when every rank has submitted it or
  // joined; returns the entry after it.
  std::map<std::string, Entry>::iterator ReleaseIfReady(std::map<std::string, Entry>::iterator it);
  int FirstSubmitted(const Entry& entry) const;
  // For each rank, the names in the table it has submitted (and waits on).
  std::vector<RankWaits> WaitsByRank() const;

  const std::vector<int> world_ranks_;
  const int world_size_;  // ranks taking part
  const Config& config_;
  std::map<std::string, Entry> table_;
  ResponseList ready_;
  // Ranks (by position) whose join is pending, and the job rank that joined
  // last.
  std::vector<bool> joined_;
  int last_joined_rank_ = -1;
};

}  // namespace tfring

#endif  // TFRING_CC_NEGOTIATION_COORDINATOR_H_
