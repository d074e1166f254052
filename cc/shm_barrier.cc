#include "cc/shm_barrier.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>
#include <new>
#include <sstream>
#include <thread>
#include <utility>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "cc/common.h"

namespace tfring {

struct alignas(64) ShmBarrier::RankLine {
  std::atomic<uint64_t> step;
  std::atomic<int32_t> pid;  // 0 until the rank attached
};

struct alignas(64) ShmBarrier::Doorbell {
  std::atomic<uint32_t> ring;      // bumped when an arriving rank finds sleepers
  std::atomic<uint32_t> sleepers;  // ranks inside Sleep (or about to be)
  std::atomic<uint32_t> round_calls;  // bumped by CallRound
};

namespace {

// Polling before sleeping: peers in step arrive within tens of
// microseconds, and waking from a futex costs about as much on a virtual
// machine. No sched_yield phase: on a busy host a yielding thread can wait a
// whole time slice behind TensorFlow's threads before it runs again, while a
// futex wake-up puts it back at once.
constexpr std::chrono::microseconds kSpinFor{50};
constexpr int kSpinsPerClockRead = 64;
// The longest single sleep: bounds how late a failed peer is noticed.
constexpr std::chrono::milliseconds kLongestSleep{2};
constexpr std::chrono::milliseconds kLivenessCheckEvery{10};
// A rank calls its peers to a round once it has waited this long for them,
// and at most this often: a peer that submits the same work soon (the usual
// case in training) comes by itself well within it, and is not woken from
// its computation for nothing; a peer with nothing to submit (outside the
// process set of the work, say) answers as soon as it would have with a
// round every default cycle.
constexpr std::chrono::milliseconds kRoundCallAfter{1};

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "barrier words live in shared memory and must be lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "the doorbell must be a plain 32-bit word for the futex");

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

void WakeAll(std::atomic<uint32_t>* word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

void SleepUnlessChanged(std::atomic<uint32_t>* word, uint32_t seen,
                        std::chrono::nanoseconds limit) {
#if defined(__linux__)
  timespec timeout;
  timeout.tv_sec = static_cast<time_t>(limit.count() / 1000000000);
  timeout.tv_nsec = static_cast<long>(limit.count() % 1000000000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &timeout, nullptr, 0);
#else
  if (word->load() == seen) std::this_thread::sleep_for(std::chrono::microseconds(50));
#endif
}

std::string Seconds(std::chrono::nanoseconds duration) {
  std::ostringstream text;
  text << std::chrono::duration<double>(duration).count() << " s";
  return text.str();
}

}  // namespace

size_t ShmBarrier::Bytes(int size) {
  return sizeof(Doorbell) + static_cast<size_t>(size) * sizeof(RankLine);
}

ShmBarrier::ShmBarrier(void* area, int rank, int size, std::vector<int> job_ranks)
    : area_(static_cast<char*>(area)), rank_(rank), size_(size),
      job_ranks_(std::move(job_ranks)) {
  // Starts the words' lifetime in this process without writing to them
  // (their default constructors are trivial): the creator's zero fill is
  // their initial value, and peers may already be using theirs.
  new (area_) Doorbell;
  for (int r = 0; r < size_; ++r) new (area_ + sizeof(Doorbell) + r * sizeof(RankLine)) RankLine;
  Line(rank_).pid.store(static_cast<int32_t>(getpid()), std::memory_order_release);
}

ShmBarrier::RankLine& ShmBarrier::Line(int rank) const {
  return *std::launder(
      reinterpret_cast<RankLine*>(area_ + sizeof(Doorbell) + rank * sizeof(RankLine)));
}

ShmBarrier::Doorbell& ShmBarrier::Bell() const {
  return *std::launder(reinterpret_cast<Doorbell*>(area_));
}

bool ShmBarrier::AllArrived(uint64_t target) const {
  for (int r = 0; r < size_; ++r) {
    if (Line(r).step.load(std::memory_order_acquire) < target) return false;
  }
  return true;
}

std::vector<int> ShmBarrier::Missing(uint64_t target) const {
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r) {
    if (Line(r).step.load(std::memory_order_acquire) < target) missing.push_back(r);
  }
  return missing;
}

std::vector<int> ShmBarrier::Exited(const std::vector<int>& missing) const {
  std::vector<int> exited;
  for (int r : missing) {
    const int32_t pid = Line(r).pid.load(std::memory_order_acquire);
    // EPERM means the process exists but belongs to someone else: alive.
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) exited.push_back(r);
  }
  return exited;
}

std::string ShmBarrier::Describe(const std::vector<int>& ranks) const {
  std::vector<int> job;
  for (int r : ranks) job.push_back(job_ranks_[r]);
  return RanksToString(job);
}

uint32_t ShmBarrier::RoundCalls() const {
  return Bell().round_calls.load(std::memory_order_acquire);
}

void ShmBarrier::WaitForRoundCall(uint32_t seen, std::chrono::nanoseconds limit) const {
  SleepUnlessChanged(&Bell().round_calls, seen, limit);
}

void ShmBarrier::CallRound() const {
  Bell().round_calls.fetch_add(1, std::memory_order_acq_rel);
  WakeAll(&Bell().round_calls);
}

Status ShmBarrier::Wait(const char* what, std::chrono::nanoseconds timeout) {
  return WaitFor(what, timeout, false);
}

Status ShmBarrier::WaitCallingPeers(const char* what) {
  return WaitFor(what, std::chrono::nanoseconds(0), true);
}

Status ShmBarrier::WaitFor(const char* what, std::chrono::nanoseconds timeout, bool call_peers) {
  if (!broken_.ok()) return broken_;
  const uint64_t target = ++steps_;
  // Sequentially consistent, so that a rank about to sleep either sees this
  // step or is seen in `sleepers` below and woken.
  Line(rank_).step.store(target, std::memory_order_seq_cst);
  Doorbell& bell = Bell();
  if (bell.sleepers.load(std::memory_order_seq_cst) > 0) {
    bell.ring.fetch_add(1, std::memory_order_seq_cst);
    WakeAll(&bell.ring);
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  while (Clock::now() - start < kSpinFor) {
    for (int spin = 0; spin < kSpinsPerClockRead; ++spin) {
      if (AllArrived(target)) return Status::OK();
      CpuRelax();
    }
  }
  Clock::time_point next_liveness_check = start + kLivenessCheckEvery;
  bool called = false;
  while (!AllArrived(target)) {
    const Clock::time_point now = Clock::now();
    std::chrono::nanoseconds sleep_limit = kLongestSleep;
    if (call_peers && !called) {
      const Clock::time_point call_at = std::max(start, last_round_call_) + kRoundCallAfter;
      if (now >= call_at) {
        last_round_call_ = now;
        called = true;
        CallRound();
      } else {
        sleep_limit = std::min<std::chrono::nanoseconds>(sleep_limit, call_at - now);
      }
    }
    if (now >= next_liveness_check) {
      next_liveness_check = now + kLivenessCheckEvery;
      const std::vector<int> exited = Exited(Missing(target));
      if (!exited.empty()) {
        const std::string them = Describe(exited);
        broken_ = Status::Aborted(
            "tfring: " + them + " exited while " + Describe({rank_}) + " waited for it in a shared-memory " +
            what + "; the job cannot go on without it. Look at " + them +
            "'s output for why it ended (an exception, a signal, the out-of-memory killer).");
        return broken_;
      }
    }
    if (timeout.count() > 0 && now - start > timeout) {
      const std::vector<int> missing = Missing(target);
      if (missing.empty()) break;  // arrived just now
      broken_ = Status::Aborted(
          "tfring: " + Describe(missing) + " did not reach a shared-memory " + what +
          " within " + Seconds(timeout) + " while " + Describe({rank_}) + " waited (step " +
          std::to_string(target) + "). Its process is alive but stopped taking part "
          "(suspended, or stuck); the ranks can no longer agree, so the job cannot go on.");
      return broken_;
    }
    bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = bell.ring.load(std::memory_order_seq_cst);
    if (!AllArrived(target)) SleepUnlessChanged(&bell.ring, seen, sleep_limit);
    bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  return Status::OK();
}

}  // namespace tfring
