#include "cc/background_loop.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "cc/logging.h"

namespace tfring {
namespace {

std::vector<int> AllRanks(int size) {
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  return ranks;
}

}  // namespace

BackgroundLoop::SetRuntime::SetRuntime(int32_t set_id, std::vector<int> set_ranks,
                                       std::unique_ptr<Transport> owned, Transport* set_transport,
                                       const Config& config)
    : id(set_id),
      ranks(std::move(set_ranks)),
      owned_transport(std::move(owned)),
      transport(set_transport),
      controller(set_transport, config, ranks),
      executor(set_transport, config, ranks) {}

BackgroundLoop::BackgroundLoop(Transport* transport, TensorQueue* queue, const Config& config,
                               ProcessSetRegistry* registry)
    : queue_(queue), config_(config), registry_(registry) {
  sets_.push_back(std::make_unique<SetRuntime>(0, AllRanks(transport->size()), nullptr,
                                               transport, config));
}

BackgroundLoop::~BackgroundLoop() {
  if (thread_.joinable()) {
    RequestShutdown();
    thread_.join();
  }
}

void BackgroundLoop::AddProcessSet(int32_t id, std::vector<int> ranks,
                                   std::unique_ptr<Transport> transport) {
  Transport* raw = transport.get();
  sets_.push_back(
      std::make_unique<SetRuntime>(id, std::move(ranks), std::move(transport), raw, config_));
  sets_.back()->executor.ShareFusionBuffer(sets_.front()->executor);
}

Status BackgroundLoop::Start() {
  TFRING_RETURN_IF_ERROR(sets_.front()->executor.Prepare());
  for (auto& set : sets_) set->executor.ShareFusionBuffer(sets_.front()->executor);
  running_ = true;
  thread_ = std::thread([this] { Run(); });
  return Status::OK();
}

void BackgroundLoop::RequestShutdown() {
  shutdown_requested_ = true;
  queue_->Wake();
}

Status BackgroundLoop::Join() {
  if (thread_.joinable()) thread_.join();
  return exit_status_;
}

std::map<int32_t, std::vector<Request>> BackgroundLoop::TakeNewRequestsBySet() {
  std::map<int32_t, std::vector<Request>> by_set;
  for (Request& request : queue_->TakeNewRequests()) {
    const int32_t id = request.process_set_id;
    const bool known = std::any_of(sets_.begin(), sets_.end(),
                                   [id](const auto& set) { return set->id == id; });
    if (known) {
      by_set[id].push_back(std::move(request));
      continue;
    }
    TensorEntry entry = queue_->Take(request.name);
    CompleteEntry(entry, Status::InvalidArgument(
                             std::string("tfring ") + CollectiveTypeName(request.type) +
                             " of tensor '" + request.name + "': process set " +
                             std::to_string(id) +
                             " was removed before the collective started."));
  }
  return by_set;
}

Status BackgroundLoop::RunSet(SetRuntime& set, std::vector<Request> requests,
                              bool request_shutdown, RoundOutcome* outcome) {
  const bool change_staged = set.id == 0 && registry_ != nullptr && registry_->HasStaged();
  Status status;
  try {
    status = set.controller.RunRound(std::move(requests), request_shutdown, change_staged,
                                     outcome);
  } catch (const std::exception& e) {
    status = Status::Internal(std::string("negotiation threw: ") + e.what());
  } catch (...) {
    status = Status::Internal("negotiation threw a non-standard exception");
  }
  if (!status.ok()) {
    return Status::Aborted("tfring stopped: communication with the other ranks failed (" +
                           status.message() + ")");
  }
  // Per-tensor failures only fail their tensors; what comes back is a
  // transport failure, after which the ranks cannot move data together.
  status = set.executor.Execute(outcome->responses, queue_);
  if (!status.ok()) {
    return Status::Aborted("tfring stopped: a collective failed (" + status.message() + ")");
  }
  return Status::OK();
}

void BackgroundLoop::ApplyProcessSetChange() {
  ProcessSetRegistry::Change change = registry_->TakeStaged();
  if (change.add) {
    if (change.transport) AddProcessSet(change.id, change.ranks, std::move(change.transport));
  } else {
    auto it = std::find_if(sets_.begin(), sets_.end(),
                           [&](const auto& set) { return set->id == change.id; });
    if (it != sets_.end()) {
      const Status removed = Status::InvalidArgument(
          "tfring: process set " + std::to_string(change.id) +
          " was removed (tfring.remove_process_set) while this collective waited for the other "
          "ranks of the set.");
      for (const std::string& name : (*it)->controller.PendingNames()) {
        TensorEntry entry = queue_->Take(name);
        CompleteEntry(entry, removed);
      }
      sets_.erase(it);
    }
  }
  registry_->MarkApplied();
}

bool BackgroundLoop::AnyPending() const {
  return std::any_of(sets_.begin(), sets_.end(),
                     [](const auto& set) { return set->controller.num_pending() > 0; });
}

void BackgroundLoop::Run() {
  using Clock = std::chrono::steady_clock;
  const auto cycle = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(config_.cycle_time_ms));
  // Work this rank submitted but the others have not (yet) is usually only
  // microseconds behind on the other ranks: retry soon rather than a whole
  // cycle later. The retry cannot spin: a round completes only when every
  // rank joins it.
  const auto pending_retry = std::min<Clock::duration>(cycle, std::chrono::microseconds(50));
  Clock::time_point next_round = Clock::now();
  Status stop_reason;
  bool stopped_by_failure = false;  // stopped by a failure rather than a shutdown
  // A process set's coordinator asked to stop the job (a stall): the request
  // rides the next global round, so every rank stops together.
  bool set_asked_shutdown = false;
  while (true) {
    // New work wakes the thread at once; otherwise rounds run every cycle so
    // this rank answers the rounds other ranks start.
    queue_->WaitForWork(next_round);
    std::map<int32_t, std::vector<Request>> requests = TakeNewRequestsBySet();

    RoundOutcome outcome;
    SetRuntime& global = *sets_.front();
    Status status = RunSet(global, std::move(requests[0]),
                           shutdown_requested_.load() || set_asked_shutdown, &outcome);
    if (status.ok() && !outcome.shutdown) {
      if (outcome.process_set_change_agreed) ApplyProcessSetChange();
      for (size_t i = 1; i < sets_.size() && status.ok(); ++i) {
        SetRuntime& set = *sets_[i];
        RoundOutcome set_outcome;
        status = RunSet(set, std::move(requests[set.id]), false, &set_outcome);
        if (set_outcome.shutdown && !set_asked_shutdown) {
          TFRING_LOG(kWarning, "process set " << set.id << ": " << set_outcome.shutdown_reason
                                              << "; stopping the job");
          set_asked_shutdown = true;
        }
      }
    }
    if (!status.ok()) {
      stop_reason = status;
      stopped_by_failure = true;
      break;
    }
    next_round = Clock::now() + (AnyPending() ? pending_retry : cycle);
    if (outcome.shutdown) {
      stop_reason = Status::Aborted("tfring was shut down: " + outcome.shutdown_reason +
                                    ". Collectives still pending were cancelled; call "
                                    "tfring.init() on every rank to start again.");
      break;
    }
  }
  // No longer running from here on: an init() that follows the cancellation
  // errors below (which the user may see at once) must start a new loop, not
  // find this one still "running".
  running_ = false;
  exit_status_ = stop_reason;
  if (registry_ != nullptr) registry_->Stop(stop_reason);
  std::vector<TensorEntry> cancelled = queue_->Close(stop_reason);
  // A coordinated shutdown with nothing pending is the normal end of a job.
  if (!cancelled.empty() || stopped_by_failure) {
    TFRING_LOG(kWarning, stop_reason.message() << " (" << cancelled.size()
                                               << " collectives cancelled on this rank)");
  }
  for (TensorEntry& entry : cancelled) CompleteEntry(entry, stop_reason);
}

}  // namespace tfring
