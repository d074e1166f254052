#include "cc/config.h"

#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

extern char** environ;

namespace tfring {
namespace {

// Warnings here go straight to stderr: logging itself depends on Config.
void WarnMalformed(const char* variable, const char* value, const char* expected) {
  std::fprintf(stderr,
               "[tfring WARNING] %s=%s is not %s; using the default. Set it to %s or "
               "unset it.\n",
               variable, value, expected, expected);
}

template <typename T>
std::string ToString(T value) {
  std::ostringstream out;
  out.precision(15);  // 1000000, not 1e+06
  out << value;
  return out.str();
}

template <typename T>
void WarnTooLarge(const char* variable, const char* value, T max) {
  const std::string limit = ToString(max);
  std::fprintf(stderr,
               "[tfring WARNING] %s=%s is above the largest value it takes, %s; using the "
               "default. Set it to at most %s or unset it.\n",
               variable, value, limit.c_str(), limit.c_str());
}

// `knob` is the TFRING_* name (it decides the names a value may use),
// `variable` the variable the text came from (named in warnings).
bool Parse(const char* knob, const char* variable, const char* text, int64_t max,
           int64_t* out) {
  if (std::strcmp(knob, "TFRING_LOG_LEVEL") == 0) {
    static const char* kNames[] = {"trace", "debug", "info", "warning", "error"};
    for (int i = 0; i < 5; ++i) {
      if (strcasecmp(text, kNames[i]) == 0) {
        *out = i;
        return true;
      }
    }
  }
  if (std::strcmp(knob, "TFRING_WIRE_COMPRESSION") == 0) {
    static const char* kNames[] = {"none", "bf16", "fp16"};
    for (int i = 0; i < 3; ++i) {
      if (strcasecmp(text, kNames[i]) == 0) {
        *out = i;
        return true;
      }
    }
    if (std::strspn(text, "0123456789") != std::strlen(text) || *text == '\0') {
      WarnMalformed(variable, text, "none, bf16 or fp16");
      return false;
    }
  }
  if (std::strcmp(knob, "TFRING_HIERARCHICAL_ALLREDUCE") == 0) {
    if (strcasecmp(text, "auto") == 0) {
      *out = kHierarchicalAuto;
      return true;
    }
    if (strcasecmp(text, "compressed") == 0) {
      *out = kHierarchicalCompressed;
      return true;
    }
    if (strcasecmp(text, "measured") == 0) {
      *out = kHierarchicalMeasured;
      return true;
    }
  }
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value < 0) {
    WarnMalformed(variable, text, "a non-negative integer");
    return false;
  }
  if (errno == ERANGE || value > max) {  // ERANGE: beyond even int64
    WarnTooLarge(variable, text, max);
    return false;
  }
  *out = value;
  return true;
}

bool Parse(const char*, const char* variable, const char* text, double max, double* out) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  // strtod also reads "nan" and "inf": neither is a length of time or a size.
  if (end == text || *end != '\0' || !std::isfinite(value) || value < 0) {
    WarnMalformed(variable, text, "a finite non-negative number");
    return false;
  }
  if (value > max) {
    WarnTooLarge(variable, text, max);
    return false;
  }
  *out = value;
  return true;
}

bool Parse(const char*, const char*, const char* text, const std::string&, std::string* out) {
  *out = text;
  return true;
}

// Horovod's value of `variable` as the text its knob takes; false when it
// changes nothing (a disabling switch at 0) or is malformed (warned).
bool Translate(const HorovodVariable& variable, const char* text, std::string* translated) {
  switch (variable.meaning) {
    case HorovodMeaning::kSwitch:
    case HorovodMeaning::kDisables: {
      char* end = nullptr;
      errno = 0;
      const long long value = std::strtoll(text, &end, 10);
      if (end == text || *end != '\0' || errno == ERANGE) {
        WarnMalformed(variable.name, text, "an integer (1 on, 0 off)");
        return false;
      }
      if (variable.meaning == HorovodMeaning::kSwitch) {
        *translated = value > 0 ? "1" : "0";
        return true;
      }
      if (value <= 0) return false;
      *translated = "0";
      return true;
    }
    case HorovodMeaning::kTimelinePath:
      // DYNAMIC: Horovod opens no file until start_timeline(), which tfring
      // always allows.
      *translated = std::strcmp(text, "DYNAMIC") == 0 ? "" : text;
      return true;
    case HorovodMeaning::kLogLevel:
      *translated = strcasecmp(text, "fatal") == 0 ? "error" : text;
      return true;
    default:
      *translated = text;
      return true;
  }
}

bool SetsKnob(const HorovodVariable& variable) {
  return variable.knob[0] != '\0';
}

// Reads knob `env` from its TFRING_* variable, else from the first of
// Horovod's names for it that is set and changes something.
template <typename T>
void ReadKnob(const char* env, T max, T* field, Config* config) {
  const char* text = std::getenv(env);
  bool parsed = false;
  T value{};
  if (text != nullptr) {
    config->set_by.emplace_back(env, env);
    parsed = Parse(env, env, text, max, &value);
    if (parsed) *field = value;
  }
  for (const HorovodVariable& alias : HorovodVariables()) {
    if (!SetsKnob(alias) || std::strcmp(alias.knob, env) != 0) continue;
    const char* horovod_text = std::getenv(alias.name);
    if (horovod_text == nullptr) continue;
    std::string translated;
    if (!Translate(alias, horovod_text, &translated)) continue;
    T alias_value{};
    const bool alias_parsed = Parse(env, alias.name, translated.c_str(), max, &alias_value);
    if (text != nullptr) {
      // TFRING_* wins; a different value in both is worth saying.
      if (parsed && alias_parsed && !(alias_value == value)) {
        config->environment_notes.push_back(
            std::string(env) + "=" + text + " and " + alias.name + "=" + horovod_text +
            " are both set and differ; tfring uses " + env + ". Unset " + alias.name +
            " (or give both the same value) to silence this warning.");
      }
      continue;
    }
    config->set_by.emplace_back(env, alias.name);
    if (alias_parsed) *field = alias_value;
    return;
  }
}

// One note naming every HOROVOD_* variable in the environment that tfring
// does not read, or nothing when there is none.
void NoteIgnoredHorovodVariables(Config* config) {
  std::vector<std::string> ignored, build_time;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string assignment = *entry;
    if (assignment.compare(0, 8, "HOROVOD_") != 0) continue;
    const std::string name = assignment.substr(0, assignment.find('='));
    const HorovodVariable* known = FindHorovodVariable(name);
    if (known == nullptr) {
      ignored.push_back(name + " (not a Horovod setting tfring knows)");
    } else if (known->meaning == HorovodMeaning::kIgnored) {
      ignored.push_back(name + " (" + known->note + ")");
    } else if (known->meaning == HorovodMeaning::kBuildTime) {
      build_time.push_back(name);
    }
  }
  if (ignored.empty() && build_time.empty()) return;
  std::sort(ignored.begin(), ignored.end());
  std::sort(build_time.begin(), build_time.end());
  std::string note = "tfring does not support these Horovod settings, which are set in the "
                     "environment: ";
  for (size_t i = 0; i < ignored.size(); ++i) note += (i ? "; " : "") + ignored[i];
  if (!build_time.empty()) {
    note += std::string(ignored.empty() ? "" : "; ") + "ignored: build-time setting: ";
    for (size_t i = 0; i < build_time.size(); ++i) note += (i ? ", " : "") + build_time[i];
  }
  note += ". tfring reads the HOROVOD_* variables that have a TFRING_* equivalent (the "
          "environment variables page lists them); unset the others to silence this warning.";
  config->environment_notes.push_back(note);
}

bool Matches(const char* pattern, const std::string& name) {
  const size_t length = std::strlen(pattern);
  if (length > 0 && pattern[length - 1] == '*') {
    return name.compare(0, length - 1, pattern, length - 1) == 0;
  }
  return name == pattern;
}

const char* TypeName(int64_t) { return "integer"; }
const char* TypeName(double) { return "number"; }
const char* TypeName(const std::string&) { return "text"; }

}  // namespace

const std::vector<HorovodVariable>& HorovodVariables() {
  using M = HorovodMeaning;
  static const auto* variables = new std::vector<HorovodVariable>{
      {"HOROVOD_FUSION_THRESHOLD", "TFRING_FUSION_THRESHOLD", M::kSame, "bytes"},
      {"HOROVOD_CYCLE_TIME", "TFRING_CYCLE_TIME", M::kSame, "milliseconds"},
      {"HOROVOD_CACHE_CAPACITY", "TFRING_CACHE_CAPACITY", M::kSame, "tensors"},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "TFRING_HIERARCHICAL_ALLREDUCE", M::kSwitch,
       "1 on, 0 off"},
      // Before the stall time: in Horovod the switch wins over it.
      {"HOROVOD_STALL_CHECK_DISABLE", "TFRING_STALL_CHECK_TIME_SECONDS", M::kDisables,
       "1 sets TFRING_STALL_CHECK_TIME_SECONDS to 0 (no stall warning)"},
      {"HOROVOD_STALL_CHECK_TIME_SECONDS", "TFRING_STALL_CHECK_TIME_SECONDS", M::kSame,
       "seconds"},
      {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "TFRING_STALL_SHUTDOWN_TIME_SECONDS", M::kSame,
       "seconds; 0 never, as in Horovod (unset, tfring's default applies)"},
      {"HOROVOD_LOG_LEVEL", "TFRING_LOG_LEVEL", M::kLogLevel,
       "trace, debug, info, warning or error; fatal is read as error"},
      {"HOROVOD_TIMELINE", "TFRING_TIMELINE", M::kTimelinePath,
       "a file; DYNAMIC: no file until start_timeline()"},
      {"HOROVOD_TIMELINE_MARK_CYCLES", "TFRING_TIMELINE_MARK_CYCLES", M::kSwitch,
       "1 on, 0 off"},
      {"HOROVOD_AUTOTUNE", "TFRING_AUTOTUNE", M::kSwitch, "1 on, 0 off"},
      {"HOROVOD_AUTOTUNE_LOG", "TFRING_AUTOTUNE_LOG", M::kSame, "a CSV file"},
      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "TFRING_AUTOTUNE_WARMUP_SAMPLES", M::kSame,
       "samples"},
      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "TFRING_AUTOTUNE_CYCLES_PER_SAMPLE", M::kSame,
       "cycles"},
      {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "TFRING_AUTOTUNE_MAX_TRIALS", M::kSame,
       "trials"},
      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "TFRING_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
       M::kSame, "relative noise (Horovod's default is 0.8, tfring's 0.3)"},
      {"HOROVOD_DYNAMIC_PROCESS_SETS", "", M::kReadByPython,
       "1: init() starts with dynamic process sets, as init(process_sets=\"dynamic\")"},
      {"HOROVOD_ENABLE_XLA_OPS", "", M::kAlreadySo,
       "tfring's allreduce, reducescatter and broadcast always compile under jit_compile=True"},
      {"HOROVOD_LOG_HIDE_TIME", "", M::kAlreadySo, "tfring's log lines carry no time"},
      {"HOROVOD_HIERARCHICAL_ALLGATHER", "", M::kIgnored,
       "tfring has no hierarchical allgather"},
      {"HOROVOD_TORUS_ALLREDUCE", "", M::kIgnored, "tfring has no torus allreduce"},
      {"HOROVOD_THREAD_AFFINITY", "", M::kIgnored,
       "tfring does not pin its background thread; TFRING_CPU_BINDING=1 binds each rank to "
       "its share of the host's CPUs"},
      {"HOROVOD_MPI_THREADS_DISABLE", "", M::kIgnored,
       "tfring always needs MPI_THREAD_MULTIPLE"},
      {"HOROVOD_CPU_OPERATIONS", "", M::kIgnored,
       "tfring moves data through MPI and shared memory only"},
      {"HOROVOD_CONTROLLER", "", M::kIgnored,
       "tfring negotiates through MPI and shared memory only"},
      {"HOROVOD_CCL_CACHE", "", M::kIgnored, "tfring has no oneCCL operations"},
      {"HOROVOD_GLOO_*", "", M::kIgnored,
       "tfring has no Gloo; tfringrun --network-interface chooses the interfaces"},
      {"HOROVOD_ELASTIC*", "", M::kIgnored, "tfring has no elastic training"},
      {"HOROVOD_SPARK_*", "", M::kIgnored, "tfring has no Spark integration"},
      {"HOROVOD_ADASUM_MPI_CHUNK_SIZE", "", M::kIgnored, "tfring has no Adasum"},
      {"HOROVOD_DISABLE_GROUP_FUSION", "", M::kIgnored,
       "tfring always fuses a group's tensors together"},
      {"HOROVOD_NUM_NCCL_STREAMS", "", M::kIgnored, "tfring has no GPU operations"},
      {"HOROVOD_BATCH_D2D_MEMCOPIES", "", M::kIgnored, "tfring has no GPU operations"},
      {"HOROVOD_DISABLE_NVTX_RANGES", "", M::kIgnored, "tfring has no GPU operations"},
      {"HOROVOD_ENABLE_ASYNC_COMPLETION", "", M::kIgnored, "tfring has no GPU operations"},
      {"HOROVOD_RANK", "", M::kIgnored, "set by horovodrun; tfring takes ranks from MPI"},
      {"HOROVOD_SIZE", "", M::kIgnored, "set by horovodrun; tfring takes ranks from MPI"},
      {"HOROVOD_LOCAL_RANK", "", M::kIgnored, "set by horovodrun; tfring takes ranks from MPI"},
      {"HOROVOD_LOCAL_SIZE", "", M::kIgnored, "set by horovodrun; tfring takes ranks from MPI"},
      {"HOROVOD_CROSS_RANK", "", M::kIgnored, "set by horovodrun; tfring takes ranks from MPI"},
      {"HOROVOD_CROSS_SIZE", "", M::kIgnored, "set by horovodrun; tfring takes ranks from MPI"},
      {"HOROVOD_HOSTNAME", "", M::kIgnored, "set by horovodrun; tfring takes ranks from MPI"},
      {"HOROVOD_SECRET_KEY", "", M::kIgnored, "horovodrun's; tfringrun does not use it"},
      {"HOROVOD_START_TIMEOUT", "", M::kIgnored, "horovodrun's; tfringrun does not use it"},
      {"HOROVOD_WITH_*", "", M::kBuildTime, "selects what Horovod's build includes"},
      {"HOROVOD_WITHOUT_*", "", M::kBuildTime, "selects what Horovod's build includes"},
      {"HOROVOD_GPU*", "", M::kBuildTime, "Horovod's GPU build"},
      {"HOROVOD_NCCL_*", "", M::kBuildTime, "Horovod's GPU build"},
      {"HOROVOD_CUDA_HOME", "", M::kBuildTime, "Horovod's GPU build"},
      {"HOROVOD_ROCM_HOME", "", M::kBuildTime, "Horovod's GPU build"},
      {"HOROVOD_NVTX_INCLUDE", "", M::kBuildTime, "Horovod's GPU build"},
      {"HOROVOD_ALLOW_MIXED_GPU_IMPL", "", M::kBuildTime, "Horovod's GPU build"},
      {"HOROVOD_BUILD_*", "", M::kBuildTime, "Horovod's compiler flags"},
      {"HOROVOD_CMAKE", "", M::kBuildTime, "Horovod's build tool"},
      {"HOROVOD_DEBUG", "", M::kBuildTime, "Horovod's debug build"},
      {"HOROVOD_SKIP_COMPILE", "", M::kBuildTime, "Horovod's build"},
      {"HOROVOD_LOCAL_VERSION", "", M::kBuildTime, "Horovod's build"},
      {"HOROVOD_CPU_OPERATIONS_DEFAULT", "", M::kBuildTime, "Horovod's build"},
      {"HOROVOD_CONTROLLER_DEFAULT", "", M::kBuildTime, "Horovod's build"},
  };
  return *variables;
}

const HorovodVariable* FindHorovodVariable(const std::string& name) {
  // Exact names first, so HOROVOD_CPU_OPERATIONS_DEFAULT is not read as a
  // member of a family.
  for (const HorovodVariable& variable : HorovodVariables()) {
    if (name == variable.name) return &variable;
  }
  for (const HorovodVariable& variable : HorovodVariables()) {
    if (Matches(variable.name, name)) return &variable;
  }
  return nullptr;
}

Config Config::FromEnvironment() {
  Config config;
#define TFRING_READ_FIELD(type, field, env, def, max, scope, doc) \
  ReadKnob<type>(env, static_cast<type>(max), &config.field, &config);
  TFRING_CONFIG_KNOBS(TFRING_READ_FIELD)
#undef TFRING_READ_FIELD
  NoteIgnoredHorovodVariables(&config);
  return config;
}

bool Config::SetInEnvironment(const std::string& env) const {
  return !SetBy(env).empty();
}

std::string Config::SetBy(const std::string& env) const {
  for (const auto& [knob, variable] : set_by) {
    if (knob == env) return variable;
  }
  return "";
}

const Config& Config::Get() {
  static const Config* config = new Config(FromEnvironment());
  return *config;
}

std::vector<ConfigEntry> DescribeConfig(const Config& config) {
  std::vector<ConfigEntry> entries;
  auto horovod_names = [](const char* env) {
    std::vector<std::string> names;
    for (const HorovodVariable& variable : HorovodVariables()) {
      if (SetsKnob(variable) && std::strcmp(variable.knob, env) == 0) {
        names.push_back(variable.name);
      }
    }
    return names;
  };
#define TFRING_DESCRIBE_FIELD(type, field, env, def, max, scope, doc)                          \
  entries.push_back({env, TypeName(config.field), ToString(config.field),                    \
                     ToString(static_cast<type>(def)),                                         \
                     ToString(static_cast<type>(max)), doc, KnobScope::scope, config.SetBy(env), \
                     horovod_names(env)});
  TFRING_CONFIG_KNOBS(TFRING_DESCRIBE_FIELD)
#undef TFRING_DESCRIBE_FIELD
  return entries;
}

}  // namespace tfring
