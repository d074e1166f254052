#include "cc/tuning/autotuner.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "cc/logging.h"
#include "cc/output_file.h"

namespace tfring {
namespace {

// Trials of the opening design after the start values, before the model
// chooses: enough to give the first fit a spread of points.
constexpr int kDesignTrials = 3;

int64_t RoundToGranule(double bytes) {
  return std::llround(bytes / kAutotuneThresholdGranule) * kAutotuneThresholdGranule;
}

// Three significant digits: enough resolution for a millisecond timer, and
// the value reads back exactly from the log.
double RoundCycleTime(double ms) {
  const double scale = std::pow(10.0, 2 - static_cast<int>(std::floor(std::log10(ms))));
  return std::round(ms * scale) / scale;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

bool SameParameters(const TunableParameters& a, const TunableParameters& b) {
  return a.fusion_threshold == b.fusion_threshold && a.direct_threshold == b.direct_threshold &&
         a.cycle_time_ms == b.cycle_time_ms;
}

}  // namespace

Autotuner::Autotuner(AutotuneSettings settings, TunableParameters start)
    : settings_(std::move(settings)), start_(start) {
  settings_.warmup_samples = std::max(settings_.warmup_samples, 0);
  settings_.cycles_per_sample = std::max(settings_.cycles_per_sample, 1);
  settings_.samples_per_trial = std::max(settings_.samples_per_trial, 1);
  settings_.max_trials = std::max(settings_.max_trials, 1);
  warmup_left_ = settings_.warmup_samples;
  max_fusion_threshold_ =
      settings_.max_fusion_threshold / kAutotuneThresholdGranule * kAutotuneThresholdGranule;

  if (!settings_.fixed_fusion_threshold && max_fusion_threshold_ > kAutotuneMinFusionThreshold) {
    searched_.push_back(Knob::kFusionThreshold);
    bounds_.push_back({std::log2(static_cast<double>(kAutotuneMinFusionThreshold)),
                       std::log2(static_cast<double>(max_fusion_threshold_))});
    start_.fusion_threshold = std::min(start_.fusion_threshold, max_fusion_threshold_);
  }
  if (!settings_.fixed_direct_threshold) {
    searched_.push_back(Knob::kDirectThreshold);
    bounds_.push_back({std::log2(static_cast<double>(kAutotuneMinDirectThreshold)),
                       std::log2(static_cast<double>(kAutotuneMaxDirectThreshold))});
  }
  if (!settings_.fixed_cycle_time) {
    searched_.push_back(Knob::kCycleTime);
    bounds_.push_back({std::log2(kAutotuneMinCycleTimeMs), std::log2(kAutotuneMaxCycleTimeMs)});
  }
  current_ = start_;

  OpenLog();
  if (searched_.empty()) {
    finished_ = true;
    WriteLogRow(0, "all_fixed", current_, "", {});
    return;
  }
  optimizer_ = std::make_unique<BayesianOptimizer>(bounds_, settings_.noise, settings_.seed);
  design_ = LatinHypercube(bounds_, std::min(kDesignTrials, settings_.max_trials - 1),
                           settings_.seed);
}

Autotuner::~Autotuner() {
  if (log_ != nullptr) std::fclose(log_);
}

void Autotuner::OpenLog() {
  if (settings_.log_path.empty()) return;
  const Status opened = OpenOutputFile(settings_.log_path,
                                       "tfring autotune log (" + settings_.log_setting + ")",
                                       &log_);
  if (!opened.ok()) {
    TFRING_LOG(kWarning, opened.message() << " Tuning without a log.");
    return;
  }
  std::fputs("trial,phase,fusion_threshold,direct_threshold,cycle_time_ms,score_bytes_per_s,"
             "samples\n",
             log_);
  std::fflush(log_);
}

void Autotuner::WriteLogRow(int trial, const std::string& phase,
                            const TunableParameters& parameters, const std::string& score,
                            const std::vector<double>& samples) {
  if (log_ == nullptr) return;
  std::string joined;
  for (double sample : samples) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.0f", sample);
    if (!joined.empty()) joined += ';';
    joined += text;
  }
  std::fprintf(log_, "%d,%s,%lld,%lld,%.6g,%s,%s\n", trial, phase.c_str(),
               static_cast<long long>(parameters.fusion_threshold),
               static_cast<long long>(parameters.direct_threshold), parameters.cycle_time_ms,
               score.c_str(), joined.c_str());
  if (std::fflush(log_) != 0 || std::ferror(log_)) {
    const int error = errno;
    TFRING_LOG(kWarning, "TFRING_AUTOTUNE: cannot write the log " << settings_.log_path << ": "
                                                                   << std::strerror(error)
                                                                   << "; tuning without a log");
    std::fclose(log_);
    log_ = nullptr;
  }
}

bool Autotuner::RecordCycle(int64_t bytes, std::chrono::steady_clock::time_point end) {
  if (finished_) return false;
  if (!clock_started_) {
    // Nothing tells when this cycle's work began: it only starts the clock.
    clock_started_ = true;
    sample_start_ = end;
    return false;
  }
  sample_bytes_ += bytes;
  if (++sample_cycles_ < settings_.cycles_per_sample) return false;

  const double seconds = std::chrono::duration<double>(end - sample_start_).count();
  const double bytes_per_second =
      static_cast<double>(sample_bytes_) / std::max(seconds, 1e-9);
  sample_start_ = end;
  sample_bytes_ = 0;
  sample_cycles_ = 0;
  return RecordSample(bytes_per_second);
}

bool Autotuner::RecordSample(double bytes_per_second) {
  if (warmup_left_ > 0) {
    --warmup_left_;
    return false;
  }
  if (transition_pending_) {
    transition_pending_ = false;
    return false;
  }
  trial_samples_.push_back(bytes_per_second);
  if (static_cast<int>(trial_samples_.size()) < settings_.samples_per_trial) return false;
  return CompleteTrial();
}

bool Autotuner::CompleteTrial() {
  const TunableParameters previous = current_;
  Trial trial;
  trial.parameters = current_;
  trial.phase = trials_.size() <= design_.size() ? "initial" : "bayes";
  trial.score = Median(trial_samples_);
  trial.samples = std::move(trial_samples_);
  trial_samples_.clear();
  transition_pending_ = true;

  char score[32];
  std::snprintf(score, sizeof(score), "%.0f", trial.score);
  WriteLogRow(static_cast<int>(trials_.size()) + 1, trial.phase, trial.parameters, score,
              trial.samples);
  optimizer_->AddSample(ToPoint(trial.parameters), trial.score);
  trials_.push_back(std::move(trial));

  const size_t done = trials_.size();
  if (static_cast<int>(done) >= settings_.max_trials) {
    const size_t best = optimizer_->BestSampleIndex();
    const Trial& chosen = trials_[best];
    current_ = chosen.parameters;
    finished_ = true;
    std::snprintf(score, sizeof(score), "%.0f", chosen.score);
    WriteLogRow(static_cast<int>(best) + 1, "final", current_, score, chosen.samples);
  } else if (done <= design_.size()) {
    current_ = FromPoint(design_[done - 1]);
  } else {
    current_ = FromPoint(optimizer_->NextPoint());
  }
  return !SameParameters(previous, current_);
}

std::vector<double> Autotuner::ToPoint(const TunableParameters& parameters) const {
  std::vector<double> point;
  for (size_t i = 0; i < searched_.size(); ++i) {
    double value = 0.0;
    switch (searched_[i]) {
      case Knob::kFusionThreshold: value = static_cast<double>(parameters.fusion_threshold); break;
      case Knob::kDirectThreshold: value = static_cast<double>(parameters.direct_threshold); break;
      case Knob::kCycleTime: value = parameters.cycle_time_ms; break;
    }
    // Start values outside the box (or 0) are modelled at its nearest edge.
    const double coordinate = value > 0.0 ? std::log2(value) : bounds_[i].lo;
    point.push_back(std::min(bounds_[i].hi, std::max(bounds_[i].lo, coordinate)));
  }
  return point;
}

TunableParameters Autotuner::FromPoint(const std::vector<double>& point) const {
  TunableParameters parameters = start_;
  for (size_t i = 0; i < searched_.size(); ++i) {
    const double value = std::exp2(point[i]);
    switch (searched_[i]) {
      case Knob::kFusionThreshold:
        parameters.fusion_threshold = std::min(
            max_fusion_threshold_, std::max(kAutotuneMinFusionThreshold, RoundToGranule(value)));
        break;
      case Knob::kDirectThreshold:
        parameters.direct_threshold =
            std::min(kAutotuneMaxDirectThreshold,
                     std::max(kAutotuneMinDirectThreshold, RoundToGranule(value)));
        break;
      case Knob::kCycleTime:
        parameters.cycle_time_ms = std::min(
            kAutotuneMaxCycleTimeMs, std::max(kAutotuneMinCycleTimeMs, RoundCycleTime(value)));
        break;
    }
  }
  return parameters;
}

}  // namespace tfring
