// Every tunable of the core, declared once: type, field, environment
// variable, default, and the line of documentation users see.
//
// Why one table: the knobs are read in one place at start-up, typed and
// validated there, and listed by tfring._core.config() for users and docs.
// Nothing else in the core calls getenv.
#ifndef TFRING_CC_CONFIG_H_
#define TFRING_CC_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/common.h"

namespace tfring {

// X(type, field, ENV_NAME, default, scope, doc)
//
// scope: kJob knobs change which collective calls the ranks make, or their
// sizes (fusion, the cache's bit vector), or are decided by rank 0 alone
// (stall inspection): at init every rank adopts rank 0's value, so a job
// launched without forwarding a variable to every rank (plain mpirun without
// -x, srun) still makes matching calls. kProcess knobs only affect this
// process and may differ between ranks.
#define TFRING_CONFIG_KNOBS(X)                                                  \
  X(int64_t, fusion_threshold, "TFRING_FUSION_THRESHOLD", 128LL * 1024 * 1024, kJob,  \
    "Bytes of the fusion buffer; allreduces of one dtype and op are packed "    \
    "into it up to this size. 0 disables fusion.")                             \
  X(double, cycle_time_ms, "TFRING_CYCLE_TIME", 1.0, kProcess,                            \
    "Milliseconds between negotiation rounds when no new work wakes the "      \
    "background thread earlier.")                                              \
  X(int64_t, cache_capacity, "TFRING_CACHE_CAPACITY", 1024, kJob,                     \
    "Negotiated tensors remembered so later steps agree with one bitwise "     \
    "allreduce instead of a gather and broadcast. 0 disables the cache.")      \
  X(int64_t, direct_threshold, "TFRING_DIRECT_THRESHOLD", 1024 * 1024, kJob,          \
    "Allreduces of at least this many bytes skip the fusion buffer and go "    \
    "straight from input to output (no copies).")                              \
  X(int64_t, output_pool_bytes, "TFRING_OUTPUT_POOL_BYTES", 512LL * 1024 * 1024, kProcess,     \
    "At most this many bytes of freed collective outputs are kept for reuse, "   \
    "so each step's large outputs do not pay for fresh pages; the least "        \
    "recently freed go first, and sizes not asked for again within about two "   \
    "steps are released. 0 disables reuse.")                                     \
  X(double, stall_check_time_s, "TFRING_STALL_CHECK_TIME_SECONDS", 60.0, kJob,        \
    "Seconds a tensor may wait for other ranks before rank 0 warns which "     \
    "ranks are missing it. 0 disables the warning.")                           \
  X(double, stall_shutdown_time_s, "TFRING_STALL_SHUTDOWN_TIME_SECONDS", 0.0, kJob,   \
    "Seconds a tensor may wait before the job is shut down with an error. "    \
    "0 (default) never shuts down.")                                           \
  X(int64_t, log_level, "TFRING_LOG_LEVEL", 3, kProcess,                                  \
    "0 trace, 1 debug, 2 info, 3 warning, 4 error (names also accepted).")

struct Config {
#define TFRING_DECLARE_FIELD(type, field, env, def, scope, doc) type field = def;
  TFRING_CONFIG_KNOBS(TFRING_DECLARE_FIELD)
#undef TFRING_DECLARE_FIELD

  // This process's configuration, read from the environment on first use.
  // Process-scope knobs (logging, the output pool) come from here; a running
  // job's collectives use the configuration agreed at init (EffectiveConfig
  // in api.h).
  TFRING_EXPORT static const Config& Get();
  // Reads every knob from the environment; a malformed value keeps the
  // default and logs a warning naming the variable.
  static Config FromEnvironment();
};

enum class KnobScope { kJob, kProcess };

struct ConfigEntry {
  std::string env_name;
  std::string value;
  std::string default_value;
  std::string doc;
  KnobScope scope = KnobScope::kProcess;
};

// The effective configuration, one entry per knob, for tfring._core.config().
TFRING_EXPORT std::vector<ConfigEntry> DescribeConfig(const Config& config);

}  // namespace tfring

#endif  // TFRING_CC_CONFIG_H_
