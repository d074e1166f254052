#include "cc/negotiation/coordinator.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "cc/logging.h"
#include "cc/negotiation/response_builder.h"
#include "cc/negotiation/stall_report.h"

namespace tfring {
namespace {

double SecondsBetween(Coordinator::Clock::time_point from, Coordinator::Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

Coordinator::Coordinator(std::vector<int> world_ranks, const Config& config)
    : world_ranks_(std::move(world_ranks)),
      world_size_(static_cast<int>(world_ranks_.size())),
      config_(config),
      joined_(world_size_, false) {}

void Coordinator::Add(const std::vector<Request>& requests, Clock::time_point now) {
  for (const Request& request : requests) {
    // Requests carry job ranks; the table is indexed by position in the set.
    const auto position = std::find(world_ranks_.begin(), world_ranks_.end(), request.rank);
    TFRING_CHECK(position != world_ranks_.end(), "request from unknown rank " << request.rank);
    const int index = static_cast<int>(position - world_ranks_.begin());
    auto inserted = table_.try_emplace(request.name);
    Entry& entry = inserted.first->second;
    if (inserted.second) {
      entry.by_rank.resize(world_size_);
      entry.submitted.assign(world_size_, false);
      entry.first_seen = now;
      entry.last_warned = now;
    }
    TFRING_CHECK(!entry.submitted[index],
                 "rank " << request.rank << " submitted '" << request.name << "' twice");
    entry.submitted[index] = true;
    entry.by_rank[index] = request;
    ++entry.count;
    if (request.type == CollectiveType::kJoin) {
      joined_[index] = true;
      last_joined_rank_ = request.rank;
      // A rank joining may complete tensors the others were waiting for.
      for (auto it = table_.begin(); it != table_.end();) {
        it = ReleaseIfReady(it);
      }
    } else {
      ReleaseIfReady(inserted.first);
    }
  }
}

std::map<std::string, Coordinator::Entry>::iterator Coordinator::ReleaseIfReady(
    std::map<std::string, Entry>::iterator it) {
  Entry& entry = it->second;
  const CollectiveType type = entry.by_rank[FirstSubmitted(entry)].type;
  const bool is_join = type == CollectiveType::kJoin;
  // While a rank has joined only allreduce can run: anything else is
  // refused as soon as a rank submits it, without waiting for the others
  // that have not joined (they may never submit it: their unnamed calls can
  // be numbered differently, or their code may branch on the refusal). Each
  // of them that submits it later is refused in turn; the refusal of a name
  // a rank does not hold is skipped there.
  bool refused_for_join = false;
  if (type != CollectiveType::kAllreduce && !is_join) {
    refused_for_join = std::find(joined_.begin(), joined_.end(), true) != joined_.end();
  }
  std::vector<Request> submitted;
  std::vector<int> joined;
  for (int index = 0; index < world_size_; ++index) {
    if (entry.submitted[index]) {
      submitted.push_back(entry.by_rank[index]);
    } else if (joined_[index] && !is_join) {
      joined.push_back(world_ranks_[index]);
    } else if (!refused_for_join) {
      return std::next(it);  // still waiting for this rank
    }
  }
  if (is_join) {
    // Every rank has joined: all learn the last one, and the job goes on.
    Response response = BuildResponse(submitted);
    response.request.root_rank = last_joined_rank_;
    ready_.push_back(std::move(response));
    joined_.assign(world_size_, false);
    last_joined_rank_ = -1;
  } else {
    ready_.push_back(BuildResponse(submitted, joined));
  }
  return table_.erase(it);
}

int Coordinator::FirstSubmitted(const Entry& entry) const {
  for (int index = 0; index < world_size_; ++index) {
    if (entry.submitted[index]) return index;
  }
  return 0;
}

ResponseList Coordinator::TakeReady() {
  ResponseList ready;
  ready.swap(ready_);
  return ready;
}

std::string Coordinator::InspectStalls(Clock::time_point now) {
  const double warn_after = config_.stall_check_time_s;
  const double shutdown_after = config_.stall_shutdown_time_s;
  if (warn_after <= 0 && shutdown_after <= 0) return "";

  const std::string* oldest_over_limit = nullptr;
  double oldest_waited = 0;
  bool any_to_warn = false;
  for (auto& [name, entry] : table_) {
    const double waited = SecondsBetween(entry.first_seen, now);
    if (shutdown_after > 0 && waited > shutdown_after && waited > oldest_waited) {
      oldest_over_limit = &name;
      oldest_waited = waited;
    }
    if (warn_after > 0 && SecondsBetween(entry.last_warned, now) >= warn_after) {
      entry.last_warned = now;
      any_to_warn = true;
    }
  }
  if (oldest_over_limit != nullptr) {
    return StallError(*oldest_over_limit, oldest_waited, shutdown_after, WaitsByRank());
  }
  if (any_to_warn) TFRING_LOG(kWarning, StallWarning(WaitsByRank(), warn_after));
  return "";
}

std::vector<RankWaits> Coordinator::WaitsByRank() const {
  std::vector<RankWaits> waits(world_size_);
  for (int index = 0; index < world_size_; ++index) waits[index].rank = world_ranks_[index];
  for (const auto& [name, entry] : table_) {
    for (int index = 0; index < world_size_; ++index) {
      if (entry.submitted[index]) waits[index].names.push_back(name);
    }
  }
  return waits;
}

}  // namespace tfring
