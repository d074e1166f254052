#include "cc/negotiation/process_set_checks.h"

#include <cstdint>
#include <map>

namespace tfring {
namespace {

// FNV-1a over the lists, with their lengths, so [[0, 1]] and [[0], [1]]
// differ.
int64_t Fingerprint(const std::vector<std::vector<int>>& sets) {
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&hash](uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xff;
      hash *= 1099511628211ull;
    }
  };
  mix(sets.size());
  for (const std::vector<int>& ranks : sets) {
    mix(ranks.size());
    for (int rank : ranks) mix(static_cast<uint64_t>(rank));
  }
  return static_cast<int64_t>(hash);
}

}  // namespace

std::string RankListToString(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

std::string SetsToString(const std::vector<std::vector<int>>& sets) {
  std::string text = "[";
  for (size_t i = 0; i < sets.size(); ++i) text += (i > 0 ? ", " : "") + RankListToString(sets[i]);
  return text + "]";
}

Status CheckProcessSetRanks(const std::vector<int>& ranks, int size, const std::string& what) {
  std::string problem;
  if (ranks.empty()) problem = "it is empty";
  for (size_t i = 0; i < ranks.size() && problem.empty(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size) {
      problem = "rank " + std::to_string(ranks[i]) + " is not a rank of this job (ranks 0.." +
                std::to_string(size - 1) + ")";
    } else if (i > 0 && ranks[i] <= ranks[i - 1]) {
      problem = "its ranks are not sorted and distinct";
    }
  }
  if (problem.empty()) return Status::OK();
  return Status::InvalidArgument(what + ": the process set " + RankListToString(ranks) +
                                 " is invalid: " + problem +
                                 ". A process set lists distinct ranks of the job, e.g. [0, 1].");
}

Status AgreeOnProcessSets(Transport* transport, const std::vector<std::vector<int>>& sets,
                          const std::string& what) {
  std::vector<int64_t> all;
  TFRING_RETURN_IF_ERROR(transport->AllgatherInt64s({Fingerprint(sets)}, &all));
  std::map<int64_t, std::vector<int>> ranks_by_value;
  for (int rank = 0; rank < static_cast<int>(all.size()); ++rank) {
    ranks_by_value[all[rank]].push_back(rank);
  }
  if (ranks_by_value.size() == 1) return Status::OK();
  std::string groups;
  for (const auto& [value, ranks] : ranks_by_value) {
    groups += (groups.empty() ? "" : "; ") + RanksToString(ranks);
  }
  return Status::InvalidArgument(
      what + ": the ranks passed different process sets (groups that agree: " + groups +
      "; this rank passed " + SetsToString(sets) +
      "). Every rank must make this call with the same process sets, in the same order.");
}

}  // namespace tfring
