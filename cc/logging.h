// Logging and invariant checks for the core.
//
// Why: the core runs on a background thread where an exception has nowhere to
// go. User-facing problems travel as Status values; a broken internal
// invariant is a bug, so TFRING_CHECK logs file:line with the failed
// condition and aborts rather than corrupting data or hanging peers.
// TFRING_LOG_LEVEL (see config.h) filters messages.
#ifndef TFRING_CC_LOGGING_H_
#define TFRING_CC_LOGGING_H_

#include <sstream>
#include <string>

namespace tfring {

enum class LogLevel : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4 };

// Writes "[tfring <level> rank R file:line] message" to stderr when `level`
// is at or above the configured level.
void LogMessage(LogLevel level, const char* file, int line, const std::string& message);
bool LogEnabled(LogLevel level);
// Rank shown in log lines; set once the transport knows it.
void SetLogRank(int rank);
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const std::string& message);

}  // namespace tfring

#define TFRING_LOG(level, stream_expr)                                        \
  do {                                                                        \
    if (::tfring::LogEnabled(::tfring::LogLevel::level)) {                    \
      std::ostringstream _tfring_log;                                         \
      _tfring_log << stream_expr;                                             \
      ::tfring::LogMessage(::tfring::LogLevel::level, __FILE__, __LINE__,     \
                           _tfring_log.str());                                \
    }                                                                         \
  } while (0)

#define TFRING_CHECK(condition, stream_expr)                                  \
  do {                                                                        \
    if (!(condition)) {                                                       \
      std::ostringstream _tfring_check;                                       \
      _tfring_check << stream_expr;                                           \
      ::tfring::CheckFailed(__FILE__, __LINE__, #condition, _tfring_check.str()); \
    }                                                                         \
  } while (0)

#endif  // TFRING_CC_LOGGING_H_
