#include "cc/tuning/autotune_config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "cc/logging.h"

namespace tfring {
namespace {

constexpr double kLargestStartBytes = static_cast<double>(int64_t{1} << 50);

}  // namespace

Status ParseAutotuneStart(const std::string& text, TunableParameters* start) {
  const std::string expected =
      " Expected comma-separated name=value items with names fusion_threshold (bytes), "
      "direct_threshold (bytes) and cycle_time (milliseconds), e.g. "
      "\"fusion_threshold=65536,cycle_time=2\".";
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const size_t equals = item.find('=');
    const std::string name = item.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : item.substr(equals + 1);
    char* end = nullptr;
    const double number = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(number > 0) || !std::isfinite(number)) {
      return Status::InvalidArgument("TFRING_AUTOTUNE_START: '" + item +
                                     "' does not give a positive number." + expected);
    }
    // Bytes beyond any buffer are clamped here (the tuner then clamps to
    // the reserved fusion buffer), before the cast that could overflow.
    if (name == "fusion_threshold") {
      start->fusion_threshold = static_cast<int64_t>(std::min(number, kLargestStartBytes));
    } else if (name == "direct_threshold") {
      start->direct_threshold = static_cast<int64_t>(std::min(number, kLargestStartBytes));
    } else if (name == "cycle_time") {
      start->cycle_time_ms = std::min(number, kLargestCycleTimeMs);
    } else {
      return Status::InvalidArgument("TFRING_AUTOTUNE_START: unknown name '" + name + "'." +
                                     expected);
    }
  }
  return Status::OK();
}

std::unique_ptr<Autotuner> MakeAutotuner(const Config& config) {
  if (config.autotune == 0) return nullptr;
  TunableParameters start;
  start.fusion_threshold = config.fusion_threshold;
  start.direct_threshold = config.direct_threshold;
  start.cycle_time_ms = config.cycle_time_ms;
  const Status parsed = ParseAutotuneStart(config.autotune_start, &start);
  if (!parsed.ok()) {
    TFRING_LOG(kWarning, parsed.message() << " Starting from the configured values.");
    start.fusion_threshold = config.fusion_threshold;
    start.direct_threshold = config.direct_threshold;
    start.cycle_time_ms = config.cycle_time_ms;
  }
  AutotuneSettings settings;
  settings.fixed_fusion_threshold = config.SetInEnvironment("TFRING_FUSION_THRESHOLD");
  settings.fixed_direct_threshold = config.SetInEnvironment("TFRING_DIRECT_THRESHOLD");
  settings.fixed_cycle_time = config.SetInEnvironment("TFRING_CYCLE_TIME");
  // A knob the user set stays at their value, wherever the start says.
  if (settings.fixed_fusion_threshold) start.fusion_threshold = config.fusion_threshold;
  if (settings.fixed_direct_threshold) start.direct_threshold = config.direct_threshold;
  if (settings.fixed_cycle_time) start.cycle_time_ms = config.cycle_time_ms;
  settings.log_path = config.autotune_log;
  if (!config.SetBy("TFRING_AUTOTUNE_LOG").empty()) {
    settings.log_setting = config.SetBy("TFRING_AUTOTUNE_LOG");
  }
  settings.warmup_samples = static_cast<int>(config.autotune_warmup_samples);
  const auto at_least_one = [](int64_t value) {
    return static_cast<int>(std::max<int64_t>(1, value));
  };
  settings.cycles_per_sample = at_least_one(config.autotune_cycles_per_sample);
  settings.samples_per_trial = at_least_one(config.autotune_samples_per_trial);
  settings.max_trials = at_least_one(config.autotune_max_trials);
  settings.noise = config.autotune_noise;
  // The fusion buffer was reserved for the configured threshold on every
  // rank: the search stays within it.
  settings.max_fusion_threshold = config.fusion_threshold;
  return std::make_unique<Autotuner>(settings, start);
}

}  // namespace tfring
