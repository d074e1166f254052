#include "cc/negotiation/stall_report.h"

#include <sstream>

namespace tfring {
namespace {

constexpr size_t kNamesPerRankInWarning = 5;
constexpr size_t kNamesPerRankInError = 8;

}  // namespace

std::string DescribeWaitsByRank(const std::vector<RankWaits>& waits, size_t names_per_rank) {
  size_t widest_rank = 1;
  for (const RankWaits& w : waits) {
    widest_rank = std::max(widest_rank, std::to_string(w.rank).size());
  }
  std::ostringstream text;
  for (const RankWaits& w : waits) {
    const std::string rank = std::to_string(w.rank);
    text << "  rank " << std::string(widest_rank - rank.size(), ' ') << rank << " waits on: ";
    if (w.names.empty()) {
      text << "nothing (it has not reached any of these collectives)";
    }
    for (size_t i = 0; i < w.names.size() && i < names_per_rank; ++i) {
      text << (i > 0 ? ", " : "") << "'" << w.names[i] << "'";
    }
    if (w.names.size() > names_per_rank) {
      text << " and " << w.names.size() - names_per_rank << " more";
    }
    text << "\n";
  }
  return text.str();
}

std::string StallWarning(const std::vector<RankWaits>& waits, double warn_after_s) {
  std::ostringstream text;
  text << "Some ranks have waited more than " << warn_after_s
       << " s for collectives that other ranks have not submitted. This usually means the ranks "
          "run different code paths, or one rank is much slower or stuck. What each rank is "
          "waiting on:\n"
       << DescribeWaitsByRank(waits, kNamesPerRankInWarning);
  return text.str();
}

std::string StallError(const std::string& oldest_name, double waited_s, double limit_s,
                       const std::vector<RankWaits>& waits) {
  std::ostringstream text;
  text << "the job stalled: collective '" << oldest_name << "' waited "
       << static_cast<long long>(waited_s)
       << " s for ranks that never submitted it (limit: TFRING_STALL_SHUTDOWN_TIME_SECONDS="
       << limit_s << "). What each rank is waiting on:\n"
       << DescribeWaitsByRank(waits, kNamesPerRankInError)
       << "Likely causes: (1) the ranks have different numbers of batches (a dataset.shard() "
          "or DistributedSampler whose data does not divide evenly among the ranks): have each "
          "rank call join() (hvd.join(), in TensorFlow or PyTorch) when it runs out of data, "
          "or give every rank the same number of steps (with Keras, model.fit with "
          "tfring.keras.DistributedOptimizer joins by itself); (2) a collective runs under a "
          "rank-dependent condition (e.g. an allreduce or broadcast inside `if hvd.rank() == "
          "0:`): run every collective on every rank; (3) the ranks build different models "
          "(other layers or parameter names), so their gradients differ: build the same model "
          "everywhere. "
          "Every rank's pending collectives fail with this error. To wait longer, raise "
          "TFRING_STALL_SHUTDOWN_TIME_SECONDS (0 waits forever).";
  return text.str();
}

}  // namespace tfring
