#include "cc/config.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace tfring {
namespace {

// Warnings here go straight to stderr: logging itself depends on Config.
void WarnMalformed(const char* env, const char* value, const char* expected) {
  std::fprintf(stderr,
               "[tfring WARNING] %s=%s is not %s; using the default. Set it to %s or "
               "unset it.\n",
               env, value, expected, expected);
}

bool Parse(const char* env, const char* text, int64_t* out) {
  if (std::strcmp(env, "TFRING_LOG_LEVEL") == 0) {
    static const char* kNames[] = {"trace", "debug", "info", "warning", "error"};
    for (int i = 0; i < 5; ++i) {
      if (strcasecmp(text, kNames[i]) == 0) {
        *out = i;
        return true;
      }
    }
  }
  if (std::strcmp(env, "TFRING_HIERARCHICAL_ALLREDUCE") == 0 && strcasecmp(text, "auto") == 0) {
    *out = kHierarchicalAuto;
    return true;
  }
  char* end = nullptr;
  long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value < 0) {
    WarnMalformed(env, text, "a non-negative integer");
    return false;
  }
  *out = value;
  return true;
}

bool Parse(const char* env, const char* text, double* out) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || value < 0) {
    WarnMalformed(env, text, "a non-negative number");
    return false;
  }
  *out = value;
  return true;
}

bool Parse(const char*, const char* text, std::string* out) {
  *out = text;
  return true;
}

template <typename T>
std::string ToString(T value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

Config Config::FromEnvironment() {
  Config config;
#define TFRING_READ_FIELD(type, field, env, def, scope, doc)  \
  if (const char* text = std::getenv(env)) {           \
    type parsed;                                       \
    if (Parse(env, text, &parsed)) config.field = parsed; \
    config.set_in_environment.push_back(env);          \
  }
  TFRING_CONFIG_KNOBS(TFRING_READ_FIELD)
#undef TFRING_READ_FIELD
  return config;
}

bool Config::SetInEnvironment(const std::string& env) const {
  for (const std::string& name : set_in_environment) {
    if (name == env) return true;
  }
  return false;
}

const Config& Config::Get() {
  static const Config* config = new Config(FromEnvironment());
  return *config;
}

std::vector<ConfigEntry> DescribeConfig(const Config& config) {
  std::vector<ConfigEntry> entries;
#define TFRING_DESCRIBE_FIELD(type, field, env, def, scope, doc)                          \
  entries.push_back(                                                                      \
      {env, ToString(config.field), ToString(static_cast<type>(def)), doc, KnobScope::scope});
  TFRING_CONFIG_KNOBS(TFRING_DESCRIBE_FIELD)
#undef TFRING_DESCRIBE_FIELD
  return entries;
}

}  // namespace tfring
