#include "cc/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cc/config.h"

namespace tfring {
namespace {

std::atomic<int> log_rank{-1};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
  }
  return "?";
}

const char* BaseName(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= Config::Get().log_level;
}

void SetLogRank(int rank) { log_rank.store(rank); }

void LogMessage(LogLevel level, const char* file, int line, const std::string& message) {
  std::fprintf(stderr, "[tfring %s rank %d %s:%d] %s\n", LevelName(level), log_rank.load(),
               BaseName(file), line, message.c_str());
  std::fflush(stderr);
}

void CheckFailed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "[tfring FATAL rank %d %s:%d] check failed: %s. %s\n", log_rank.load(),
               BaseName(file), line, condition, message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tfring
