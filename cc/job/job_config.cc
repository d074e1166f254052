#include "cc/job/job_config.h"

#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>

#include "cc/logging.h"

namespace tfring {
namespace {

// Job-scope knobs are numbers; the process-scope ones (which never travel)
// include strings, so these compile to nothing for them.
template <typename T>
void Append(std::string* bytes, const T& value) {
  if constexpr (std::is_trivially_copyable_v<T>) {
    bytes->append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
}

// Reads the value at `*offset` (the caller checked the length) and moves on.
template <typename T>
void Read(const std::string& bytes, size_t* offset, T* value) {
  if constexpr (std::is_trivially_copyable_v<T>) {
    std::memcpy(value, bytes.data() + *offset, sizeof(T));
    *offset += sizeof(T);
  }
}

template <typename T>
void Adopt(const char* env, T root_value, T* local_value) {
  if (root_value == *local_value) return;
  std::ostringstream message;
  message << env << " is " << *local_value << " on this rank but " << root_value
          << " on rank 0; using rank 0's value, because it decides which collective calls the "
             "ranks make and every rank must make the same ones. Set "
          << env << " to the same value on every rank (e.g. mpirun -x " << env
          << ") to silence this warning.";
  TFRING_LOG(kWarning, message.str());
  *local_value = root_value;
}

}  // namespace

Status AdoptRootJobConfig(Transport* transport, Config* config) {
  // Every rank is built from the same sources, so the knobs' order and types
  // agree and the values can travel as raw bytes.
  std::string bytes;
#define TFRING_APPEND_JOB_FIELD(type, field, env, def, max, scope, doc) \
  if (KnobScope::scope == KnobScope::kJob) Append(&bytes, config->field);
  TFRING_CONFIG_KNOBS(TFRING_APPEND_JOB_FIELD)
#undef TFRING_APPEND_JOB_FIELD
  const size_t expected_size = bytes.size();
  TFRING_RETURN_IF_ERROR(transport->BroadcastFromRoot(&bytes));
  if (bytes.size() != expected_size) {
    return Status::Internal("rank 0 sent " + std::to_string(bytes.size()) +
                            " bytes of job configuration, expected " +
                            std::to_string(expected_size) +
                            "; are all ranks running the same tfring build?");
  }
  size_t offset = 0;
#define TFRING_ADOPT_JOB_FIELD(type, field, env, def, max, scope, doc) \
  if (KnobScope::scope == KnobScope::kJob) {                       \
    type root_value{};                                             \
    Read(bytes, &offset, &root_value);                             \
    Adopt(env, root_value, &config->field);                        \
  }
  TFRING_CONFIG_KNOBS(TFRING_ADOPT_JOB_FIELD)
#undef TFRING_ADOPT_JOB_FIELD
  return Status::OK();
}

}  // namespace tfring
