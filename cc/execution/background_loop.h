// BackgroundLoop: the one thread per process that does all communication.
//
// Why one thread:
//  - MPI (and later NCCL) calls stay on a single thread, in one order.
//  - Every rank must learn every other rank's shape, dtype and op for a
//    tensor before any data moves, so that a mismatch becomes an error on
//    all ranks instead of a hang or corrupted values.
//  - Framework threads never block on the network; they enqueue and return.
//  - Ranks may submit tensors in different orders (TensorFlow runs
//    independent ops in any order); the negotiation puts them in one order.
// Each cycle: wait for new work (or the cycle time), run a negotiation round
// (controller), execute the agreed responses (executor), fire callbacks.
//
// Process sets: each set this rank belongs to has its own transport,
// controller (so its own negotiation, cache and coordinator) and executor;
// one thread serves them all, running their rounds every cycle in id order,
// the global set first. Ranks of disjoint sets never wait for each other,
// and ranks sharing several sets meet them in the same order, so no two
// ranks can wait in different sets' rounds for each other.
//
// Rank 0 announces, in every global round (RoundInputs::root_words), the
// fusion and direct thresholds and the cycle time for the rounds to come
// (the autotuner's choice, or the configured values) and whether its
// timeline records; every rank applies them after the same round.
#ifndef TFRING_CC_EXECUTION_BACKGROUND_LOOP_H_
#define TFRING_CC_EXECUTION_BACKGROUND_LOOP_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cc/tuning/autotuner.h"
#include "cc/execution/collective_executor.h"
#include "cc/config.h"
#include "cc/negotiation/controller.h"
#include "cc/negotiation/process_set_registry.h"
#include "cc/negotiation/tensor_queue.h"
#include "cc/timeline/timeline.h"
#include "cc/transport.h"

namespace tfring {

class BackgroundLoop {
 public:
  // The loop borrows `transport` (the global set's), `queue`, `registry`
  // (may be null: the global set only) and `timeline` (may be null: never
  // records; only rank 0's records); all must outlive it.
  BackgroundLoop(Transport* transport, TensorQueue* queue, const Config& config,
                 ProcessSetRegistry* registry = nullptr, Timeline* timeline = nullptr);
  ~BackgroundLoop();

  // Before Start: a process set this rank belongs to, over `transport`.
  void AddProcessSet(int32_t id, std::vector<int> ranks, std::unique_ptr<Transport> transport);

  // Collective: prepares every rank's executor, then starts the thread. On
  // failure (on any rank) no thread starts and every rank returns the error.
  Status Start();
  // Asks every rank to stop at the next round; returns immediately.
  void RequestShutdown();
  // Waits for the thread to exit. Returns why the loop stopped.
  Status Join();
  bool running() const { return running_.load(); }
  // Whether a failure stopped the loop (a peer died or stopped taking part,
  // the transport failed), rather than a shutdown. Valid after Join, or once
  // running() is false.
  bool stopped_by_failure() const { return stopped_by_failure_; }
  // Elastic training: a failure leaves the timeline open, as the job goes on
  // over the survivors. Any thread.
  void KeepTimelineOnFailure() { keep_timeline_on_failure_ = true; }
  // The global set's controller. Valid after Join (it belongs to the
  // background thread).
  const Controller& controller() const { return sets_.front()->controller; }

 private:
  // What the loop keeps for one process set this rank belongs to.
  struct SetRuntime {
    SetRuntime(int32_t id, std::vector<int> ranks, std::unique_ptr<Transport> owned,
               Transport* transport, const Config& config);
    const int32_t id;
    const std::vector<int> ranks;  // job ranks, sorted
    std::unique_ptr<Transport> owned_transport;  // null for the global set
    Transport* transport;
    Controller controller;
    CollectiveExecutor executor;
  };

  void Run();
  // This cycle's new requests, by process set. Requests of a set this rank
  // no longer has (removed meanwhile) fail here.
  std::map<int32_t, std::vector<SubmittedRequest>> TakeNewRequestsBySet();
  // One round and its execution for `set`. A failure returned stops the loop.
  Status RunSet(SetRuntime& set, std::vector<SubmittedRequest> requests,
                const RoundInputs& inputs, RoundOutcome* outcome);
  // Rank 0's announcement for the next global round.
  std::vector<uint64_t> RootWords() const;
  // Applies rank 0's announcement (every rank, after the same round).
  void ApplyRootWords(const std::vector<uint64_t>& words);
  // Rank 0, while its timeline records a round of `set`: what the executor
  // needs to record it (null otherwise). Non-null: the timeline's round has
  // begun (Timeline::BeginRound); the caller ends it.
  std::unique_ptr<RoundTrace> TraceFor(const SetRuntime& set, const RoundOutcome& outcome);
  // Applies the staged process-set change (every rank applies it in the
  // same cycle).
  void ApplyProcessSetChange();
  bool AnyPending() const;
  // Rank 0: feeds the cycle's bytes to the autotuner; its new choice goes
  // out with the next round.
  void FeedAutotuner();

  TensorQueue* queue_;
  const Config& config_;
  ProcessSetRegistry* registry_;
  std::vector<std::unique_ptr<SetRuntime>> sets_;  // by id; the global set first
  std::thread thread_;
  std::atomic<bool> shutdown_requested_{false};
  std::atomic<bool> running_{false};
  Status exit_status_;
  bool stopped_by_failure_ = false;
  std::atomic<bool> keep_timeline_on_failure_{false};
  Timeline* timeline_;
  // The knobs in force, as rank 0 last announced them.
  int64_t fusion_threshold_;
  int64_t direct_threshold_;
  double cycle_time_ms_;
  // Rank 0: what it announces next (the autotuner's current trial, or the
  // configured values), and the autotuner (null unless TFRING_AUTOTUNE).
  TunableParameters proposal_;
  std::unique_ptr<Autotuner> autotuner_;
  int64_t bytes_seen_ = 0;  // bytes moved by every set, as last fed to the autotuner
  // Rank 0's timeline records: every rank reports readiness in its rounds.
  bool report_readiness_ = false;
  int64_t cycle_ = 0;
  TimelineClock::time_point cycle_start_;
  bool cycle_marked_ = false;  // this cycle's timeline mark is recorded
  int64_t next_batch_ = 0;
};

}  // namespace tfring

#endif  // TFRING_CC_EXECUTION_BACKGROUND_LOOP_H_
