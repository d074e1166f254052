#include "cc/shm/shm_barrier.h"

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
  // Arrivals of every rank so far (barrier step k is passed once they reach
  // k * size), and whether and by whom the barrier was given up (Verdict).
  std::atomic<uint64_t> arrivals;
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

// The arrivals word: a count in the low bits; once a rank gives up, the top
// bit and that rank's index above the count. Neither ever changes again.
constexpr uint64_t kGaveUp = uint64_t{1} << 63;
constexpr int kGiverShift = 48;
constexpr uint64_t kCountMask = (uint64_t{1} << kGiverShift) - 1;

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
  for (int r : ranks) {
    if (r < 0 || r >= size_) return "an unknown rank (local index " + std::to_string(r) + ")";
    job.push_back(job_ranks_[r]);
  }
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

ShmBarrier::Verdict ShmBarrier::Check(uint64_t target) const {
  const uint64_t word = Bell().arrivals.load(std::memory_order_seq_cst);
  // A barrier that completed stays passed even if a later one was given up.
  if ((word & kCountMask) >= target * static_cast<uint64_t>(size_)) return Verdict::kPassed;
  return (word & kGaveUp) != 0 ? Verdict::kGivenUp : Verdict::kWaiting;
}

int ShmBarrier::Giver() const {
  const uint64_t word = Bell().arrivals.load(std::memory_order_acquire);
  return static_cast<int>((word & ~kGaveUp) >> kGiverShift);
}

bool ShmBarrier::GiveUp(uint64_t target) {
  Doorbell& bell = Bell();
  const uint64_t complete = target * static_cast<uint64_t>(size_);
  uint64_t word = bell.arrivals.load(std::memory_order_seq_cst);
  for (;;) {
    if ((word & kCountMask) >= complete) return false;  // the last rank came meanwhile
    if ((word & kGaveUp) != 0) return true;              // another rank gave up first
    // Withdraws this rank's arrival in the same step: the count can no
    // longer reach `complete`, whoever comes later.
    const uint64_t given_up =
        ((word & kCountMask) - 1) | kGaveUp | static_cast<uint64_t>(rank_) << kGiverShift;
    if (bell.arrivals.compare_exchange_weak(word, given_up, std::memory_order_seq_cst)) break;
  }
  bell.ring.fetch_add(1, std::memory_order_seq_cst);
  WakeAll(&bell.ring);
  return true;
}

Status ShmBarrier::GivenUpStatus(const char* what, uint64_t target,
                                 std::chrono::nanoseconds timeout) const {
  const std::vector<int> missing = Missing(target);
  const std::vector<int> exited = Exited(missing);
  const std::string giver = Describe({Giver()});
  const std::string me = Describe({rank_});
  if (!exited.empty()) return ExitedStatus(what, exited);
  if (!missing.empty()) {
    return Status::Aborted(
        "tfring: " + Describe(missing) + " did not reach a shared-memory " + what +
        (timeout.count() > 0 ? " within " + Seconds(timeout) : std::string()) + " while " + me +
        " waited, and " + giver + " gave up on it, so " + me +
        " fails it too. The missing process is alive but stopped taking part (suspended, or "
        "stuck); the ranks can no longer agree, so the job cannot go on.");
  }
  return Status::Aborted(
      "tfring: " + giver + " gave up on a shared-memory " + what + " before " + me +
      " arrived (" + me + " was suspended or stuck for longer than TFRING_SHM_TIMEOUT_SECONDS), "
      "so " + me + " fails it too: no rank completes an operation that another rank failed, "
      "and no rank writes into memory another rank has given up. The job cannot go on; look "
      "for what held " + me + " (a debugger, SIGSTOP, swapping).");
}

Status ShmBarrier::ExitedStatus(const char* what, const std::vector<int>& exited) const {
  const std::string them = Describe(exited);
  return Status::Aborted("tfring: " + them + " exited while " + Describe({rank_}) +
                         " waited for it in a shared-memory " + what +
                         "; the job cannot go on without it. Look at " + them +
                         "'s output for why it ended (an exception, a signal, the "
                         "out-of-memory killer).");
}

Status ShmBarrier::WaitFor(const char* what, std::chrono::nanoseconds timeout, bool call_peers) {
  if (!broken_.ok()) return broken_;
  const uint64_t target = ++steps_;
  // Sequentially consistent, so that a rank about to sleep either sees this
  // arrival or is seen in `sleepers` below and woken.
  Doorbell& bell = Bell();
  bell.arrivals.fetch_add(1, std::memory_order_seq_cst);
  // The step after the arrival, never before: while the count is short, some
  // rank's step then says it is missing, so a rank that dies between the two
  // stores is seen as missing and exited, not waited for as if it had come.
#ifdef TFRING_TEST_ARRIVAL_WINDOW_US
  usleep(TFRING_TEST_ARRIVAL_WINDOW_US);  // tests widen the window a kill may hit
#endif
  Line(rank_).step.store(target, std::memory_order_seq_cst);
  if (bell.sleepers.load(std::memory_order_seq_cst) > 0) {
    bell.ring.fetch_add(1, std::memory_order_seq_cst);
    WakeAll(&bell.ring);
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Verdict verdict = Check(target);
  while (verdict == Verdict::kWaiting && Clock::now() - start < kSpinFor) {
    for (int spin = 0; spin < kSpinsPerClockRead && verdict == Verdict::kWaiting; ++spin) {
      CpuRelax();
      verdict = Check(target);
    }
  }
  Clock::time_point next_liveness_check = start + kLivenessCheckEvery;
  bool called = false;
  while (verdict == Verdict::kWaiting) {
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
      if (!exited.empty() && GiveUp(target)) {
        broken_ = Giver() == rank_ ? ExitedStatus(what, exited) : GivenUpStatus(what, target, timeout);
        return broken_;
      }
    }
    if (timeout.count() > 0 && now - start > timeout) {
      const std::vector<int> missing = Missing(target);
      if (GiveUp(target)) {
        if (Giver() != rank_) {
          broken_ = GivenUpStatus(what, target, timeout);
        } else {
          broken_ = Status::Aborted(
              "tfring: " + Describe(missing) + " did not reach a shared-memory " + what +
              " within " + Seconds(timeout) + " while " + Describe({rank_}) + " waited (step " +
              std::to_string(target) + "). Its process is alive but stopped taking part "
              "(suspended, or stuck); the ranks can no longer agree, so the job cannot go on.");
        }
        return broken_;
      }
    }
    bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = bell.ring.load(std::memory_order_seq_cst);
    if (Check(target) == Verdict::kWaiting) SleepUnlessChanged(&bell.ring, seen, sleep_limit);
    bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    verdict = Check(target);
  }
  if (verdict == Verdict::kGivenUp) {
    broken_ = GivenUpStatus(what, target, timeout);
    return broken_;
  }
  return Status::OK();
}

}  // namespace tfring
