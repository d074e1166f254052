#include "cc/execution/thread_tuning.h"

#if defined(__linux__)
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#endif

namespace tfring {

#if defined(__linux__)
namespace {

// The time slice asked for, and the timer slack.
constexpr uint64_t kSliceNanoseconds = 100 * 1000;  // the kernel's minimum
constexpr unsigned long kTimerSlackNanoseconds = 1000;

// The kernel's struct sched_attr (linux/sched/types.h clashes with glibc's
// sched.h, and glibc wraps sched_setattr only from 2.41).
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime;  // for SCHED_OTHER: the requested slice (Linux 6.12+)
  uint64_t sched_deadline;
  uint64_t sched_period;
};

}  // namespace

void TuneLatencySensitiveThread() {
  prctl(PR_SET_TIMERSLACK, kTimerSlackNanoseconds, 0, 0, 0);
#if defined(SYS_sched_setattr)
  // Only the default policy has slices; a policy or nice value the user
  // chose (chrt, nice) stays as it is.
  if (sched_getscheduler(0) != SCHED_OTHER) return;
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, 0);  // 0: the calling thread
  if (errno != 0) return;
  SchedAttr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.size = sizeof(attr);
  attr.sched_policy = SCHED_OTHER;
  attr.sched_nice = nice;
  attr.sched_runtime = kSliceNanoseconds;
  syscall(SYS_sched_setattr, 0, &attr, 0);
#endif
}

#else

void TuneLatencySensitiveThread() {}

#endif

}  // namespace tfring
