// The autotuner as the configuration asks for it: TFRING_AUTOTUNE and its
// TFRING_AUTOTUNE_* settings, the knobs the user fixed by setting them, and
// where the search starts.
//
// Why apart from autotuner.*: that file is the search alone (no
// environment, testable with synthetic time); this one maps the user's
// configuration onto it.
#ifndef TFRING_CC_TUNING_AUTOTUNE_CONFIG_H_
#define TFRING_CC_TUNING_AUTOTUNE_CONFIG_H_

#include <memory>
#include <string>

#include "cc/tuning/autotuner.h"
#include "cc/config.h"
#include "cc/status.h"

namespace tfring {

// Rank 0's autotuner, or null when TFRING_AUTOTUNE is 0. A malformed
// TFRING_AUTOTUNE_START is reported (a warning) and ignored.
std::unique_ptr<Autotuner> MakeAutotuner(const Config& config);

// Applies "fusion_threshold=N,direct_threshold=N,cycle_time=MS" (any
// subset, any order) to `start`. InvalidArgument naming the bad item.
Status ParseAutotuneStart(const std::string& text, TunableParameters* start);

}  // namespace tfring

#endif  // TFRING_CC_TUNING_AUTOTUNE_CONFIG_H_
