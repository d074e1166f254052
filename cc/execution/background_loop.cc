#include "cc/execution/background_loop.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "cc/tuning/autotune_config.h"
#include "cc/logging.h"
#include "cc/execution/thread_tuning.h"

namespace tfring {
namespace {

// The global round's root words (RoundInputs::root_words).
enum RootWord : int {
  kRootFlags = 0,
  kRootFusionThreshold,
  kRootDirectThreshold,
  kRootCycleTime,  // the bits of a double, milliseconds
  kNumRootWords
};
// Bits of kRootFlags.
constexpr uint64_t kTimelineRecording = 1ull << 0;
constexpr uint64_t kCycleTimeFromRoot = 1ull << 1;  // every rank adopts rank 0's cycle time
// How often an idle rank that is called to rounds (Transport::
// WatchRoundCalls) runs one anyway.
constexpr std::chrono::milliseconds kIdleRoundWhenCalled{100};

uint64_t DoubleBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}
double BitsDouble(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

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
      controller(set_transport, config, ranks, set_id == 0 ? kNumRootWords : 0),
      executor(set_transport, config, ranks) {}

BackgroundLoop::BackgroundLoop(Transport* transport, TensorQueue* queue, const Config& config,
                               ProcessSetRegistry* registry, Timeline* timeline)
    : queue_(queue),
      config_(config),
      registry_(registry),
      timeline_(timeline),
      fusion_threshold_(config.fusion_threshold),
      direct_threshold_(config.direct_threshold),
      cycle_time_ms_(config.cycle_time_ms) {
  sets_.push_back(std::make_unique<SetRuntime>(0, AllRanks(transport->size()), nullptr,
                                               transport, config));
  proposal_ = TunableParameters{config.fusion_threshold, config.direct_threshold,
                                config.cycle_time_ms};
  if (transport->rank() == 0) {
    autotuner_ = MakeAutotuner(config);
    if (autotuner_) proposal_ = autotuner_->current();
  }
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
  sets_.back()->executor.SetThresholds(fusion_threshold_, direct_threshold_);
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

std::map<int32_t, std::vector<SubmittedRequest>> BackgroundLoop::TakeNewRequestsBySet() {
  std::map<int32_t, std::vector<SubmittedRequest>> by_set;
  for (SubmittedRequest& submitted : queue_->TakeNewRequests()) {
    const Request& request = submitted.request;
    const int32_t id = request.process_set_id;
    const bool known = std::any_of(sets_.begin(), sets_.end(),
                                   [id](const auto& set) { return set->id == id; });
    if (known) {
      by_set[id].push_back(std::move(submitted));
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

Status BackgroundLoop::RunSet(SetRuntime& set, std::vector<SubmittedRequest> requests,
                              const RoundInputs& inputs, RoundOutcome* outcome) {
  Status status;
  try {
    status = set.controller.RunRound(std::move(requests), inputs, outcome);
  } catch (const std::exception& e) {
    status = Status::Internal(std::string("negotiation threw: ") + e.what());
  } catch (...) {
    status = Status::Internal("negotiation threw a non-standard exception");
  }
  if (!status.ok()) {
    return Status::Aborted("tfring stopped: communication with the other ranks failed (" +
                           status.message() + ")");
  }
  if (set.id == 0) ApplyRootWords(outcome->root_words);
  const std::unique_ptr<RoundTrace> trace = TraceFor(set, *outcome);
  // The cycle's mark goes ahead of its first op, into the same file.
  if (trace && !cycle_marked_ && timeline_->mark_cycles()) {
    timeline_->RecordCycle(cycle_, cycle_start_);
    cycle_marked_ = true;
  }
  // Per-tensor failures only fail their tensors; what comes back is a
  // transport failure, after which the ranks cannot move data together.
  // A transport failure comes back as "tfring stopped: a collective failed
  // (...)", the words its own tensors got.
  status = set.executor.Execute(outcome->responses, queue_, trace.get());
  if (trace) timeline_->EndRound();
  return status;
}

std::vector<uint64_t> BackgroundLoop::RootWords() const {
  std::vector<uint64_t> words(kNumRootWords, 0);
  if (timeline_ != nullptr && timeline_->recording()) words[kRootFlags] |= kTimelineRecording;
  if (autotuner_) words[kRootFlags] |= kCycleTimeFromRoot;
  words[kRootFusionThreshold] = static_cast<uint64_t>(proposal_.fusion_threshold);
  words[kRootDirectThreshold] = static_cast<uint64_t>(proposal_.direct_threshold);
  words[kRootCycleTime] = DoubleBits(proposal_.cycle_time_ms);
  return words;
}

void BackgroundLoop::FeedAutotuner() {
  if (!autotuner_ || autotuner_->finished()) return;
  int64_t moved = 0;
  for (const auto& set : sets_) moved += set->executor.bytes_moved();
  // Removed sets take their counts with them: never feed a negative delta.
  const int64_t bytes = moved - bytes_seen_;
  bytes_seen_ = moved;
  if (bytes <= 0) return;
  if (autotuner_->RecordCycle(bytes, TimelineClock::now())) proposal_ = autotuner_->current();
}

void BackgroundLoop::ApplyRootWords(const std::vector<uint64_t>& words) {
  report_readiness_ = (words[kRootFlags] & kTimelineRecording) != 0;
  const auto fusion = static_cast<int64_t>(words[kRootFusionThreshold]);
  const auto direct = static_cast<int64_t>(words[kRootDirectThreshold]);
  if (fusion != fusion_threshold_ || direct != direct_threshold_) {
    fusion_threshold_ = fusion;
    direct_threshold_ = direct;
    for (auto& set : sets_) set->executor.SetThresholds(fusion, direct);
  }
  if ((words[kRootFlags] & kCycleTimeFromRoot) != 0) {
    cycle_time_ms_ = BitsDouble(words[kRootCycleTime]);
  }
}

std::unique_ptr<RoundTrace> BackgroundLoop::TraceFor(const SetRuntime& set,
                                                     const RoundOutcome& outcome) {
  // Only job rank 0 records, and only the sets it belongs to (where it is
  // the set's rank 0 too: set ranks are sorted).
  if (timeline_ == nullptr || set.transport->rank() != 0 || set.ranks.front() != 0 ||
      outcome.responses.empty() || !timeline_->BeginRound()) {
    return nullptr;
  }
  auto trace = std::make_unique<RoundTrace>();
  trace->timeline = timeline_;
  trace->cycle = cycle_;
  trace->agreed = outcome.agreed;
  trace->next_batch = &next_batch_;
  const size_t size = set.ranks.size();
  if (outcome.waited_us.size() == outcome.responses.size() * size) {
    trace->ready.resize(outcome.responses.size());
    for (size_t i = 0; i < outcome.responses.size(); ++i) {
      for (size_t r = 0; r < size; ++r) {
        const int64_t waited = outcome.waited_us[i * size + r];
        if (waited < 0) continue;
        trace->ready[i].push_back(ReadyMark{
            set.ranks[r], outcome.agreed - std::chrono::microseconds(waited)});
      }
    }
  }
  return trace;
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
  TuneLatencySensitiveThread();
  using Clock = std::chrono::steady_clock;
  const auto milliseconds = [](double ms) {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(ms));
  };
  // Work this rank submitted but the others have not (yet) is usually only
  // microseconds behind on the other ranks: retry soon rather than a whole
  // cycle later. The retry cannot spin: a round completes only when every
  // rank joins it.
  const auto pending_retry = std::chrono::microseconds(50);
  // Where the transport calls idle ranks to the rounds others start, an
  // idle rank runs no rounds of its own: each one wakes every rank and costs
  // CPU that training needs (measured: about a tenth of a small model's
  // steps on 2 cores with rounds every 1 ms). One every kIdleRoundWhenCalled
  // remains as a backstop.
  Transport* global_transport = sets_.front()->transport;
  const bool called_to_rounds = global_transport->WatchRoundCalls([this] { queue_->Wake(); });
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
    cycle_start_ = Clock::now();
    cycle_marked_ = false;
    ++cycle_;
    std::map<int32_t, std::vector<SubmittedRequest>> requests = TakeNewRequestsBySet();

    RoundInputs inputs;
    inputs.request_shutdown = shutdown_requested_.load() || set_asked_shutdown;
    inputs.process_set_change_staged = registry_ != nullptr && registry_->HasStaged();
    inputs.root_words = RootWords();
    inputs.report_readiness = report_readiness_;
    RoundOutcome outcome;
    SetRuntime& global = *sets_.front();
    Status status = RunSet(global, std::move(requests[0]), inputs, &outcome);
    if (status.ok() && !outcome.shutdown) {
      if (outcome.process_set_change_agreed) ApplyProcessSetChange();
      RoundInputs set_inputs;
      set_inputs.report_readiness = report_readiness_;
      for (size_t i = 1; i < sets_.size() && status.ok(); ++i) {
        SetRuntime& set = *sets_[i];
        RoundOutcome set_outcome;
        status = RunSet(set, std::move(requests[set.id]), set_inputs, &set_outcome);
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
    FeedAutotuner();
    const Clock::duration cycle = milliseconds(cycle_time_ms_);
    const Clock::duration idle = called_to_rounds ? kIdleRoundWhenCalled : cycle;
    next_round = Clock::now() + (AnyPending() ? std::min<Clock::duration>(cycle, pending_retry)
                                              : idle);
    if (outcome.shutdown) {
      stop_reason = Status::Aborted(
          "tfring was shut down: " + outcome.shutdown_reason +
          ". Collectives still pending were cancelled and later ones fail at once: the job "
          "cannot go on without every rank.");
      break;
    }
  }
  // No longer running from here on: an init() that follows the cancellation
  // errors below (which the user may see at once) must start a new loop, not
  // find this one still "running".
  // (The reason is stored first: whoever sees running() false may ask it.)
  exit_status_ = stop_reason;
  stopped_by_failure_ = stopped_by_failure;
  running_ = false;
  global_transport->StopWatchingRoundCalls();
  if (registry_ != nullptr) registry_->Stop(stop_reason);
  std::vector<TensorEntry> cancelled = queue_->Close(stop_reason);
  // A coordinated shutdown with nothing pending is the normal end of a job.
  if (!cancelled.empty() || stopped_by_failure) {
    TFRING_LOG(kWarning, stop_reason.message() << " (" << cancelled.size()
                                               << " collectives cancelled on this rank)");
  }
  for (TensorEntry& entry : cancelled) CompleteEntry(entry, stop_reason);
  // Whatever ended the job, the timeline is complete now: close it as valid
  // JSON at once (the process may not get to run its exit handlers). Elastic
  // training goes on after a failure, and records its reset in the same file.
  if (timeline_ != nullptr && !(stopped_by_failure && keep_timeline_on_failure_)) {
    timeline_->Stop();
  }
}

}  // namespace tfring
