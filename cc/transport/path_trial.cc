#include "cc/transport/path_trial.h"

#include <algorithm>

namespace tfring {

PathTrial::PathTrial(int64_t trials) : trials_(std::max<int64_t>(trials, 1)) {}

PathTrial::Path PathTrial::Next() const {
  if (decided_) return chosen_;
  return calls_ % 2 == 0 ? Path::kFlat : Path::kHierarchical;
}

void PathTrial::Record(int64_t bytes, double seconds) {
  if (decided_) return;
  const int path = static_cast<int>(Next());
  if (calls_ >= 2 * kWarmupPerPath) {
    seconds_[path] += seconds;
    bytes_[path] += static_cast<double>(bytes);
  }
  ++calls_;
}

bool PathTrial::NeedsAgreement() const {
  return !decided_ && calls_ >= 2 * (kWarmupPerPath + trials_);
}

void PathTrial::Measured(int64_t out[2]) const {
  for (int path = 0; path < 2; ++path) {
    const double megabytes = bytes_[path] / 1e6;
    out[path] = megabytes > 0 ? static_cast<int64_t>(seconds_[path] * 1e9 / megabytes) : 0;
  }
}

void PathTrial::Agree(const int64_t summed[2]) {
  chosen_ = summed[1] < summed[0] ? Path::kHierarchical : Path::kFlat;
  decided_ = true;
}

}  // namespace tfring
