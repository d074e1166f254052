// Stall reports: what rank 0 tells the job when ranks wait on collectives
// that other ranks never submit.
//
// Why a file of its own: a stall is almost always a bug in the training
// script (uneven data, a collective under a rank-dependent condition,
// different models on different ranks), and the user fixes it from this
// text alone. Both the periodic warning and the error that finally fails
// every rank's pending collectives show, rank under rank, the names each
// rank is waiting on, so the odd one out is visible at a glance; the error
// also names the likely causes and their fixes. Pure functions of the
// coordinator's table, so the wording is tested without a job.
#ifndef TFRING_CC_NEGOTIATION_STALL_REPORT_H_
#define TFRING_CC_NEGOTIATION_STALL_REPORT_H_

#include <string>
#include <vector>

namespace tfring {

// One rank's side of a stall: the names it submitted that still wait for
// other ranks.
struct RankWaits {
  int rank = 0;
  std::vector<std::string> names;
};

// "  rank 0 waits on: 'a', 'b'\n  rank 1 waits on: nothing ..." with at
// most `names_per_rank` names per rank.
std::string DescribeWaitsByRank(const std::vector<RankWaits>& waits, size_t names_per_rank);

// The periodic warning (TFRING_STALL_CHECK_TIME_SECONDS).
std::string StallWarning(const std::vector<RankWaits>& waits, double warn_after_s);

// The error every rank's pending collectives fail with once a tensor waited
// longer than TFRING_STALL_SHUTDOWN_TIME_SECONDS.
std::string StallError(const std::string& oldest_name, double waited_s, double limit_s,
                       const std::vector<RankWaits>& waits);

}  // namespace tfring

#endif  // TFRING_CC_NEGOTIATION_STALL_REPORT_H_
