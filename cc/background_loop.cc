#include "cc/background_loop.h"

#include <algorithm>
#include <chrono>

#include "cc/logging.h"

namespace tfring {

BackgroundLoop::BackgroundLoop(Transport* transport, TensorQueue* queue, const Config& config)
    : transport_(transport),
      queue_(queue),
      config_(config),
      controller_(transport, config),
      executor_(transport, config) {}

BackgroundLoop::~BackgroundLoop() {
  if (thread_.joinable()) {
    RequestShutdown();
    thread_.join();
  }
}

Status BackgroundLoop::Start() {
  TFRING_RETURN_IF_ERROR(executor_.Prepare());
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
  while (true) {
    // New work wakes the thread at once; otherwise rounds run every cycle so
    // this rank answers the rounds other ranks start.
    queue_->WaitForWork(next_round);

    RoundOutcome outcome;
    Status status = RunRoundCatching(&outcome);
    if (!status.ok()) {
      stop_reason = Status::Aborted("tfring stopped: communication with the other ranks failed (" +
                                    status.message() + ")");
      stopped_by_failure = true;
      break;
    }
    // Per-tensor failures only fail their tensors; what comes back is a
    // transport failure, after which the ranks cannot move data together.
    status = executor_.Execute(outcome.responses, queue_);
    if (!status.ok()) {
      stop_reason = Status::Aborted("tfring stopped: a collective failed (" + status.message() +
                                    ")");
      stopped_by_failure = true;
      break;
    }
    next_round = Clock::now() + (controller_.num_pending() > 0 ? pending_retry : cycle);
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
  std::vector<TensorEntry> cancelled = queue_->Close(stop_reason);
  // A coordinated shutdown with nothing pending is the normal end of a job.
  if (!cancelled.empty() || stopped_by_failure) {
    TFRING_LOG(kWarning, stop_reason.message() << " (" << cancelled.size()
                                               << " collectives cancelled on this rank)");
  }
  for (TensorEntry& entry : cancelled) CompleteEntry(entry, stop_reason);
}

Status BackgroundLoop::RunRoundCatching(RoundOutcome* outcome) {
  try {
    return controller_.RunRound(queue_->TakeNewRequests(), shutdown_requested_.load(), outcome);
  } catch (const std::exception& e) {
    return Status::Internal(std::string("negotiation threw: ") + e.what());
  } catch (...) {
    return Status::Internal("negotiation threw a non-standard exception");
  }
}

}  // namespace tfring
