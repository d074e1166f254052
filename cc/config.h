// Every tunable of the core, declared once: type, field, environment
// variable, default, largest value, and the line of documentation users see;
// and Horovod's names for them (HorovodVariables below).
//
// Why one table: the knobs are read in one place at start-up, typed and
// validated there, and listed by tfring._core.config() for users and docs.
// Nothing else in the core calls getenv.
#ifndef TFRING_CC_CONFIG_H_
#define TFRING_CC_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cc/common.h"

namespace tfring {

// TFRING_HIERARCHICAL_ALLREDUCE=auto, =compressed and =measured (the default).
constexpr int64_t kHierarchicalAuto = 2;
constexpr int64_t kHierarchicalCompressed = 3;
constexpr int64_t kHierarchicalMeasured = 4;

// The largest TFRING_SHM_BYTES (1 TiB): only two chunks of at most 512 KiB of
// a slot are ever used, so this only keeps the segment's size arithmetic far
// from overflow; a slot bigger than /dev/shm fails at creation and the ranks
// fall back to MPI.
constexpr int64_t kLargestShmBytes = int64_t{1} << 40;
// The largest TFRING_CYCLE_TIME, in milliseconds (also the autotuner's start).
constexpr double kLargestCycleTimeMs = 60000.0;

// X(type, field, ENV_NAME, default, max, scope, doc)
//
// max: the largest value the knob takes. Sizes the core derives from a knob
// (segments, buffers, the cache's bit vector, durations in nanoseconds) stay
// far from overflow below it; a value above it is refused like a malformed
// one. Strings have no bound ("").
//
// scope: kJob knobs change which collective calls the ranks make, or their
// sizes (fusion, the cache's bit vector), or are decided by rank 0 alone
// (stall inspection): at init every rank adopts rank 0's value, so a job
// launched without forwarding a variable to every rank (plain mpirun without
// -x, srun) still makes matching calls. kProcess knobs only affect this
// process and may differ between ranks.
#define TFRING_CONFIG_KNOBS(X)                                                  \
  X(int64_t, fusion_threshold, "TFRING_FUSION_THRESHOLD", 128LL * 1024 * 1024, int64_t{1} << 36, kJob,  \
    "Bytes of the fusion buffer; allreduces of one dtype and op are packed "    \
    "into it up to this size (on shared memory they need no buffer). 0 "       \
    "disables fusion.")                                                        \
  X(double, cycle_time_ms, "TFRING_CYCLE_TIME", 1.0, kLargestCycleTimeMs, kProcess,                            \
    "Milliseconds between negotiation rounds when no new work wakes the "      \
    "background thread earlier. On shared memory idle ranks run no rounds; a " \
    "rank waiting for them calls them after a millisecond.")                  \
  X(int64_t, cache_capacity, "TFRING_CACHE_CAPACITY", 1024, int64_t{1} << 16, kJob,                     \
    "Negotiated tensors remembered so later steps agree with one bitwise "     \
    "allreduce instead of a gather and broadcast. 0 disables the cache.")      \
  X(int64_t, direct_threshold, "TFRING_DIRECT_THRESHOLD", 1024 * 1024, int64_t{1} << 40, kJob,          \
    "Allreduces of at least this many bytes skip the fusion buffer and go "    \
    "straight from input to output (no copies).")                              \
  X(int64_t, shm, "TFRING_SHM", 1, 1, kJob,                                                 \
    "1: ranks that share one host move data and negotiate through one shared-memory "     \
    "segment instead of MPI. 0: MPI only.")                                                \
  X(int64_t, shm_bytes, "TFRING_SHM_BYTES", 1024 * 1024, kLargestShmBytes, kJob,                            \
    "Bytes of each rank's slot in the shared-memory segment (the segment holds one per "  \
    "local rank, in /dev/shm). Data moves through two chunks of it of at most 512 KiB "  \
    "each; a smaller slot means smaller chunks, a larger one gains nothing.")             \
  X(int64_t, cpu_binding, "TFRING_CPU_BINDING", 0, 1, kJob,                                  \
    "0 (default): ranks stay as launched. 1: where a host's ranks may all run on the same " \
    "CPUs (nobody bound them one by one) and there are at least as many CPUs as ranks, "   \
    "each rank binds all its threads to its own contiguous share of them at init (whole "  \
    "cores first). Helps only programs that size TensorFlow's thread pools to the share " \
    "(e.g. one intra-op thread per rank per core); TensorFlow's default pools, sized for " \
    "the whole machine, then crowd onto the share.")                                      \
  X(double, shm_timeout_s, "TFRING_SHM_TIMEOUT_SECONDS", 30.0, 1e6, kJob,                       \
    "Seconds a rank waits for a live peer inside a shared-memory data operation before "  \
    "the job fails; a peer that exited is noticed within milliseconds.")                   \
  X(int64_t, hierarchical_allreduce, "TFRING_HIERARCHICAL_ALLREDUCE", kHierarchicalMeasured, kHierarchicalMeasured, kJob, \
    "When the ranks span hosts with the same number (two or more) on each: 1 reduces "    \
    "every allreduce inside each host, then across hosts one slice per local rank, then " \
    "gathers inside the host; auto (or 2) only allreduces of at least "                    \
    "TFRING_HIERARCHICAL_THRESHOLD bytes; compressed (or 3) only allreduces with wire "   \
    "compression, which then encode nothing inside the host; measured (or 4, default) "   \
    "those too, and uncompressed allreduces of at least TFRING_HIERARCHICAL_THRESHOLD "    \
    "bytes take whichever of the flat and hierarchical paths was faster in the job's "    \
    "first TFRING_HIERARCHICAL_TRIALS of each (the faster one depends on the links); 0 "  \
    "never: wire-compressed allreduces then encode every rank's data among all ranks.")   \
  X(int64_t, hierarchical_trials, "TFRING_HIERARCHICAL_TRIALS", 16, 1 << 20, kJob,           \
    "With TFRING_HIERARCHICAL_ALLREDUCE=measured: how many uncompressed allreduces of at " \
    "least TFRING_HIERARCHICAL_THRESHOLD bytes are timed on each path (after two of "     \
    "each to warm up) before the ranks agree on the faster one.")                          \
  X(int64_t, hierarchical_threshold, "TFRING_HIERARCHICAL_THRESHOLD", 256 * 1024, int64_t{1} << 40, kJob,    \
    "With TFRING_HIERARCHICAL_ALLREDUCE=auto or measured: allreduces (fused batches or "  \
    "single tensors) of at least this many bytes may take the hierarchical path; "        \
    "smaller ones stay flat.")                                                            \
  X(int64_t, wire_compression, "TFRING_WIRE_COMPRESSION", 0, 2, kJob,                        \
    "How float32 Sum/Average allreduces cross hosts when the script asks for no "         \
    "compression: none (or 0, default) as float32; bf16 (1) as bfloat16; fp16 (2) as "     \
    "float16 scaled per block so it cannot overflow. Ranks of one host always reduce in "  \
    "float32 and arrivals are summed in float32; one host gives the uncompressed result.") \
  X(int64_t, output_pool_bytes, "TFRING_OUTPUT_POOL_BYTES", 512LL * 1024 * 1024, int64_t{1} << 40, kProcess,     \
    "At most this many bytes of freed collective outputs are kept for reuse, "   \
    "so each step's large outputs do not pay for fresh pages; the least "        \
    "recently freed go first, and sizes not asked for again within about two "   \
    "steps are released. 0 disables reuse.")                                     \
  X(double, stall_check_time_s, "TFRING_STALL_CHECK_TIME_SECONDS", 60.0, 1e6, kJob,        \
    "Seconds a tensor may wait for other ranks before rank 0 warns which "     \
    "ranks are missing it. 0 disables the warning.")                           \
  X(double, stall_shutdown_time_s, "TFRING_STALL_SHUTDOWN_TIME_SECONDS", 1800.0, 1e6, kJob, \
    "Seconds a tensor may wait for other ranks before every rank's pending "   \
    "collectives fail with an error naming what each rank waits on (default "  \
    "30 minutes). 0 waits forever.")                                           \
  X(int64_t, log_level, "TFRING_LOG_LEVEL", 3, 4, kProcess,                                  \
    "0 trace, 1 debug, 2 info, 3 warning, 4 error (names also accepted).")                  \
  X(std::string, timeline, "TFRING_TIMELINE", "", "", kProcess,                                \
    "Rank 0 records a timeline of every collective into this file (Chrome trace-event "   \
    "JSON; python -m tfring.timeline FILE summarises it). Empty: no timeline.")           \
  X(int64_t, timeline_mark_cycles, "TFRING_TIMELINE_MARK_CYCLES", 0, 1, kProcess,           \
    "1: the timeline also marks each background-loop cycle that ran collectives.")         \
  X(int64_t, autotune, "TFRING_AUTOTUNE", 0, 1, kProcess,                                     \
    "1: rank 0 tunes the fusion threshold, direct threshold and cycle time online "        \
    "(Bayesian optimisation of measured throughput) and announces its choice to every "   \
    "rank; knobs set in rank 0's environment stay fixed. Rank 0's value decides.")         \
  X(std::string, autotune_log, "TFRING_AUTOTUNE_LOG", "", "", kProcess,                        \
    "CSV file where rank 0's autotuner records every trial.")                              \
  X(std::string, autotune_start, "TFRING_AUTOTUNE_START", "", "", kProcess,                    \
    "Where the autotuner's first trial starts instead of the defaults, e.g. "              \
    "\"fusion_threshold=65536,direct_threshold=1048576,cycle_time=1\" (any subset). "      \
    "Unlike the knobs themselves, these values are not fixed.")                             \
  X(int64_t, autotune_warmup_samples, "TFRING_AUTOTUNE_WARMUP_SAMPLES", 3, 1000000, kProcess,       \
    "Samples the autotuner discards at the start (tracing, first steps).")                 \
  X(int64_t, autotune_cycles_per_sample, "TFRING_AUTOTUNE_CYCLES_PER_SAMPLE", 10, 1000000, kProcess, \
    "Cycles that moved data per autotuner sample.")                                        \
  X(int64_t, autotune_samples_per_trial, "TFRING_AUTOTUNE_SAMPLES_PER_TRIAL", 3, 10000, kProcess, \
    "Samples per trial (its score is their median).")                                      \
  X(int64_t, autotune_max_trials, "TFRING_AUTOTUNE_MAX_TRIALS", 20, 1000, kProcess,              \
    "Trials before the autotuner settles on the best and stops.")                          \
  X(double, autotune_noise, "TFRING_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", 0.3, 100.0, kProcess,       \
    "Noise the autotuner's Gaussian process assumes, relative to the spread of the "       \
    "scores; higher explores more.")

struct Config {
#define TFRING_DECLARE_FIELD(type, field, env, def, max, scope, doc) type field = def;
  TFRING_CONFIG_KNOBS(TFRING_DECLARE_FIELD)
#undef TFRING_DECLARE_FIELD

  // This process's configuration, read from the environment on first use.
  // Process-scope knobs (logging, the output pool) come from here; a running
  // job's collectives use the configuration agreed at init (EffectiveConfig
  // in api.h).
  TFRING_EXPORT static const Config& Get();
  // Reads every knob from the environment, from its TFRING_* variable or,
  // when that is not set, from Horovod's name for it; a malformed value, a
  // non-finite number or one above the knob's largest keeps the default and
  // logs a warning naming the variable.
  static Config FromEnvironment();

  // For each knob set in the environment this configuration was read from:
  // its TFRING_* name and the variable it was read from (that name, or a
  // HOROVOD_* one; also when the value was refused and the default kept).
  // The autotuner leaves these knobs fixed.
  std::vector<std::pair<std::string, std::string>> set_by;
  bool SetInEnvironment(const std::string& env) const;
  // The variable knob `env` was read from, or "" when none was set.
  std::string SetBy(const std::string& env) const;

  // What reading the environment found that the user should hear once per
  // job (rank 0 logs it at its first init): a TFRING_* variable and its
  // HOROVOD_* name set to different values, HOROVOD_* variables tfring does
  // not read.
  std::vector<std::string> environment_notes;
};

// Horovod's environment variables. Job files written for Horovod
// (Kubernetes manifests, Slurm scripts, horovodrun -x) set HOROVOD_*; each
// one with a tfring equivalent is read as that knob when the knob's TFRING_*
// variable is not set (TFRING_* wins; both set to different values is
// reported), the rest are reported as ignored, with the reason.
enum class HorovodMeaning {
  kSame,           // the value the TFRING_* variable takes, in the same unit
  kSwitch,         // Horovod's switch: an integer above 0 is 1, 0 is 0
  kDisables,       // an integer above 0 sets the knob to 0; 0 changes nothing
  kTimelinePath,   // a file, or DYNAMIC: no file until start_timeline()
  kLogLevel,       // Horovod's level names; fatal is read as error
  kReadByPython,   // read by tfring.init() (tfring/process_sets.py)
  kAlreadySo,      // what the variable asks for is what tfring always does
  kIgnored,        // no tfring equivalent
  kBuildTime,      // a setting of Horovod's build
};

struct HorovodVariable {
  // The variable, or a family of them: a name ending in '*' stands for every
  // name that starts with what precedes the '*'.
  const char* name;
  // The TFRING_* knob it sets (kSame .. kLogLevel), else "".
  const char* knob;
  HorovodMeaning meaning;
  // What it does in tfring, or why it is ignored (docs and warnings).
  const char* note;
};

// Every HOROVOD_* variable tfring knows, knobs first.
TFRING_EXPORT const std::vector<HorovodVariable>& HorovodVariables();
// The entry of HorovodVariables() that covers `name`, or null.
TFRING_EXPORT const HorovodVariable* FindHorovodVariable(const std::string& name);

enum class KnobScope { kJob, kProcess };

struct ConfigEntry {
  std::string env_name;
  std::string type;  // "integer", "number" or "text"
  std::string value;
  std::string default_value;
  std::string maximum;  // "" for strings
  std::string doc;
  KnobScope scope = KnobScope::kProcess;
  std::string set_by;   // the variable the value was read from, "" if none was set
  std::vector<std::string> horovod_names;  // Horovod's variables for this knob
};

// The effective configuration, one entry per knob, for tfring._core.config().
TFRING_EXPORT std::vector<ConfigEntry> DescribeConfig(const Config& config);

}  // namespace tfring

#endif  // TFRING_CC_CONFIG_H_
