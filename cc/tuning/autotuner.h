// Autotuner: rank 0's online search (TFRING_AUTOTUNE=1) for the fusion
// threshold, direct threshold and cycle time that give the most throughput.
//
// Why: the best values depend on the model's tensor sizes, the step time,
// the network and the number of ranks, so any default is a compromise. The
// tuner measures instead of guessing: throughput is bytes reduced per second
// of wall time *including* the compute between steps (a setting that delays
// the next step scores lower, which is what a user feels), a trial's score is
// the median of a few samples (one slow step does not decide), and the next
// trial comes from Bayesian optimisation (bayesian_optimizer.h) over the
// logarithms of the knobs. After a fixed number of trials it settles on the
// trial the model rates best and stops, so a long run pays the search once.
//
// This file is bookkeeping only: it reads no clock and applies nothing. The
// background loop feeds RecordCycle and, when it returns true, applies
// current() (the thresholds are job-scope: every rank must switch at the same
// round). That keeps it testable with synthetic time (tests/cc/autotune_test.cc).
//
// Measurement: cycles are grouped into samples of `cycles_per_sample`; a
// sample's score is its bytes over the seconds from the end of the cycle
// before its first cycle to the end of its last. The very first cycle only
// starts the clock. The first `warmup_samples` samples are discarded; then
// every trial discards one transition sample (the switch to new values and
// whatever was in flight) and scores `samples_per_trial` samples.
//
// Log (AutotuneSettings::log_path), one CSV row per trial, flushed each row:
//   trial,phase,fusion_threshold,direct_threshold,cycle_time_ms,score_bytes_per_s,samples
// phase: `initial` (the start values and the space-filling design),
// `bayes` (chosen by expected improvement), `final` (the settled choice:
// `trial` is the number of the trial it came from, with that trial's score),
// or `all_fixed` (every knob set by the user: one row, nothing tuned, empty
// score). `samples`: the trial's scored samples in bytes/s, ';'-separated.
#ifndef TFRING_CC_TUNING_AUTOTUNER_H_
#define TFRING_CC_TUNING_AUTOTUNER_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cc/tuning/bayesian_optimizer.h"

namespace tfring {

// The search box (every knob searched on a log scale). Thresholds are
// rounded to multiples of kAutotuneThresholdGranule; the fusion threshold's
// upper end is AutotuneSettings::max_fusion_threshold rounded down to one.
constexpr int64_t kAutotuneThresholdGranule = 4 * 1024;
constexpr int64_t kAutotuneMinFusionThreshold = 64 * 1024;
constexpr int64_t kAutotuneMinDirectThreshold = 64 * 1024;
constexpr int64_t kAutotuneMaxDirectThreshold = 64LL * 1024 * 1024;
constexpr double kAutotuneMinCycleTimeMs = 0.1;
constexpr double kAutotuneMaxCycleTimeMs = 10.0;

struct TunableParameters {
  int64_t fusion_threshold = 0;
  int64_t direct_threshold = 0;
  double cycle_time_ms = 0.0;
};

struct AutotuneSettings {
  std::string log_path;          // CSV of every trial; empty: no log
  // The variable that named log_path, for errors.
  std::string log_setting = "TFRING_AUTOTUNE_LOG";
  int warmup_samples = 3;        // samples discarded at the start (tracing, first steps)
  int cycles_per_sample = 10;    // cycles that moved data, per sample
  // A trial's score is the median of its samples (after one discarded
  // transition sample).
  int samples_per_trial = 3;
  int max_trials = 20;           // then it settles on the best and stops
  double noise = 0.8;            // GP noise, relative to standardised scores
  // Set by the user: never changed.
  bool fixed_fusion_threshold = false;
  bool fixed_direct_threshold = false;
  bool fixed_cycle_time = false;
  int64_t max_fusion_threshold = 0;  // the reserved fusion buffer: never exceed it
  uint64_t seed = 1;
};

class Autotuner {
 public:
  // The first trial measures `start` (a searched fusion threshold above
  // max_fusion_threshold is lowered to it). Opens the log; if it cannot be
  // opened, warns once and tunes without it. A fusion threshold is not
  // searched when max_fusion_threshold is below kAutotuneMinFusionThreshold
  // (no room to search). With nothing to search, finished() is true at once.
  Autotuner(AutotuneSettings settings, TunableParameters start);
  ~Autotuner();
  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  // Called by rank 0's background loop after every cycle that executed
  // collectives: the bytes they moved (inputs) and the time the cycle ended.
  // Returns true when current() changed. Does nothing once finished().
  bool RecordCycle(int64_t bytes, std::chrono::steady_clock::time_point end);

  // The values to run with now.
  const TunableParameters& current() const { return current_; }
  // Settled: current() is the final choice.
  bool finished() const { return finished_; }
  // Trials whose score is known.
  int trials_completed() const { return static_cast<int>(trials_.size()); }

 private:
  enum class Knob { kFusionThreshold, kDirectThreshold, kCycleTime };
  struct Trial {
    TunableParameters parameters;
    std::string phase;
    double score = 0.0;
    std::vector<double> samples;
  };

  void OpenLog();
  void WriteLogRow(int trial, const std::string& phase, const TunableParameters& parameters,
                   const std::string& score, const std::vector<double>& samples);
  // Handles one finished sample; true when current() changed.
  bool RecordSample(double bytes_per_second);
  // Scores the trial just measured and picks the next one (or settles).
  bool CompleteTrial();
  // Searched knobs as optimizer coordinates (log2 of each value) and back,
  // rounded to what the core can run with; fixed knobs keep start's values.
  std::vector<double> ToPoint(const TunableParameters& parameters) const;
  TunableParameters FromPoint(const std::vector<double>& point) const;

  AutotuneSettings settings_;
  TunableParameters start_;
  TunableParameters current_;
  int64_t max_fusion_threshold_ = 0;  // rounded down to the granule
  std::vector<Knob> searched_;
  std::vector<Bounds> bounds_;
  std::unique_ptr<BayesianOptimizer> optimizer_;
  // Optimizer coordinates of the opening design, measured after the start.
  std::vector<std::vector<double>> design_;
  std::vector<Trial> trials_;
  bool finished_ = false;

  // The sample being measured.
  bool clock_started_ = false;
  std::chrono::steady_clock::time_point sample_start_;
  int64_t sample_bytes_ = 0;
  int sample_cycles_ = 0;
  // Where the current trial stands.
  int warmup_left_ = 0;
  bool transition_pending_ = true;
  std::vector<double> trial_samples_;

  std::FILE* log_ = nullptr;
};

}  // namespace tfring

#endif  // TFRING_CC_TUNING_AUTOTUNER_H_
