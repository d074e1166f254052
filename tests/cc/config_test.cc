// Tests of the knob table (cc/config.h): reading TFRING_* and Horovod's
// HOROVOD_* variables from the environment, in one process.
//
// What: every knob's largest value is accepted and the next one up refused
// (with a warning naming the variable), including values beyond int64 that
// strtoll reports as ERANGE; numbers that are not finite are refused; each of
// Horovod's names for a knob sets it in Horovod's units and values, TFRING_*
// wins over it with one note when the two differ; HOROVOD_* variables tfring
// does not read are named in one note, build-time ones apart.
//
// Usage: config_test <scenario|all|list>. Prints "PASS <scenario>" or
// "FAIL <scenario>: why". Driven from tests/test_config.py.

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cc/config.h"
#include "tests/cc/expect.h"

extern char** environ;

namespace tfring {
namespace testing {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Removes every TFRING_* and HOROVOD_* variable, so each scenario starts
// from the defaults whatever the caller's environment holds.
void ClearSettings() {
  std::vector<std::string> names;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string assignment = *entry;
    if (assignment.rfind("TFRING_", 0) == 0 || assignment.rfind("HOROVOD_", 0) == 0) {
      names.push_back(assignment.substr(0, assignment.find('=')));
    }
  }
  for (const std::string& name : names) unsetenv(name.c_str());
}

// Config::FromEnvironment(), and what it wrote to stderr.
Config Read(std::string* warnings) {
  char path[] = "/tmp/tfring_config_test_XXXXXX";
  const int file = mkstemp(path);
  EXPECT_TRUE(file >= 0, "mkstemp");
  std::fflush(stderr);
  const int saved = dup(2);
  dup2(file, 2);
  close(file);
  Config config = Config::FromEnvironment();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  *warnings = text.str();
  return config;
}

ConfigEntry Entry(const Config& config, const std::string& env) {
  for (const ConfigEntry& entry : DescribeConfig(config)) {
    if (entry.env_name == env) return entry;
  }
  throw TestFailure{"no knob " + env};
}

// Each knob at its largest value: taken. One above it, and values beyond
// what int64 holds (strtoll's ERANGE; before, LLONG_MAX was taken and
// TFRING_SHM_BYTES of it crashed every rank): the default, and a warning
// naming the variable and the largest value.
void EveryKnobHasABound() {
  int bounded = 0;
  for (const ConfigEntry& knob : DescribeConfig(Config())) {
    if (knob.type == "text") continue;
    ++bounded;
    const bool integer = knob.type == "integer";
    ClearSettings();
    setenv(knob.env_name.c_str(), knob.maximum.c_str(), 1);
    std::string warnings;
    Config config = Read(&warnings);
    EXPECT_TRUE(Entry(config, knob.env_name).value == knob.maximum && warnings.empty(),
                knob.env_name << "=" << knob.maximum << " read as "
                              << Entry(config, knob.env_name).value << "; " << warnings);
    std::vector<std::string> above;
    if (integer) {
      above = {std::to_string(std::stoll(knob.maximum) + 1), "9223372036854775807",
               "99999999999999999999"};
    } else {
      above = {std::to_string(std::stod(knob.maximum) * 2), "1e300"};
    }
    for (const std::string& value : above) {
      ClearSettings();
      setenv(knob.env_name.c_str(), value.c_str(), 1);
      config = Read(&warnings);
      const ConfigEntry read = Entry(config, knob.env_name);
      EXPECT_TRUE(read.value == knob.default_value,
                  knob.env_name << "=" << value << " read as " << read.value);
      EXPECT_TRUE(Contains(warnings, knob.env_name + "=" + value +
                                         " is above the largest value it takes, " +
                                         knob.maximum) &&
                      Contains(warnings, "Set it to at most " + knob.maximum),
                  knob.env_name << "=" << value << ": " << warnings);
    }
  }
  EXPECT_TRUE(bounded >= 20, bounded << " knobs with a bound");
  ClearSettings();
}

// TFRING_WIRE_COMPRESSION takes its names in any case, or their numbers;
// anything else keeps the default (none) with a warning.
void WireCompressionNames() {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"none", "0"}, {"bf16", "1"}, {"FP16", "2"}, {"2", "2"}};
  for (const auto& [text, value] : cases) {
    ClearSettings();
    setenv("TFRING_WIRE_COMPRESSION", text.c_str(), 1);
    std::string warnings;
    const Config config = Read(&warnings);
    EXPECT_TRUE(Entry(config, "TFRING_WIRE_COMPRESSION").value == value && warnings.empty(),
                text << " read as " << Entry(config, "TFRING_WIRE_COMPRESSION").value << "; "
                     << warnings);
  }
  ClearSettings();
  setenv("TFRING_WIRE_COMPRESSION", "int8", 1);
  std::string warnings;
  const Config config = Read(&warnings);
  EXPECT_TRUE(config.wire_compression == 0 && Contains(warnings, "TFRING_WIRE_COMPRESSION=int8 is not none, bf16 or fp16"),
              warnings);
  ClearSettings();
}

// nan and inf are refused (before, nan passed the `value < 0` check, and
// the ranks then reported "nan on this rank but nan on rank 0").
void NonFiniteNumbersAreRefused() {
  int doubles = 0;
  for (const ConfigEntry& knob : DescribeConfig(Config())) {
    if (knob.type != "number") continue;
    ++doubles;
    for (const char* value : {"nan", "NaN", "inf", "-inf", "infinity", "1e999"}) {
      ClearSettings();
      setenv(knob.env_name.c_str(), value, 1);
      std::string warnings;
      const Config config = Read(&warnings);
      EXPECT_TRUE(Entry(config, knob.env_name).value == knob.default_value,
                  knob.env_name << "=" << value << " read as "
                                << Entry(config, knob.env_name).value);
      EXPECT_TRUE(Contains(warnings, knob.env_name + "=" + value +
                                         " is not a finite non-negative number"),
                  knob.env_name << "=" << value << ": " << warnings);
    }
  }
  EXPECT_TRUE(doubles >= 5, doubles << " knobs of type double");
  ClearSettings();
}

struct AliasCase {
  std::string horovod;  // variable
  std::string value;    // set to
  std::string knob;     // TFRING_* knob
  std::string expected;  // the knob's value after reading
};

// Horovod's values as a Horovod job file writes them.
const std::vector<AliasCase>& AliasCases() {
  static const auto* cases = new std::vector<AliasCase>{
      {"HOROVOD_FUSION_THRESHOLD", "33554432", "TFRING_FUSION_THRESHOLD", "33554432"},
      {"HOROVOD_CYCLE_TIME", "2.5", "TFRING_CYCLE_TIME", "2.5"},
      {"HOROVOD_CACHE_CAPACITY", "0", "TFRING_CACHE_CAPACITY", "0"},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "1", "TFRING_HIERARCHICAL_ALLREDUCE", "1"},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "2", "TFRING_HIERARCHICAL_ALLREDUCE", "1"},
      {"HOROVOD_STALL_CHECK_DISABLE", "1", "TFRING_STALL_CHECK_TIME_SECONDS", "0"},
      {"HOROVOD_STALL_CHECK_TIME_SECONDS", "30", "TFRING_STALL_CHECK_TIME_SECONDS", "30"},
      {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0", "TFRING_STALL_SHUTDOWN_TIME_SECONDS", "0"},
      {"HOROVOD_LOG_LEVEL", "debug", "TFRING_LOG_LEVEL", "1"},
      {"HOROVOD_LOG_LEVEL", "FATAL", "TFRING_LOG_LEVEL", "4"},
      {"HOROVOD_TIMELINE", "DYNAMIC", "TFRING_TIMELINE", ""},
      {"HOROVOD_TIMELINE", "/data/timeline.json", "TFRING_TIMELINE", "/data/timeline.json"},
      {"HOROVOD_TIMELINE_MARK_CYCLES", "1", "TFRING_TIMELINE_MARK_CYCLES", "1"},
      {"HOROVOD_AUTOTUNE", "1", "TFRING_AUTOTUNE", "1"},
      {"HOROVOD_AUTOTUNE_LOG", "/data/tune.csv", "TFRING_AUTOTUNE_LOG", "/data/tune.csv"},
      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "5", "TFRING_AUTOTUNE_WARMUP_SAMPLES", "5"},
      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "11", "TFRING_AUTOTUNE_CYCLES_PER_SAMPLE", "11"},
      {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "30", "TFRING_AUTOTUNE_MAX_TRIALS", "30"},
      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.8",
       "TFRING_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.8"},
  };
  return *cases;
}

// Each of Horovod's names sets its knob, and says so in set_by; the knob
// counts as set (the autotuner leaves it alone). Every name of the table
// has a case here.
void HorovodNamesSetKnobs() {
  for (const AliasCase& c : AliasCases()) {
    ClearSettings();
    setenv(c.horovod.c_str(), c.value.c_str(), 1);
    std::string warnings;
    const Config config = Read(&warnings);
    const ConfigEntry entry = Entry(config, c.knob);
    EXPECT_TRUE(entry.value == c.expected, c.horovod << "=" << c.value << ": " << c.knob
                                                     << " is '" << entry.value << "', expected '"
                                                     << c.expected << "'");
    EXPECT_TRUE(entry.set_by == c.horovod && config.SetInEnvironment(c.knob),
                c.horovod << ": set_by '" << entry.set_by << "'");
    EXPECT_TRUE(warnings.empty() && config.environment_notes.empty(),
                c.horovod << "=" << c.value << " warned: " << warnings);
  }
  for (const HorovodVariable& variable : HorovodVariables()) {
    if (variable.knob[0] == '\0') continue;
    bool tested = false;
    for (const AliasCase& c : AliasCases()) tested |= c.horovod == variable.name;
    EXPECT_TRUE(tested, variable.name << " has no case here");
    const ConfigEntry entry = Entry(Config(), variable.knob);
    bool listed = false;
    for (const std::string& name : entry.horovod_names) listed |= name == variable.name;
    EXPECT_TRUE(listed, variable.knob << " does not list " << variable.name);
  }
  // The disabling switch at 0 changes nothing; in Horovod it wins over the
  // time when on.
  ClearSettings();
  setenv("HOROVOD_STALL_CHECK_DISABLE", "0", 1);
  setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "45", 1);
  std::string warnings;
  Config config = Read(&warnings);
  EXPECT_TRUE(config.stall_check_time_s == 45 &&
                  config.SetBy("TFRING_STALL_CHECK_TIME_SECONDS") ==
                      "HOROVOD_STALL_CHECK_TIME_SECONDS",
              "stall check " << config.stall_check_time_s);
  setenv("HOROVOD_STALL_CHECK_DISABLE", "1", 1);
  config = Read(&warnings);
  EXPECT_TRUE(config.stall_check_time_s == 0, "stall check " << config.stall_check_time_s);
  // Malformed and out-of-range Horovod values are refused like TFRING_* ones.
  ClearSettings();
  setenv("HOROVOD_AUTOTUNE", "yes", 1);
  setenv("HOROVOD_FUSION_THRESHOLD", "9223372036854775807", 1);
  config = Read(&warnings);
  EXPECT_TRUE(config.autotune == 0 && Contains(warnings, "HOROVOD_AUTOTUNE=yes is not an integer"),
              warnings);
  EXPECT_TRUE(config.fusion_threshold == Config().fusion_threshold &&
                  Contains(warnings, "HOROVOD_FUSION_THRESHOLD=9223372036854775807 is above"),
              warnings);
  ClearSettings();
}

// Both names set: TFRING_* wins; different values give one note naming both
// variables and values, the same value none.
void TfringWinsOverHorovod() {
  ClearSettings();
  setenv("TFRING_FUSION_THRESHOLD", "1048576", 1);
  setenv("HOROVOD_FUSION_THRESHOLD", "2097152", 1);
  setenv("TFRING_CYCLE_TIME", "2", 1);
  setenv("HOROVOD_CYCLE_TIME", "2.0", 1);  // the same number
  std::string warnings;
  const Config config = Read(&warnings);
  EXPECT_TRUE(config.fusion_threshold == 1048576 &&
                  config.SetBy("TFRING_FUSION_THRESHOLD") == "TFRING_FUSION_THRESHOLD",
              "fusion threshold " << config.fusion_threshold);
  EXPECT_TRUE(config.cycle_time_ms == 2.0, "cycle time " << config.cycle_time_ms);
  EXPECT_TRUE(config.environment_notes.size() == 1, config.environment_notes.size() << " notes");
  const std::string& note = config.environment_notes[0];
  EXPECT_TRUE(Contains(note, "TFRING_FUSION_THRESHOLD=1048576 and "
                             "HOROVOD_FUSION_THRESHOLD=2097152 are both set and differ; tfring "
                             "uses TFRING_FUSION_THRESHOLD") &&
                  Contains(note, "Unset HOROVOD_FUSION_THRESHOLD"),
              note);
  ClearSettings();
}

// HOROVOD_* variables tfring does not read: one note naming each with its
// reason (an unknown name too), build-time settings listed as such; the
// ones tfring reads, or that ask for what tfring always does, are not in it.
void UnsupportedHorovodVariablesAreNamed() {
  ClearSettings();
  std::string warnings;
  EXPECT_TRUE(Read(&warnings).environment_notes.empty(), "notes without any setting");
  setenv("HOROVOD_THREAD_AFFINITY", "0,1", 1);
  setenv("HOROVOD_HIERARCHICAL_ALLGATHER", "1", 1);
  setenv("HOROVOD_NOT_A_SETTING", "1", 1);
  setenv("HOROVOD_WITH_PYTORCH", "1", 1);
  setenv("HOROVOD_GPU_OPERATIONS", "NCCL", 1);
  setenv("HOROVOD_GLOO_IFACE", "eth0", 1);
  setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "1", 1);
  setenv("HOROVOD_ENABLE_XLA_OPS", "1", 1);
  setenv("HOROVOD_FUSION_THRESHOLD", "1048576", 1);
  const Config config = Read(&warnings);
  EXPECT_TRUE(config.environment_notes.size() == 1, config.environment_notes.size() << " notes");
  const std::string& note = config.environment_notes[0];
  for (const char* part :
       {"tfring does not support these Horovod settings",
        "HOROVOD_THREAD_AFFINITY (tfring does not pin its background thread",
        "HOROVOD_HIERARCHICAL_ALLGATHER (tfring has no hierarchical allgather)",
        "HOROVOD_NOT_A_SETTING (not a Horovod setting tfring knows)",
        "HOROVOD_GLOO_IFACE (tfring has no Gloo",
        "ignored: build-time setting: HOROVOD_GPU_OPERATIONS, HOROVOD_WITH_PYTORCH",
        "unset the others to silence this warning"}) {
    EXPECT_TRUE(Contains(note, part), "'" << part << "' missing from: " << note);
  }
  for (const char* read : {"HOROVOD_DYNAMIC_PROCESS_SETS", "HOROVOD_ENABLE_XLA_OPS",
                           "HOROVOD_FUSION_THRESHOLD"}) {
    EXPECT_TRUE(!Contains(note, read), read << " named as unsupported: " << note);
  }
  EXPECT_TRUE(warnings.empty(), "warnings on stderr: " << warnings);
  ClearSettings();
}

// Exact names before families: HOROVOD_CPU_OPERATIONS is a runtime setting,
// HOROVOD_CPU_OPERATIONS_DEFAULT a build-time one; families match by prefix.
void FindHorovodVariables() {
  auto meaning = [](const std::string& name) {
    const HorovodVariable* found = FindHorovodVariable(name);
    return found == nullptr ? -1 : static_cast<int>(found->meaning);
  };
  EXPECT_TRUE(meaning("HOROVOD_CPU_OPERATIONS") == static_cast<int>(HorovodMeaning::kIgnored),
              "HOROVOD_CPU_OPERATIONS");
  EXPECT_TRUE(meaning("HOROVOD_CPU_OPERATIONS_DEFAULT") ==
                  static_cast<int>(HorovodMeaning::kBuildTime),
              "HOROVOD_CPU_OPERATIONS_DEFAULT");
  EXPECT_TRUE(meaning("HOROVOD_GPU") == static_cast<int>(HorovodMeaning::kBuildTime) &&
                  meaning("HOROVOD_GPU_ALLREDUCE") == static_cast<int>(HorovodMeaning::kBuildTime),
              "HOROVOD_GPU*");
  EXPECT_TRUE(meaning("HOROVOD_ELASTIC_TIMEOUT") == static_cast<int>(HorovodMeaning::kIgnored),
              "HOROVOD_ELASTIC*");
  EXPECT_TRUE(meaning("HOROVOD_TIMELINE") == static_cast<int>(HorovodMeaning::kTimelinePath),
              "HOROVOD_TIMELINE");
  EXPECT_TRUE(meaning("HOROVOD_UNHEARD_OF") == -1 && meaning("TFRING_SHM") == -1, "unknown");
}

const std::map<std::string, std::function<void()>>& Scenarios() {
  static const auto* scenarios = new std::map<std::string, std::function<void()>>{
      {"every_knob_has_a_bound", EveryKnobHasABound},
      {"non_finite_numbers_are_refused", NonFiniteNumbersAreRefused},
      {"horovod_names_set_knobs", HorovodNamesSetKnobs},
      {"tfring_wins_over_horovod", TfringWinsOverHorovod},
      {"unsupported_horovod_variables_are_named", UnsupportedHorovodVariablesAreNamed},
      {"find_horovod_variables", FindHorovodVariables},
      {"wire_compression_names", WireCompressionNames},
  };
  return *scenarios;
}

}  // namespace
}  // namespace testing
}  // namespace tfring

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <scenario|all|list>\n", argv[0]);
    return 2;
  }
  return tfring::testing::RunScenarios(tfring::testing::Scenarios(), argv[1], "",
                                       [](const auto& fn) { fn(); });
}
