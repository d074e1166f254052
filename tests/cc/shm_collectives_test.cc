// Tests of the shared-memory engine: the collectives (cc/shm/shm_collectives.h),
// their barrier (cc/shm/shm_barrier.h) and the segment (cc/shm/shm_segment.h).
//
// How: every rank is a real process. The parent creates the segment and
// forks the ranks; each Open()s the segment by name (so each maps it at an
// address of its own) and attaches, and the parent unlinks the name once
// all have opened it. A rank whose check fails writes why into memory it
// shares with the parent and exits 1; its peers notice that through the
// barrier (kill(pid, 0)) and fail too, so a failure ends a scenario in
// milliseconds. The parent reaps the ranks as they end (a zombie would still
// look alive to the barrier), reports the first one that failed (the cause;
// the others usually fail because it ended) and SIGKILLs any still running
// at its own deadline, so nothing hangs. Allreduce outputs land in memory
// shared with the parent, which checks every rank's bytes against a
// reference computed here and against rank 0's.
//
// Usage: shm_collectives_test <scenario|all|list>
//        shm_collectives_test bench <ranks> <MiB> [slot KiB]
// Prints "PASS <scenario>" or "FAIL <scenario>: why" per scenario and exits
// non-zero if any failed; `bench` prints median and best times of a float32
// Sum (chunked, chunked in place, as spans; a reduce-scatter into even
// slices) next to a memcpy of the same bytes (no assertions). Driven from
// tests/test_shm_collectives.py.

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cc/reduce_kernels.h"
#include "cc/shm/shm_barrier.h"
#include "cc/shm/shm_collectives.h"
#include "cc/shm/shm_segment.h"
#include "tests/cc/expect.h"

namespace tfring {
namespace {

using ::tfring::testing::TestFailure;
using Bytes = std::vector<unsigned char>;
using Clock = std::chrono::steady_clock;
using Views = std::vector<std::pair<const char*, size_t>>;

// Small slots, so that modest data already takes many chunks (halves of
// 32 KiB) and the slices of 2 or 3 ranks fall at odd places.
constexpr size_t kTestSlotBytes = 64 * 1024;
constexpr int64_t kLargeCount = 200003;
// The data timeout of the scenarios that expect no failure: a failing rank
// exits, which its peers notice long before.
constexpr std::chrono::nanoseconds kDataTimeout = std::chrono::seconds(20);
// 10: the reduce-scatter's fallback for slots too small to hold a piece per
// rank needs more than 9 ranks.
constexpr int kMaxRanks = 10;
constexpr size_t kMessageBytes = 4096;
// Job rank numbers unlike the local ones, to check which the messages use.
const std::vector<int> kJobRanks = {4, 7, 9, 12};
constexpr unsigned char kFill = 0xAB;
constexpr size_t kGuard = 64;

const DataType kDtypes[] = {DataType::kUInt8,   DataType::kInt8,     DataType::kInt32,
                            DataType::kInt64,   DataType::kFloat16,  DataType::kBFloat16,
                            DataType::kFloat32, DataType::kFloat64};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

void SleepMs(int ms) { usleep(static_cast<useconds_t>(ms) * 1000); }

std::string UniqueName() {
  static int counter = 0;
  return "/tfring_shm_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool Contains(const Status& status, const std::string& part) {
  return Contains(status.message(), part);
}

// Deterministic bytes for (seed, length).
Bytes Pattern(uint64_t seed, size_t bytes) {
  Bytes out(bytes);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    out[i] = static_cast<unsigned char>(x >> 24);
  }
  return out;
}

// Index of the first byte where a and b differ, -1 if none.
int64_t FirstDifference(const void* a, const void* b, size_t bytes) {
  if (bytes == 0 || std::memcmp(a, b, bytes) == 0) return -1;
  const unsigned char* x = static_cast<const unsigned char*>(a);
  const unsigned char* y = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < bytes; ++i) {
    if (x[i] != y[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

bool AllBytesAre(const void* data, size_t bytes, unsigned char value) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  return std::all_of(p, p + bytes, [&](unsigned char c) { return c == value; });
}

std::string Hex(const void* data, size_t bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string text = "0x";
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = bytes; i-- > 0;) {  // little-endian: most significant first
    text += kDigits[p[i] >> 4];
    text += kDigits[p[i] & 15];
  }
  return text;
}

void ExpectSameBytes(const void* expected, const void* got, size_t bytes,
                     const std::string& what) {
  const int64_t at = FirstDifference(expected, got, bytes);
  EXPECT_TRUE(at < 0, what << ": byte " << at << " of " << bytes << " is "
                           << Hex(static_cast<const char*>(got) + at, 1) << ", expected "
                           << Hex(static_cast<const char*>(expected) + at, 1));
}

// --- Processes ---

// Anonymous memory shared with the processes forked after it is made.
class SharedMemory {
 public:
  explicit SharedMemory(size_t bytes) : bytes_(std::max<size_t>(bytes, 1)) {
    data_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (data_ == MAP_FAILED) {
      throw TestFailure{"mmap of " + std::to_string(bytes_) + " bytes: " + std::strerror(errno)};
    }
  }
  ~SharedMemory() { munmap(data_, bytes_); }
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  char* data() const { return static_cast<char*>(data_); }

 private:
  size_t bytes_;
  void* data_;
};

// What the parent and its rank processes share besides the segment.
struct Shared {
  std::atomic<int> opened;            // ranks that have mapped the segment
  std::atomic<int> finished;          // ranks whose body returned or threw
  std::atomic<int64_t> killed_at_ns;  // when the parent SIGKILLed a rank (NowNs)
  char messages[kMaxRanks][kMessageBytes];
};

// Waits (in a rank) until `count` ranks have finished; false after `limit`.
bool WaitForFinished(Shared& shared, int count, std::chrono::seconds limit) {
  const Clock::time_point start = Clock::now();
  while (shared.finished.load() < count) {
    if (Clock::now() - start > limit) return false;
    SleepMs(1);
  }
  return true;
}

struct ProcessOptions {
  // The parent SIGKILLs the ranks still running after this.
  std::chrono::seconds deadline{60};
  // Ranks that may end by SIGKILL without failing the scenario.
  std::vector<int> may_be_killed;
  // The parent SIGKILLs rank `kill_rank` this long after forking it.
  int kill_rank = -1;
  std::chrono::milliseconds kill_after{0};
};

// Forks `size` processes running body(rank, shared) and reaps them; `poll`
// runs in the parent meanwhile. Throws the failures, the first rank to end
// first.
void RunProcesses(int size, const ProcessOptions& options,
                  const std::function<void(int, Shared&)>& body,
                  const std::function<void(Shared&)>& poll = nullptr) {
  EXPECT_TRUE(size >= 1 && size <= kMaxRanks, "size " << size);
  SharedMemory memory(sizeof(Shared));
  Shared& shared = *new (memory.data()) Shared;
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < size; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      for (pid_t started : pids) {
        kill(started, SIGKILL);
        waitpid(started, nullptr, 0);
      }
      throw TestFailure{"fork: " + why};
    }
    if (pid == 0) {
      std::string why;
      try {
        body(rank, shared);
      } catch (const TestFailure& failure) {
        why = failure.message;
      } catch (const std::exception& e) {
        why = std::string("exception: ") + e.what();
      }
      if (!why.empty()) std::snprintf(shared.messages[rank], kMessageBytes, "%s", why.c_str());
      shared.finished.fetch_add(1);
      _exit(why.empty() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  const Clock::time_point start = Clock::now();
  std::vector<int> status(size, 0);
  std::vector<bool> running(size, true);
  std::vector<int> ended;  // ranks in the order they ended
  std::vector<int> hung;
  int live = size;
  bool killed = false;
  while (live > 0) {
    for (int r = 0; r < size; ++r) {
      if (running[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) {
        running[r] = false;
        --live;
        ended.push_back(r);
      }
    }
    if (live == 0) break;
    if (poll) poll(shared);
    if (options.kill_rank >= 0 && !killed && Clock::now() - start >= options.kill_after) {
      killed = true;
      shared.killed_at_ns.store(NowNs());
      kill(pids[options.kill_rank], SIGKILL);
    }
    if (Clock::now() - start > options.deadline) {
      for (int r = 0; r < size; ++r) {
        if (!running[r]) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        running[r] = false;
        hung.push_back(r);
      }
      break;
    }
    usleep(500);
  }
  std::vector<std::string> failures;
  for (int r : ended) {
    const int s = status[r];
    const bool may_be_killed = std::count(options.may_be_killed.begin(),
                                          options.may_be_killed.end(), r) > 0;
    if (WIFEXITED(s) && WEXITSTATUS(s) == 0) continue;
    if (WIFSIGNALED(s) && WTERMSIG(s) == SIGKILL && may_be_killed) continue;
    std::string why;
    if (WIFEXITED(s) && WEXITSTATUS(s) == 1 && shared.messages[r][0] != 0) {
      why = shared.messages[r];
    } else if (WIFSIGNALED(s)) {
      why = std::string("ended by signal ") + strsignal(WTERMSIG(s));
    } else {
      why = "exited with code " + std::to_string(WEXITSTATUS(s));
    }
    failures.push_back("rank " + std::to_string(r) + ": " + why);
  }
  for (int r : hung) {
    failures.push_back("rank " + std::to_string(r) + " still ran after " +
                       std::to_string(options.deadline.count()) + " s: killed");
  }
  if (!failures.empty()) {
    std::string text = failures[0];
    for (size_t i = 1; i < failures.size(); ++i) text += "\n  then " + failures[i];
    throw TestFailure{text};
  }
}

struct RankOptions {
  int size = 1;
  size_t slot_bytes = kTestSlotBytes;
  std::chrono::nanoseconds timeout = kDataTimeout;
  // Name the ranks kJobRanks[r] instead of r.
  bool job_ranks = false;
  ProcessOptions process;
};

using RankBody = std::function<void(int rank, ShmCollectives& shm, Shared& shared)>;

// RunProcesses over a fresh segment: each rank opens it and attaches.
void RunRanks(const RankOptions& options, const RankBody& body) {
  const int size = options.size;
  const size_t bytes = ShmCollectives::SegmentBytes(size, options.slot_bytes);
  const std::string name = UniqueName();
  std::unique_ptr<ShmSegment> segment;
  const Status created = ShmSegment::Create(name, bytes, &segment);
  EXPECT_TRUE(created.ok(), created.message());
  std::vector<int> job_ranks;
  for (int r = 0; r < size; ++r) job_ranks.push_back(options.job_ranks ? kJobRanks[r] : r);
  bool unlinked = false;
  RunProcesses(
      size, options.process,
      [&](int rank, Shared& shared) {
        std::unique_ptr<ShmSegment> mine;
        const Status opened = ShmSegment::Open(name, bytes, &mine);
        EXPECT_TRUE(opened.ok(), opened.message());
        shared.opened.fetch_add(1);
        std::unique_ptr<ShmCollectives> shm;
        const Status attached =
            ShmCollectives::Attach(mine->data(), mine->size(), rank, size, options.slot_bytes,
                                   job_ranks, options.timeout, &shm);
        EXPECT_TRUE(attached.ok(), attached.message());
        body(rank, *shm, shared);
      },
      [&](Shared& shared) {
        // Every rank has mapped it: the name can go (as ShmTransport does).
        if (!unlinked && shared.opened.load() == size) {
          unlinked = true;
          const Status status = segment->Unlink();
          if (!status.ok()) std::fprintf(stderr, "unlink: %s\n", status.message().c_str());
        }
      });
}

// The job ranks an engine error names before `verb`:
// "tfring: ranks 7, 9 did not reach ..." -> {7, 9} for "did not reach".
std::vector<int> NamedRanks(const std::string& message, const std::string& verb) {
  const std::string prefix = "tfring: ";
  const size_t end = message.find(" " + verb);
  if (message.compare(0, prefix.size(), prefix) != 0 || end == std::string::npos) return {};
  std::string list = message.substr(prefix.size(), end - prefix.size());
  for (const std::string word : {"ranks ", "rank "}) {
    if (list.compare(0, word.size(), word) == 0) {
      list = list.substr(word.size());
      std::vector<int> ranks;
      std::istringstream in(list);
      std::string item;
      while (std::getline(in, item, ',')) ranks.push_back(std::atoi(item.c_str()));
      return ranks;
    }
  }
  return {};
}

// --- The reference: one element at a time, ranks in order. ---

template <typename T>
T Apply(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum: return static_cast<T>(a + b);
    case ReduceOp::kProduct: return static_cast<T>(a * b);
    case ReduceOp::kMin: return b < a ? b : a;
    case ReduceOp::kMax: return a < b ? b : a;
    default: throw TestFailure{"reference: bad op"};
  }
}

template <typename T>
void ReferenceTyped(ReduceOp op, const std::vector<Bytes>& inputs, int64_t count, Bytes* out) {
  out->resize(count * sizeof(T));
  for (int64_t i = 0; i < count; ++i) {
    T acc;
    std::memcpy(&acc, inputs[0].data() + i * sizeof(T), sizeof(T));
    for (size_t r = 1; r < inputs.size(); ++r) {
      T value;
      std::memcpy(&value, inputs[r].data() + i * sizeof(T), sizeof(T));
      acc = Apply(op, acc, value);
    }
    std::memcpy(out->data() + i * sizeof(T), &acc, sizeof(T));
  }
}

// 16-bit floats: folded in float, rounded once (as ReduceSources does).
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ReferenceSixteenBit(ReduceOp op, const std::vector<Bytes>& inputs, int64_t count,
                         Bytes* out) {
  out->resize(count * 2);
  for (int64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, inputs[0].data() + i * 2, 2);
    float acc = ToFloat(bits);
    for (size_t r = 1; r < inputs.size(); ++r) {
      std::memcpy(&bits, inputs[r].data() + i * 2, 2);
      acc = Apply(op, acc, ToFloat(bits));
    }
    bits = FromFloat(acc);
    std::memcpy(out->data() + i * 2, &bits, 2);
  }
}

Bytes Reference(DataType dtype, ReduceOp op, const std::vector<Bytes>& inputs, int64_t count) {
  Bytes out;
  switch (dtype) {
    case DataType::kUInt8: ReferenceTyped<uint8_t>(op, inputs, count, &out); break;
    case DataType::kInt8: ReferenceTyped<int8_t>(op, inputs, count, &out); break;
    case DataType::kInt32: ReferenceTyped<int32_t>(op, inputs, count, &out); break;
    case DataType::kInt64: ReferenceTyped<int64_t>(op, inputs, count, &out); break;
    case DataType::kFloat32: ReferenceTyped<float>(op, inputs, count, &out); break;
    case DataType::kFloat64: ReferenceTyped<double>(op, inputs, count, &out); break;
    case DataType::kFloat16:
      ReferenceSixteenBit<HalfToFloat, FloatToHalf>(op, inputs, count, &out);
      break;
    case DataType::kBFloat16:
      ReferenceSixteenBit<BFloat16ToFloat, FloatToBFloat16>(op, inputs, count, &out);
      break;
    default: throw TestFailure{std::string("no reference for ") + DataTypeName(dtype)};
  }
  return out;
}

// Values whose reductions over up to 4 ranks stay in range (no signed
// overflow, no infinities); floats with fractions, so sums round.
Bytes RandomInput(DataType dtype, ReduceOp op, int64_t count, uint64_t seed) {
  std::mt19937_64 random(seed);
  const bool product = op == ReduceOp::kProduct;
  auto integer = [&](int64_t low, int64_t high) {
    return low + static_cast<int64_t>(random() % static_cast<uint64_t>(high - low + 1));
  };
  auto real = [&] { return static_cast<double>(integer(-4000000, 4000000)) / 1000000.0; };
  Bytes bytes(count * DataTypeSize(dtype));
  for (int64_t i = 0; i < count; ++i) {
    unsigned char* at = bytes.data() + i * DataTypeSize(dtype);
    auto put = [&](auto value) { std::memcpy(at, &value, sizeof(value)); };
    switch (dtype) {
      case DataType::kUInt8: put(static_cast<uint8_t>(integer(0, product ? 3 : 60))); break;
      case DataType::kInt8:
        put(static_cast<int8_t>(product ? integer(-3, 3) : integer(-30, 30)));
        break;
      case DataType::kInt32:
        put(static_cast<int32_t>(product ? integer(-100, 100) : integer(-500000000, 500000000)));
        break;
      case DataType::kInt64:
        put(static_cast<int64_t>(product ? integer(-1000, 1000)
                                         : integer(-(int64_t{1} << 60), int64_t{1} << 60)));
        break;
      case DataType::kFloat32: put(static_cast<float>(real())); break;
      case DataType::kFloat64: put(real()); break;
      case DataType::kFloat16: put(FloatToHalf(static_cast<float>(real()))); break;
      case DataType::kBFloat16: put(FloatToBFloat16(static_cast<float>(real()))); break;
      default: throw TestFailure{"no generator"};
    }
  }
  return bytes;
}

// --- Allreduce against the reference ---

enum class Mode { kChunked, kInPlace, kSpans };

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kChunked: return "chunked";
    case Mode::kInPlace: return "chunked in place";
    case Mode::kSpans: return "spans";
  }
  return "?";
}

struct AllreduceCase {
  Mode mode;
  DataType dtype;
  ReduceOp op;
  int64_t count;
  std::vector<Bytes> inputs;  // one per rank
  Bytes expected;
  size_t offset = 0;  // of the output in each rank's part of the results
};

std::string Describe(const AllreduceCase& c, int size) {
  return std::string(ModeName(c.mode)) + " " + ReduceOpName(c.op) + " " +
         DataTypeName(c.dtype) + " x" + std::to_string(c.count) + " on " +
         std::to_string(size) + " ranks";
}

AllreduceCase MakeCase(int size, Mode mode, DataType dtype, ReduceOp op, int64_t count) {
  AllreduceCase c{mode, dtype, op, count, {}, {}};
  for (int r = 0; r < size; ++r) {
    c.inputs.push_back(RandomInput(dtype, op, count,
                                   static_cast<uint64_t>(dtype) * 1000003 +
                                       static_cast<uint64_t>(op) * 10007 + count * 31 + r));
  }
  c.expected = Reference(dtype, op, c.inputs, count);
  return c;
}

// `count` elements at `input` and `output` (may be equal) as `pieces` spans
// of uneven lengths (quadratic boundaries: short ones first, some empty when
// count is small), for AllreduceSpans.
std::vector<ReduceSpan> SplitIntoSpans(const void* input, void* output, int64_t count,
                                       DataType dtype, int pieces) {
  const int64_t element = DataTypeSize(dtype);
  std::vector<ReduceSpan> spans;
  for (int k = 0; k < pieces; ++k) {
    const int64_t begin = count * k * k / (pieces * pieces);
    const int64_t end = count * (k + 1) * (k + 1) / (pieces * pieces);
    ReduceSpan span;
    span.input = static_cast<const char*>(input) + begin * element;
    span.output = static_cast<char*>(output) + begin * element;
    span.count = end - begin;
    spans.push_back(span);
  }
  return spans;
}

// Runs `cases` in order on `size` ranks; each rank's outputs go to shared
// memory (between guard bytes, element-aligned but not cache-line aligned),
// where the parent compares them with the reference and with rank 0's.
void CheckAllreduces(int size, size_t slot_bytes, std::vector<AllreduceCase> cases) {
  size_t stride = 0;
  for (AllreduceCase& c : cases) {
    const size_t element = DataTypeSize(c.dtype);
    c.offset = (stride + 63) / 64 * 64 + kGuard + element;
    stride = c.offset + c.count * element + kGuard;
  }
  stride = (stride + 63) / 64 * 64;
  SharedMemory results(stride * size);
  std::memset(results.data(), kFill, stride * size);
  RankOptions options;
  options.size = size;
  options.slot_bytes = slot_bytes;
  RunRanks(options, [&](int rank, ShmCollectives& shm, Shared&) {
    for (const AllreduceCase& c : cases) {
      char* out = results.data() + rank * stride + c.offset;
      const size_t bytes = c.count * DataTypeSize(c.dtype);
      const unsigned char* input = c.inputs[rank].data();
      Status status;
      switch (c.mode) {
        case Mode::kChunked: {
          const Bytes before = c.inputs[rank];
          status = shm.Allreduce(input, out, c.count, c.dtype, c.op);
          ExpectSameBytes(before.data(), input, bytes, Describe(c, size) + ": the input");
          break;
        }
        case Mode::kInPlace:
          if (bytes > 0) std::memcpy(out, input, bytes);
          status = shm.Allreduce(out, out, c.count, c.dtype, c.op);
          break;
        case Mode::kSpans:
          status = shm.AllreduceSpans(SplitIntoSpans(input, out, c.count, c.dtype, 5), c.dtype,
                                      c.op);
          break;
      }
      EXPECT_TRUE(status.ok(), Describe(c, size) << ": " << status.message());
    }
  });
  for (const AllreduceCase& c : cases) {
    const std::string what = Describe(c, size);
    const size_t element = DataTypeSize(c.dtype);
    const size_t bytes = c.count * element;
    const char* first = results.data() + c.offset;
    for (int r = 0; r < size; ++r) {
      const char* out = results.data() + r * stride + c.offset;
      EXPECT_TRUE(AllBytesAre(out - kGuard - element, kGuard + element, kFill) &&
                      AllBytesAre(out + bytes, kGuard, kFill),
                  what << ": rank " << r << " wrote outside its output");
      const int64_t at = FirstDifference(first, out, bytes);
      EXPECT_TRUE(at < 0, what << ": rank " << r << " got other bytes than rank 0, element "
                               << at / static_cast<int64_t>(element));
    }
    const int64_t at = FirstDifference(c.expected.data(), first, bytes);
    const size_t e = at < 0 ? 0 : at / element * element;
    EXPECT_TRUE(at < 0, what << ": element " << at / static_cast<int64_t>(element) << " is "
                             << Hex(first + e, element) << ", expected "
                             << Hex(c.expected.data() + e, element));
  }
}

// Every op at 1 to 3 ranks: chunked, chunked in place and as spans on counts
// of 0, 1, a few, one more than a chunk and many chunks (none divisible by 2
// or 3).
void AllreduceEveryOp(DataType dtype) {
  const int64_t element = DataTypeSize(dtype);
  const int64_t chunk = kTestSlotBytes / 2 / element;
  for (int size = 1; size <= 3; ++size) {
    std::vector<AllreduceCase> cases;
    for (ReduceOp op : kOps) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{17}, int64_t{1001},
                            chunk + 1, kLargeCount}) {
        cases.push_back(MakeCase(size, Mode::kChunked, dtype, op, count));
        cases.push_back(MakeCase(size, Mode::kInPlace, dtype, op, count));
        cases.push_back(MakeCase(size, Mode::kSpans, dtype, op, count));
      }
    }
    CheckAllreduces(size, kTestSlotBytes, std::move(cases));
  }
}

// Several tensors in one AllreduceSpans at 1 to 3 ranks: spans of random
// lengths (empty ones, ones inside a chunk, ones across several chunk
// boundaries, so chunks and slices start and end inside tensors), some in
// place, some with a factor and a divisor. Every output must equal the
// reference reduction of that tensor alone, scaled, bit for bit (so every
// rank holds the same bits), and separate inputs must be left untouched.
void AllreduceSpansEveryDtype() {
  struct Plan {
    int64_t count;
    bool in_place;
    double factor;
    int64_t divisor;
  };
  for (int size = 1; size <= 3; ++size) {
    for (DataType dtype : kDtypes) {
      const ReduceOp op = kOps[static_cast<int>(dtype) % 4];
      const int64_t chunk = kTestSlotBytes / 2 / DataTypeSize(dtype);
      const bool real = dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
                        dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
      std::mt19937_64 random(static_cast<uint64_t>(dtype) * 7 + size);
      std::vector<Plan> plans;
      for (int t = 0; t < 24; ++t) {
        const int64_t counts[] = {0, 1, 7, static_cast<int64_t>(random() % chunk),
                                  chunk - 1, static_cast<int64_t>(random() % (3 * chunk))};
        Plan plan{counts[random() % 6], random() % 2 == 0, 1.0, 1};
        if (random() % 3 == 0) {
          plan.divisor = 3;
          if (real) plan.factor = 0.5;
        }
        plans.push_back(plan);
      }
      RankOptions options;
      options.size = size;
      RunRanks(options, [&](int rank, ShmCollectives& shm, Shared&) {
        std::vector<std::vector<Bytes>> inputs(plans.size());  // [tensor][rank]
        std::vector<Bytes> outputs(plans.size());
        std::vector<ReduceSpan> spans;
        for (size_t t = 0; t < plans.size(); ++t) {
          for (int q = 0; q < size; ++q) {
            inputs[t].push_back(RandomInput(dtype, op, plans[t].count, t * 131 + q * 7 + 1));
          }
          outputs[t] = plans[t].in_place ? inputs[t][rank]
                                         : Bytes(plans[t].count * DataTypeSize(dtype), kFill);
          ReduceSpan span;
          span.output = outputs[t].data();
          span.input = plans[t].in_place ? span.output : inputs[t][rank].data();
          span.count = plans[t].count;
          span.factor = plans[t].factor;
          span.divisor = plans[t].divisor;
          spans.push_back(span);
        }
        const std::string what = std::string("spans of ") + DataTypeName(dtype) + " " +
                                 ReduceOpName(op) + " on " + std::to_string(size) + " ranks";
        const Status status = shm.AllreduceSpans(spans, dtype, op);
        EXPECT_TRUE(status.ok(), what << ": " << status.message());
        for (size_t t = 0; t < plans.size(); ++t) {
          const size_t bytes = plans[t].count * DataTypeSize(dtype);
          Bytes expected = Reference(dtype, op, inputs[t], plans[t].count);
          ScaleCopy(dtype, expected.data(), expected.data(), plans[t].count, plans[t].factor,
                    plans[t].divisor);
          const int64_t at = FirstDifference(expected.data(), outputs[t].data(), bytes);
          EXPECT_TRUE(at < 0, what << ": tensor " << t << " of " << plans[t].count
                                   << " elements differs at byte " << at);
          if (!plans[t].in_place) {
            const Bytes original =
                RandomInput(dtype, op, plans[t].count, t * 131 + rank * 7 + 1);
            ExpectSameBytes(original.data(), inputs[t][rank].data(), bytes,
                            what + ": the input of tensor " + std::to_string(t));
          }
        }
      });
    }
  }
}

// A rank that waits at a negotiation step for a peer that does not come
// calls it to a round (shm_barrier.h): the late rank, sleeping on the
// round-call word as a watcher does, wakes up to a changed value.
void RoundCalls() {
  for (int size = 2; size <= 3; ++size) {
    RankOptions options;
    options.size = size;
    RunRanks(options, [&](int rank, ShmCollectives& shm, Shared&) {
      Views views;
      bool fits = false;
      const char word = static_cast<char>(rank);
      Status status = shm.Exchange(&word, 1, &views, &fits);  // everyone attached
      EXPECT_TRUE(status.ok(), status.message());
      if (rank == size - 1) {
        const uint32_t before = shm.RoundCalls();
        const Clock::time_point start = Clock::now();
        while (shm.RoundCalls() == before && SecondsSince(start) < 10) {
          shm.WaitForRoundCall(before, std::chrono::seconds(10));
        }
        EXPECT_TRUE(shm.RoundCalls() != before,
                    "rank " << rank << " was not called to the round its peers waited in");
      }
      status = shm.Exchange(&word, 1, &views, &fits);
      EXPECT_TRUE(status.ok() && fits, status.message());
      for (int q = 0; q < size; ++q) {
        EXPECT_TRUE(views[q].second == 1 && views[q].first[0] == static_cast<char>(q),
                    "the message of rank " << q);
      }
    });
  }
}

// The smallest slot (128 bytes: chunk halves of one cache line, so one rank
// alone has a non-empty slice of each chunk) against counts around it.
void AllreduceTinySlot() {
  for (int size = 2; size <= 3; ++size) {
    std::vector<AllreduceCase> cases;
    for (int64_t count = 0; count <= 40; ++count) {
      cases.push_back(MakeCase(size, Mode::kChunked, DataType::kFloat64, ReduceOp::kSum, count));
      if (count % 3 == 0) {
        cases.push_back(
            MakeCase(size, Mode::kInPlace, DataType::kFloat64, ReduceOp::kSum, count));
      }
      if (count <= 16) {
        cases.push_back(
            MakeCase(size, Mode::kSpans, DataType::kFloat64, ReduceOp::kMax, count));
      }
    }
    cases.push_back(MakeCase(size, Mode::kChunked, DataType::kInt8, ReduceOp::kMin, 1000));
    cases.push_back(MakeCase(size, Mode::kInPlace, DataType::kFloat16, ReduceOp::kSum, 333));
    cases.push_back(MakeCase(size, Mode::kSpans, DataType::kUInt8, ReduceOp::kProduct, 128));
    CheckAllreduces(size, 128, std::move(cases));
  }
}

// --- Reduce-scatter ---

struct ReduceScatterCase {
  DataType dtype;
  ReduceOp op;
  std::vector<int64_t> counts;  // one per rank
};

std::string Describe(const ReduceScatterCase& c, bool in_place) {
  std::string text = std::string("reduce-scatter ") + (in_place ? "in place " : "") +
                     ReduceOpName(c.op) + " " + DataTypeName(c.dtype) + " counts";
  for (int64_t count : c.counts) text += " " + std::to_string(count);
  return text;
}

// The elements of one piece of a rank's slice per round (shm_collectives.h:
// a chunk area split among the other ranks, whole cache lines where it
// holds one), so that the cases can fall on and around its boundaries.
int64_t PieceElements(int size, size_t slot_bytes, DataType dtype) {
  const int64_t element = DataTypeSize(dtype);
  const int64_t chunk = static_cast<int64_t>(std::min<size_t>(slot_bytes / 2, 512 * 1024));
  const int64_t line = std::max<int64_t>(1, 64 / element);
  const int64_t piece = chunk / element / std::max(1, size - 1);
  return piece >= line ? piece / line * line : piece;
}

// Each case out of place and in place on `size` ranks. Every rank checks its
// own slice against the reference and against the same bits of an Allreduce
// of the same inputs, and that nothing else was written: out of place, the
// rest of the output keeps its fill bytes (and the input is untouched); in
// place, the rest keeps the input. Outputs sit between guard bytes, element-
// but not cache-line aligned.
void CheckReduceScatters(int size, size_t slot_bytes, const std::vector<ReduceScatterCase>& cases) {
  RankOptions options;
  options.size = size;
  options.slot_bytes = slot_bytes;
  RunRanks(options, [&](int rank, ShmCollectives& shm, Shared&) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const ReduceScatterCase& c = cases[i];
      EXPECT_TRUE(static_cast<int>(c.counts.size()) == size, "case " << i << ": counts");
      const int64_t element = DataTypeSize(c.dtype);
      int64_t total = 0, first = 0;
      for (int q = 0; q < size; ++q) {
        if (q == rank) first = total;
        total += c.counts[q];
      }
      const size_t bytes = total * element;
      const size_t begin = first * element, end = begin + c.counts[rank] * element;
      std::vector<Bytes> inputs;
      for (int q = 0; q < size; ++q) {
        inputs.push_back(RandomInput(c.dtype, c.op, total, 7919 * i + 31 * total + q));
      }
      const Bytes expected = Reference(c.dtype, c.op, inputs, total);
      Bytes allreduced(bytes + 1);
      Status status = shm.Allreduce(inputs[rank].data(), allreduced.data(), total, c.dtype, c.op);
      EXPECT_TRUE(status.ok(), "the allreduce beside case " << i << ": " << status.message());
      for (bool in_place : {false, true}) {
        const std::string what = Describe(c, in_place) + " on " + std::to_string(size) +
                                 " ranks, rank " + std::to_string(rank);
        const Bytes& input = inputs[rank];
        Bytes buffer(bytes + 2 * kGuard + 2 * element, kFill);
        unsigned char* out = buffer.data() + kGuard + element;
        if (in_place) std::copy(input.begin(), input.end(), out);
        status = shm.ReduceScatter(in_place ? out : input.data(), out, c.counts, c.dtype, c.op);
        EXPECT_TRUE(status.ok(), what << ": " << status.message());
        ExpectSameBytes(expected.data() + begin, out + begin, end - begin, what + ": the slice");
        ExpectSameBytes(allreduced.data() + begin, out + begin, end - begin,
                        what + ": the slice against the allreduce");
        if (in_place) {
          ExpectSameBytes(input.data(), out, begin, what + ": before the slice");
          ExpectSameBytes(input.data() + end, out + end, bytes - end, what + ": after the slice");
        } else {
          EXPECT_TRUE(AllBytesAre(out, begin, kFill) && AllBytesAre(out + end, bytes - end, kFill),
                      what << ": wrote outside its slice");
          const Bytes again = RandomInput(c.dtype, c.op, total, 7919 * i + 31 * total + rank);
          ExpectSameBytes(again.data(), input.data(), bytes, what + ": the input");
        }
        EXPECT_TRUE(AllBytesAre(buffer.data(), kGuard + element, kFill) &&
                        AllBytesAre(out + bytes, kGuard + element, kFill),
                    what << ": wrote outside the output");
      }
    }
  });
}

// At 1 to 4 ranks: even and uneven slices, empty ones, fewer elements than
// ranks, slices ending just before, on and after a piece boundary, one rank
// with everything, many rounds; sums that round (float32, float16), and
// every other op.
void ReduceScatterLayouts() {
  const struct {
    DataType dtype;
    ReduceOp op;
  } kinds[] = {{DataType::kFloat32, ReduceOp::kSum},  {DataType::kFloat16, ReduceOp::kSum},
               {DataType::kBFloat16, ReduceOp::kMax}, {DataType::kInt8, ReduceOp::kProduct},
               {DataType::kInt64, ReduceOp::kMin},    {DataType::kFloat64, ReduceOp::kSum}};
  for (int size = 1; size <= 4; ++size) {
    std::vector<ReduceScatterCase> cases;
    for (const auto& kind : kinds) {
      const int64_t piece = PieceElements(size, kTestSlotBytes, kind.dtype);
      std::vector<std::vector<int64_t>> layouts;
      auto layout = [&](auto count_of) {
        layouts.emplace_back();
        for (int q = 0; q < size; ++q) layouts.back().push_back(count_of(q));
      };
      layout([&](int q) { return kLargeCount * (q + 1) / size - kLargeCount * q / size; });
      layout([&](int) { return int64_t{0}; });
      layout([&](int q) { return q == size - 1 ? int64_t{1} : int64_t{0}; });
      layout([&](int q) { return int64_t{q % 2}; });  // fewer elements than ranks
      layout([&](int q) { return piece - 1 + q % 3; });
      layout([&](int q) { return q == 0 ? piece : piece + 1; });
      layout([&](int q) { return q == size / 2 ? 3 * piece + 5 : int64_t{0}; });
      layout([&](int q) { return 1001 * q + 17; });
      layout([&](int q) { return int64_t{q == 0 ? 1 : 7 * piece + 3 * q}; });
      for (auto& counts : layouts) cases.push_back({kind.dtype, kind.op, counts});
    }
    CheckReduceScatters(size, kTestSlotBytes, cases);
  }
}

// The smallest slot (pieces of a few elements, several rounds for a few
// dozen) at 2 to 4 ranks, and at 10 ranks, where a float64 chunk area holds
// no piece per rank and the reduce-scatter runs as an allreduce instead.
void ReduceScatterTinySlot() {
  for (int size : {2, 3, 4, 10}) {
    std::vector<ReduceScatterCase> cases;
    for (int64_t total : {0, 1, 5, 9, 16, 17, 40, 333}) {
      std::vector<int64_t> counts;
      for (int q = 0; q < size; ++q) counts.push_back(total * (q + 1) / size - total * q / size);
      cases.push_back({DataType::kFloat64, ReduceOp::kSum, counts});
      cases.push_back({DataType::kUInt8, ReduceOp::kMax, counts});
      std::reverse(counts.begin(), counts.end());
      cases.push_back({DataType::kFloat16, ReduceOp::kSum, counts});
    }
    CheckReduceScatters(size, 128, cases);
  }
}

// --- Mixed calls ---

// FNV-1a over `bytes`, folded into `digest`.
uint64_t Digest(uint64_t digest, const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  if (digest == 0) digest = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) digest = (digest ^ p[i]) * 1099511628211ull;
  return digest;
}

// Thousands of calls in an order drawn from a seed every rank shares:
// allreduces (chunked, in place, staged; every dtype and op), broadcasts,
// allgathers, reduce-scatters and exchanges (some too big), with a rank now
// and then late so the others sleep. Slots of 1 KiB make most calls several
// chunks. Every rank checks every result; at the end the ranks compare
// their step counts and a digest of everything they all received.
void ManyMixedCalls() {
  for (int size = 2; size <= 3; ++size) {
    const int calls = size == 3 ? 2000 : 1000;
    const size_t slot = 1024;
    const int64_t half = slot / 2;
    RankOptions options;
    options.size = size;
    options.slot_bytes = slot;
    RunRanks(options, [&](int rank, ShmCollectives& shm, Shared&) {
      std::mt19937_64 random(20240601 + size);  // the same draws on every rank
      uint64_t digest = 0;
      Views views;
      bool fits = false;
      for (int call = 0; call < calls; ++call) {
        const int kind = static_cast<int>(random() % 7);
        const uint64_t seed = random();
        const int late = static_cast<int>(random() % (size * 30));
        if (late == rank) usleep(500 + seed % 1500);
        const std::string what = "call " + std::to_string(call) + " (kind " +
                                 std::to_string(kind) + ")";
        Status status;
        if (kind <= 2) {  // allreduce: 0 chunked, 1 in place, 2 spans
          const DataType dtype = kDtypes[random() % 8];
          const ReduceOp op = kOps[random() % 4];
          const int64_t element = DataTypeSize(dtype);
          const int64_t count = static_cast<int64_t>(random() % (3 * half / element + 8));
          std::vector<Bytes> inputs;
          for (int q = 0; q < size; ++q) inputs.push_back(RandomInput(dtype, op, count, seed + q));
          const Bytes expected = Reference(dtype, op, inputs, count);
          Bytes output(expected.size() + 1, kFill);
          if (kind == 0) {
            status = shm.Allreduce(inputs[rank].data(), output.data(), count, dtype, op);
          } else if (kind == 1) {
            std::copy(inputs[rank].begin(), inputs[rank].end(), output.begin());
            status = shm.Allreduce(output.data(), output.data(), count, dtype, op);
          } else {
            status = shm.AllreduceSpans(
                SplitIntoSpans(inputs[rank].data(), output.data(), count, dtype,
                               1 + static_cast<int>(seed % 6)),
                dtype, op);
          }
          const AllreduceCase c{static_cast<Mode>(kind), dtype, op, count, {}, {}};
          EXPECT_TRUE(status.ok(), what << " " << Describe(c, size) << ": " << status.message());
          ExpectSameBytes(expected.data(), output.data(), expected.size(),
                          what + " " + Describe(c, size));
          EXPECT_TRUE(output.back() == kFill, what << ": wrote past the output");
          digest = Digest(digest, output.data(), expected.size());
        } else if (kind == 3) {  // broadcast
          const int root = static_cast<int>(random() % size);
          const size_t bytes = random() % (3 * half + 8);
          const Bytes expected = Pattern(seed, bytes);
          Bytes buffer = rank == root ? expected : Pattern(seed + 1 + rank, bytes);
          buffer.push_back(kFill);
          status = shm.Broadcast(buffer.data(), bytes, root);
          EXPECT_TRUE(status.ok(), what << " broadcast: " << status.message());
          ExpectSameBytes(expected.data(), buffer.data(), bytes,
                          what + " broadcast of " + std::to_string(bytes) + " from " +
                              std::to_string(root));
          EXPECT_TRUE(buffer.back() == kFill, what << ": wrote past the buffer");
          digest = Digest(digest, buffer.data(), bytes);
        } else if (kind == 4) {  // allgatherv
          std::vector<int64_t> sizes;
          Bytes expected;
          for (int q = 0; q < size; ++q) {
            sizes.push_back(random() % 4 == 0 ? 0 : static_cast<int64_t>(random() % (2 * half + 4)));
            const Bytes part = Pattern(seed + q, sizes[q]);
            expected.insert(expected.end(), part.begin(), part.end());
          }
          const bool in_place = random() % 2 == 0;
          int64_t offset = 0;
          for (int q = 0; q < rank; ++q) offset += sizes[q];
          const Bytes mine = Pattern(seed + rank, sizes[rank]);
          Bytes output(expected.size() + 1, kFill);
          if (in_place) std::copy(mine.begin(), mine.end(), output.begin() + offset);
          status = shm.Allgatherv(in_place ? nullptr : mine.data(), output.data(), sizes);
          EXPECT_TRUE(status.ok(), what << " allgatherv: " << status.message());
          ExpectSameBytes(expected.data(), output.data(), expected.size(),
                          what + std::string(" allgatherv") + (in_place ? " in place" : ""));
          EXPECT_TRUE(output.back() == kFill, what << ": wrote past the output");
          digest = Digest(digest, output.data(), expected.size());
        } else if (kind == 6) {  // reduce-scatter, in place or not
          const DataType dtype = kDtypes[random() % 8];
          const ReduceOp op = kOps[random() % 4];
          const int64_t element = DataTypeSize(dtype);
          std::vector<int64_t> counts;
          int64_t total = 0, first = 0;
          for (int q = 0; q < size; ++q) {
            counts.push_back(static_cast<int64_t>(random() % (2 * half / element + 4)));
            if (q == rank) first = total;
            total += counts[q];
          }
          std::vector<Bytes> inputs;
          for (int q = 0; q < size; ++q) inputs.push_back(RandomInput(dtype, op, total, seed + q));
          const Bytes expected = Reference(dtype, op, inputs, total);
          const bool in_place = random() % 2 == 0;
          Bytes output(expected.size() + 1, kFill);
          if (in_place) std::copy(inputs[rank].begin(), inputs[rank].end(), output.begin());
          status = shm.ReduceScatter(in_place ? output.data() : inputs[rank].data(),
                                     output.data(), counts, dtype, op);
          const size_t begin = first * element, bytes = counts[rank] * element;
          EXPECT_TRUE(status.ok(), what << " reduce-scatter: " << status.message());
          ExpectSameBytes(expected.data() + begin, output.data() + begin, bytes,
                          what + " reduce-scatter of " + DataTypeName(dtype));
          EXPECT_TRUE(output.back() == kFill, what << ": wrote past the output");
          // Each rank holds a different slice: nothing for the shared digest.
        } else {  // exchange; now and then one rank's message is too big
          const int too_big = random() % 20 == 0 ? static_cast<int>(random() % size) : -1;
          std::vector<Bytes> messages;
          for (int q = 0; q < size; ++q) {
            const size_t bytes = q == too_big ? ShmCollectives::kExchangeCapacity + 1
                                              : random() % 300;
            messages.push_back(Pattern(seed + q, bytes));
          }
          status = shm.Exchange(messages[rank].data(), messages[rank].size(), &views, &fits);
          EXPECT_TRUE(status.ok(), what << " exchange: " << status.message());
          EXPECT_TRUE(fits == (too_big < 0), what << ": fits " << fits);
          if (fits) {
            EXPECT_TRUE(static_cast<int>(views.size()) == size, what << ": views " << views.size());
            for (int q = 0; q < size; ++q) {
              EXPECT_TRUE(views[q].second == messages[q].size(),
                          what << ": rank " << q << "'s message has " << views[q].second);
              ExpectSameBytes(messages[q].data(), views[q].first, messages[q].size(),
                              what + " exchange, rank " + std::to_string(q) + "'s message");
              digest = Digest(digest, views[q].first, views[q].second);
            }
          }
        }
      }
      const uint64_t mine[2] = {shm.steps(), digest};
      const Status status = shm.Exchange(mine, sizeof(mine), &views, &fits);
      EXPECT_TRUE(status.ok() && fits, status.message());
      for (int q = 0; q < size; ++q) {
        EXPECT_TRUE(views[q].second == sizeof(mine) &&
                        std::memcmp(views[q].first, mine, sizeof(mine)) == 0,
                    "rank " << q << " ended with other steps or data than rank " << rank
                            << " (steps " << mine[0] << ")");
      }
    });
  }
}

// --- Broadcast, allgather, exchange ---

// Every root at 1 to 3 ranks: 0 bytes, 1, an odd few, many chunks; nothing
// written past the buffer.
void BroadcastEveryRoot() {
  const int64_t half = kTestSlotBytes / 2;
  for (int size = 1; size <= 3; ++size) {
    RankOptions options;
    options.size = size;
    RunRanks(options, [&](int rank, ShmCollectives& shm, Shared&) {
      for (int root = 0; root < size; ++root) {
        for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{333}, half, 5 * half + 17}) {
          const std::string what = "broadcast of " + std::to_string(bytes) + " bytes from " +
                                   std::to_string(root) + " on " + std::to_string(size);
          const Bytes expected = Pattern(1000 * root + bytes, bytes);
          Bytes buffer(bytes + 2 * kGuard + 1, kFill);
          unsigned char* data = buffer.data() + kGuard + 1;  // not aligned
          const Bytes own = rank == root ? expected : Pattern(7 + rank, bytes);
          std::copy(own.begin(), own.end(), data);
          const Status status = shm.Broadcast(data, bytes, root);
          EXPECT_TRUE(status.ok(), what << ": " << status.message());
          ExpectSameBytes(expected.data(), data, bytes, what);
          EXPECT_TRUE(AllBytesAre(buffer.data(), kGuard + 1, kFill) &&
                          AllBytesAre(data + bytes, kGuard, kFill),
                      what << ": wrote outside the buffer");
        }
      }
    });
  }
}

// Parts of different sizes (some empty, one of many chunks, all empty), in
// place and not, at 1 to 3 ranks.
void AllgathervLayouts() {
  const int64_t half = kTestSlotBytes / 2;
  for (int size = 1; size <= 3; ++size) {
    std::vector<std::vector<int64_t>> layouts;
    layouts.emplace_back(size, 1001);
    layouts.emplace_back();
    for (int q = 0; q < size; ++q) layouts.back().push_back(q == 0 ? 0 : 777 * q + 1);
    layouts.emplace_back();
    for (int q = 0; q < size; ++q) layouts.back().push_back(q == size - 1 ? 3 * half + 5 : 17);
    layouts.emplace_back(size, 0);
    layouts.emplace_back();
    for (int q = 0; q < size; ++q) layouts.back().push_back(q == 0 ? half : 0);
    RankOptions options;
    options.size = size;
    RunRanks(options, [&](int rank, ShmCollectives& shm, Shared&) {
      for (size_t l = 0; l < layouts.size(); ++l) {
        for (bool in_place : {false, true}) {
          const std::vector<int64_t>& sizes = layouts[l];
          const std::string what = "allgatherv layout " + std::to_string(l) +
                                   (in_place ? " in place" : "") + " on " +
                                   std::to_string(size);
          Bytes expected;
          int64_t offset = 0;
          for (int q = 0; q < size; ++q) {
            if (q == rank) offset = expected.size();
            const Bytes part = Pattern(100 * l + q, sizes[q]);
            expected.insert(expected.end(), part.begin(), part.end());
          }
          const Bytes mine = Pattern(100 * l + rank, sizes[rank]);
          Bytes buffer(expected.size() + 2 * kGuard, kFill);
          unsigned char* output = buffer.data() + kGuard;
          if (in_place) std::copy(mine.begin(), mine.end(), output + offset);
          const Status status = shm.Allgatherv(in_place ? nullptr : mine.data(), output, sizes);
          EXPECT_TRUE(status.ok(), what << ": " << status.message());
          ExpectSameBytes(expected.data(), output, expected.size(), what);
          EXPECT_TRUE(AllBytesAre(buffer.data(), kGuard, kFill) &&
                          AllBytesAre(output + expected.size(), kGuard, kFill),
                      what << ": wrote outside the output");
        }
      }
    });
  }
}

void ExpectViews(const Views& views, const std::vector<Bytes>& messages, const std::string& what) {
  EXPECT_TRUE(views.size() == messages.size(), what << ": " << views.size() << " views");
  for (size_t q = 0; q < messages.size(); ++q) {
    EXPECT_TRUE(views[q].second == messages[q].size(),
                what << ": rank " << q << "'s message has " << views[q].second << " bytes, not "
                     << messages[q].size());
    ExpectSameBytes(messages[q].data(), views[q].first, messages[q].size(),
                    what + ": rank " + std::to_string(q) + "'s message");
  }
}

// Messages of different lengths (empty from a null pointer, up to exactly
// kExchangeCapacity), one byte too many on any one rank (fits == false on
// every rank, then the next exchange works), views that outlast the peers'
// next exchange and can be the data of this rank's next one.
void ExchangeMessages() {
  const size_t capacity = ShmCollectives::kExchangeCapacity;
  const size_t lengths[] = {0, 1, 4001, capacity};
  for (int size = 1; size <= 3; ++size) {
    RankOptions options;
    options.size = size;
    RunRanks(options, [&](int rank, ShmCollectives& shm, Shared&) {
      Views views;
      bool fits = false;
      for (int round = 0; round < 4; ++round) {
        std::vector<Bytes> messages;
        for (int q = 0; q < size; ++q) {
          messages.push_back(Pattern(10 * round + q, lengths[(q + round) % 4]));
        }
        const Bytes& mine = messages[rank];
        const Status status =
            shm.Exchange(mine.empty() ? nullptr : mine.data(), mine.size(), &views, &fits);
        const std::string what = "round " + std::to_string(round);
        EXPECT_TRUE(status.ok() && fits, what << ": " << status.message() << " fits " << fits);
        ExpectViews(views, messages, what);
      }
      for (int over = 0; over < size; ++over) {
        const Bytes mine = Pattern(rank, rank == over ? capacity + 1 : capacity);
        Status status = shm.Exchange(mine.data(), mine.size(), &views, &fits);
        EXPECT_TRUE(status.ok() && !fits, "rank " << over << " sent " << capacity + 1
                                                  << " bytes: fits " << fits << " on rank "
                                                  << rank << " " << status.message());
        std::vector<Bytes> messages;
        for (int q = 0; q < size; ++q) messages.push_back(Pattern(50 + q, capacity));
        status = shm.Exchange(messages[rank].data(), capacity, &views, &fits);
        EXPECT_TRUE(status.ok() && fits, "after a message too big: fits " << fits << " "
                                                                          << status.message());
        ExpectViews(views, messages, "after a message too big");
      }
      // Rank 0 reads its views while the others already wrote their next
      // message (they then wait for rank 0), then sends one of them on.
      std::vector<Bytes> first, second;
      for (int q = 0; q < size; ++q) {
        first.push_back(Pattern(200 + q, 100 + q));
        second.push_back(Pattern(300 + q, 200 + q));
      }
      second[0] = first[size - 1];  // rank 0 sends on what rank size - 1 sent it
      Status status = shm.Exchange(first[rank].data(), first[rank].size(), &views, &fits);
      EXPECT_TRUE(status.ok() && fits, status.message());
      if (rank == 0) {
        SleepMs(50);
        ExpectViews(views, first, "views of an exchange after the peers started the next");
      }
      const char* data = rank == 0 ? views[size - 1].first
                                   : reinterpret_cast<const char*>(second[rank].data());
      status = shm.Exchange(data, second[rank].size(), &views, &fits);
      EXPECT_TRUE(status.ok() && fits, status.message());
      ExpectViews(views, second, "an exchange sending on a view of the one before");
    });
  }
}

// --- The barrier ---

// ShmBarrier alone across processes: ranks that attach late (after rank 0
// already waits) disturb nothing, and over thousands of waits, some with a
// rank late so the others sleep, nobody passes wait k before every rank
// arrived at it, nor gets more than one wait ahead.
void BarrierAcrossProcesses() {
  const uint64_t waits = 2000;
  for (int size = 1; size <= 3; ++size) {
    SharedMemory area(ShmBarrier::Bytes(size));
    SharedMemory arrived_memory(kMaxRanks * 64);
    auto arrived = [&](int q) -> std::atomic<uint64_t>& {
      return *reinterpret_cast<std::atomic<uint64_t>*>(arrived_memory.data() + q * 64);
    };
    for (int q = 0; q < size; ++q) new (&arrived(q)) std::atomic<uint64_t>(0);
    std::vector<int> job_ranks(kJobRanks.begin(), kJobRanks.begin() + size);
    RunProcesses(size, ProcessOptions(), [&](int rank, Shared&) {
      SleepMs(20 * rank);
      ShmBarrier barrier(area.data(), rank, size, job_ranks);
      EXPECT_TRUE(barrier.rank() == rank && barrier.size() == size && barrier.steps() == 0,
                  "fresh barrier");
      std::mt19937 random(rank + 1);
      for (uint64_t k = 1; k <= waits; ++k) {
        if (random() % 64 == 0) usleep(random() % 2000);
        arrived(rank).store(k, std::memory_order_release);
        const Status status = barrier.Wait("test barrier", std::chrono::seconds(10));
        EXPECT_TRUE(status.ok(), "wait " << k << ": " << status.message());
        EXPECT_TRUE(barrier.steps() == k, "steps " << barrier.steps() << " after wait " << k);
        for (int q = 0; q < size; ++q) {
          const uint64_t at = arrived(q).load(std::memory_order_acquire);
          EXPECT_TRUE(at == k || at == k + 1,
                      "rank " << rank << " passed wait " << k << " with rank " << q << " at " << at);
        }
      }
    });
  }
}

// A peer that comes to a barrier after the others gave up on it (it was
// suspended longer than the timeout) must fail too, not pass on the others'
// old arrivals and go on alone; the ranks still waiting fail at once when
// the first gives up. At 2 and 3 ranks, the late rank last or first.
void LatePeerFailsToo() {
  const auto timeout = std::chrono::milliseconds(200);
  for (int size = 2; size <= 3; ++size) {
    for (int victim : {size - 1, 0}) {
      SharedMemory area(ShmBarrier::Bytes(size));
      std::vector<int> job_ranks(kJobRanks.begin(), kJobRanks.begin() + size);
      RunProcesses(size, ProcessOptions(), [&](int rank, Shared& shared) {
        ShmBarrier barrier(area.data(), rank, size, job_ranks);
        Status status = barrier.Wait("test operation", timeout);
        EXPECT_TRUE(status.ok(), "first wait: " << status.message());
        if (rank == victim) {
          // Comes once the others have given up and said so.
          EXPECT_TRUE(WaitForFinished(shared, size - 1, std::chrono::seconds(20)),
                      "the others did not give up");
          status = barrier.Wait("test operation", timeout);
          EXPECT_TRUE(status.code() == StatusCode::kAborted,
                      "the late rank passed a barrier the others gave up: " << status.message());
          EXPECT_TRUE(Contains(status, "gave up on a shared-memory test operation before rank " +
                                           std::to_string(kJobRanks[rank]) + " arrived"),
                      status.message());
          const Status later = barrier.Wait("test operation", timeout);
          EXPECT_TRUE(later.code() == StatusCode::kAborted, "a later wait: " << later.message());
          return;
        }
        const Clock::time_point start = Clock::now();
        status = barrier.Wait("test operation", timeout);
        const double waited = SecondsSince(start);
        EXPECT_TRUE(status.code() == StatusCode::kAborted, "passed without the late rank");
        EXPECT_TRUE(waited < 5, "gave up after " << waited << " s");
        const std::vector<int> named = NamedRanks(status.message(), "did not reach");
        EXPECT_TRUE(named == std::vector<int>{kJobRanks[victim]},
                    "does not name the late rank " << kJobRanks[victim] << ": "
                                                   << status.message());
      });
    }
  }
}

// Many trials of one barrier wait in which one rank comes near the moment
// the others give up (a random delay around the timeout): in each, either
// every rank passes or every rank fails. The outcome is decided by one
// atomic word, so no rank can pass on an arrival another rank took back.
void GiveUpRace() {
  constexpr int kTrials = 40;
  const auto timeout = std::chrono::milliseconds(10);
  for (int size = 2; size <= 3; ++size) {
    SharedMemory areas(kTrials * ShmBarrier::Bytes(size));
    SharedMemory start_area(ShmBarrier::Bytes(size));
    SharedMemory outcomes(kTrials * kMaxRanks);
    std::vector<int> job_ranks(kJobRanks.begin(), kJobRanks.begin() + size);
    RunProcesses(size, ProcessOptions(), [&](int rank, Shared&) {
      ShmBarrier start(start_area.data(), rank, size, job_ranks);
      std::mt19937 random(rank * 7919 + size);
      for (int t = 0; t < kTrials; ++t) {
        const Status ready = start.Wait("trial start", std::chrono::nanoseconds(0));
        EXPECT_TRUE(ready.ok(), ready.message());
        ShmBarrier barrier(areas.data() + t * ShmBarrier::Bytes(size), rank, size, job_ranks);
        if (rank == t % size) usleep(7000 + random() % 6000);  // 7-13 ms, around the 10 ms
        const Status status = barrier.Wait("race", timeout);
        outcomes.data()[t * kMaxRanks + rank] = status.ok() ? 1 : 2;
      }
      const Status done = start.Wait("trials done", std::chrono::nanoseconds(0));
      EXPECT_TRUE(done.ok(), done.message());
      for (int t = 0; t < kTrials; ++t) {
        for (int q = 0; q < size; ++q) {
          EXPECT_TRUE(outcomes.data()[t * kMaxRanks + q] == outcomes.data()[t * kMaxRanks],
                      "trial " << t << ": rank " << q << (outcomes.data()[t * kMaxRanks + q] == 1
                                                              ? " passed" : " failed")
                               << " and rank 0 did not");
        }
      }
    });
  }
}

// --- Failures ---

// Checks a failure of a peer: Aborted, naming job rank `job_rank` (only it)
// before `verb`, and mentioning `what`; then that later calls of every kind
// fail at once with the same status.
void ExpectBrokenBy(ShmCollectives& shm, const Status& status, const std::string& verb,
                    int job_rank, const std::string& what) {
  EXPECT_TRUE(status.code() == StatusCode::kAborted, what << ": " << status.message());
  const std::vector<int> named = NamedRanks(status.message(), verb);
  EXPECT_TRUE(std::count(named.begin(), named.end(), job_rank) == 1,
              "does not say rank " << job_rank << " " << verb << ": " << status.message());
  EXPECT_TRUE(Contains(status, "shared-memory " + what), "not about the " << what << ": "
                                                                         << status.message());
  Views views;
  bool fits = false;
  float data[300] = {};
  const std::vector<int64_t> sizes(shm.size(), 4);
  const Clock::time_point start = Clock::now();
  const Status later[] = {
      shm.Allreduce(data, data, 300, DataType::kFloat32, ReduceOp::kSum),
      shm.AllreduceSpans(SplitIntoSpans(data, data, 30, DataType::kInt32, 3), DataType::kInt32,
                         ReduceOp::kMax),
      shm.Broadcast(data, 100, 0),
      shm.Allgatherv(nullptr, data, sizes),
      shm.ReduceScatter(data, data, sizes, DataType::kFloat32, ReduceOp::kSum),
      shm.Exchange(data, 8, &views, &fits),
  };
  const double waited = SecondsSince(start);
  for (const Status& again : later) {
    EXPECT_TRUE(again.code() == StatusCode::kAborted && again.message() == status.message(),
                "a later call: " << again.message());
  }
  EXPECT_TRUE(waited < 1.0, "later calls waited " << waited << " s");
}

// A rank SIGKILLed while the others are in an operation (`exchange`: an
// Exchange, which has no timeout; otherwise a multi-chunk Allreduce or
// ReduceScatter): the
// others fail within seconds with Aborted naming its job rank as exited,
// and at once afterwards. At 2 and 3 ranks, the last rank or rank 0 dying,
// two ways: the victim kills itself instead of making the call (the others
// are in it already), or the parent kills it while every rank loops on calls
// (so it usually dies inside one).
enum class DeadPeerCall { kExchange, kAllreduce, kReduceScatter };

void DeadPeer(DeadPeerCall kind) {
  const bool exchange = kind == DeadPeerCall::kExchange;
  const std::string what = exchange                               ? "negotiation step"
                           : kind == DeadPeerCall::kAllreduce ? "allreduce"
                                                                  : "reduce-scatter";
  for (int size = 2; size <= 3; ++size) {
    for (int victim : {size - 1, 0}) {
      for (bool by_parent : {false, true}) {
        RankOptions options;
        options.size = size;
        options.job_ranks = true;
        options.timeout = std::chrono::seconds(30);
        options.process.deadline = std::chrono::seconds(30);
        options.process.may_be_killed = {victim};
        if (by_parent) {
          options.process.kill_rank = victim;
          options.process.kill_after = std::chrono::milliseconds(150);
        }
        RunRanks(options, [&](int rank, ShmCollectives& shm, Shared& shared) {
          std::vector<float> private_data(50001, 1.0f);
          float* data = private_data.data();
          Views views;
          bool fits = false;
          std::vector<int64_t> counts;
          for (int q = 0; q < size; ++q) {
            const int64_t n = static_cast<int64_t>(private_data.size());
            counts.push_back(n * (q + 1) / size - n * q / size);
          }
          auto call = [&] {
            switch (kind) {
              case DeadPeerCall::kExchange: return shm.Exchange(data, 64, &views, &fits);
              case DeadPeerCall::kAllreduce:
                return shm.Allreduce(data, data, private_data.size(), DataType::kFloat32,
                                     ReduceOp::kMax);
              case DeadPeerCall::kReduceScatter:
                return shm.ReduceScatter(data, data, counts, DataType::kFloat32, ReduceOp::kMax);
            }
            return Status::Internal("no such call");
          };
          for (int i = 0; i < 3; ++i) {
            const Status status = call();
            EXPECT_TRUE(status.ok(), "before the kill: " << status.message());
          }
          if (!by_parent && rank == victim) kill(getpid(), SIGKILL);
          Status status;
          const Clock::time_point start = Clock::now();
          while (status.ok() && SecondsSince(start) < 20) status = call();
          EXPECT_TRUE(rank != victim, "the victim outlived its kill");
          const int64_t killed_at = by_parent ? shared.killed_at_ns.load() : 0;
          const double noticed_after =
              by_parent ? (NowNs() - killed_at) / 1e9 : SecondsSince(start);
          EXPECT_TRUE(!by_parent || killed_at > 0, "failed before the kill: " << status.message());
          EXPECT_TRUE(noticed_after < 5, "noticed the death after " << noticed_after << " s");
          ExpectBrokenBy(shm, status, "exited", kJobRanks[victim], what);
          EXPECT_TRUE(Contains(status, "while rank " + std::to_string(kJobRanks[rank]) +
                                           " waited"),
                      "does not name the waiting rank " << kJobRanks[rank] << ": "
                                                        << status.message());
        });
      }
    }
  }
}

// A live peer that stops taking part: a negotiation step waits for it as
// long as it takes (here two timeouts), a data operation fails after the
// timeout (0.3 s) with Aborted naming it, and so do later calls, at once.
void PeerTimeout() {
  const auto timeout = std::chrono::milliseconds(300);
  for (int size = 2; size <= 3; ++size) {
    const int victim = size - 1;
    RankOptions options;
    options.size = size;
    options.job_ranks = true;
    options.timeout = timeout;
    options.process.deadline = std::chrono::seconds(30);
    RunRanks(options, [&](int rank, ShmCollectives& shm, Shared& shared) {
      Views views;
      bool fits = false;
      if (rank == victim) SleepMs(600);
      Status status = shm.Exchange(&rank, sizeof(rank), &views, &fits);
      EXPECT_TRUE(status.ok() && fits, "an exchange with a slow peer: " << status.message());
      std::vector<int32_t> data(1001, rank);
      status = shm.Allreduce(data.data(), data.data(), data.size(), DataType::kInt32,
                             ReduceOp::kSum);
      EXPECT_TRUE(status.ok() && data[1000] == size * (size - 1) / 2, status.message());
      if (rank == victim) {
        EXPECT_TRUE(WaitForFinished(shared, size - 1, std::chrono::seconds(20)),
                    "the others did not give up");
        return;
      }
      const Clock::time_point start = Clock::now();
      status = shm.Allreduce(data.data(), data.data(), data.size(), DataType::kInt32,
                             ReduceOp::kSum);
      const double waited = SecondsSince(start);
      EXPECT_TRUE(waited >= 0.29 && waited < 10, "gave up after " << waited << " s");
      ExpectBrokenBy(shm, status, "did not reach", kJobRanks[victim], "allreduce");
      EXPECT_TRUE(Contains(status, "within 0.3 s"), status.message());
    });
  }
}

// --- What a peer left in the segment ---

// A peer's exchange length word that is neither a message length nor the
// "too big" mark (a torn or stale write): Exchange fails with Aborted naming
// the peer, and no view reaches past the peer's area (before, the view
// claimed 1 TiB, and GatherToRoot copied it into a string: bad_alloc, or
// for 64 MiB a read far outside the segment). Rank 1 plays the broken peer
// with the barrier alone, writing its length word by hand.
void ExchangeBadLength() {
  const int size = 2;
  const size_t slot = kTestSlotBytes;
  const uint64_t bad_lengths[] = {uint64_t{1} << 40, 0x4000000,
                                  ShmCollectives::kExchangeCapacity + 1};
  for (uint64_t bad : bad_lengths) {
    const size_t bytes = ShmCollectives::SegmentBytes(size, slot);
    SharedMemory segment(bytes);
    const std::vector<int> job_ranks = {kJobRanks[0], kJobRanks[1]};
    RunProcesses(size, ProcessOptions(), [&](int rank, Shared&) {
      if (rank == 1) {
        ShmBarrier barrier(segment.data(), 1, size, job_ranks);
        // The first exchange's area of rank 1 (shm_collectives.h's layout:
        // the barrier, then the first set of per-rank areas).
        char* area = segment.data() + ShmBarrier::Bytes(size) +
                     ShmCollectives::kExchangeAreaBytes;
        std::memcpy(area, &bad, sizeof(bad));
        const Status arrived = barrier.WaitCallingPeers("negotiation step");
        EXPECT_TRUE(arrived.ok(), arrived.message());
        return;
      }
      std::unique_ptr<ShmCollectives> shm;
      const Status attached = ShmCollectives::Attach(segment.data(), bytes, 0, size, slot,
                                                     job_ranks, kDataTimeout, &shm);
      EXPECT_TRUE(attached.ok(), attached.message());
      Views views;
      bool fits = true;
      const Status status = shm->Exchange("abc", 3, &views, &fits);
      EXPECT_TRUE(status.code() == StatusCode::kAborted,
                  "a length word of " << bad << " passed: " << status.message());
      EXPECT_TRUE(Contains(status, "rank " + std::to_string(kJobRanks[1]) + "'s message") &&
                      Contains(status, "claims " + std::to_string(bad) + " bytes") &&
                      Contains(status, "restart the job"),
                  status.message());
      EXPECT_TRUE(!fits, "fits after a bad length");
      for (const auto& [data, length] : views) {
        EXPECT_TRUE(length <= ShmCollectives::kExchangeCapacity,
                    "a view of " << length << " bytes");
      }
    });
  }
}

// The barrier's "given up by" index comes from the shared word: one outside
// the ranks (a corrupted segment) is named as such, never looked up.
void GiverOutsideTheRanks() {
  const int size = 2;
  SharedMemory area(ShmBarrier::Bytes(size));
  ShmBarrier barrier(area.data(), 0, size, {kJobRanks[0], kJobRanks[1]});
  // The arrivals word (after the doorbell's three 32-bit words, 8-aligned):
  // given up (top bit) by local index 999 (bits 48 and up), no arrivals.
  const uint64_t word = (uint64_t{1} << 63) | (uint64_t{999} << 48);
  std::memcpy(area.data() + 16, &word, sizeof(word));
  const Status status = barrier.Wait("test operation", std::chrono::seconds(5));
  EXPECT_TRUE(status.code() == StatusCode::kAborted, status.message());
  EXPECT_TRUE(Contains(status, "an unknown rank (local index 999) gave up"), status.message());
}

// Slots so large that the segment's size does not fit a size_t: SegmentBytes
// says 0 instead of a wrapped small number, and Attach refuses (before, the
// size wrapped to a few KiB, the check passed and Slot(r) pointed outside
// the mapping).
void SegmentSizeOverflow() {
  const size_t huge_slot = (std::numeric_limits<size_t>::max() / 2 + 4096) / 128 * 128;
  EXPECT_TRUE(ShmCollectives::SegmentBytes(2, huge_slot) == 0,
              "SegmentBytes(2, " << huge_slot << ") = "
                                 << ShmCollectives::SegmentBytes(2, huge_slot));
  EXPECT_TRUE(ShmCollectives::SegmentBytes(0, 128) == 0, "SegmentBytes of 0 ranks");
  // The slots alone fit, the barrier and exchange areas on top do not.
  const size_t third = std::numeric_limits<size_t>::max() / 3 / 128 * 128;
  EXPECT_TRUE(ShmCollectives::SegmentBytes(3, third) == 0, "3 ranks of a third of size_t");
  SharedMemory segment(ShmCollectives::SegmentBytes(2, 128));
  std::unique_ptr<ShmCollectives> shm;
  const Status status = ShmCollectives::Attach(segment.data(), 8192, 0, 2, huge_slot, {0, 1},
                                               std::chrono::seconds(1), &shm);
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument &&
                  Contains(status, "need more bytes than a size_t holds"),
              status.message());
  EXPECT_TRUE(shm == nullptr, "attached with a segment that overflows");
}

// --- Arguments ---

void ExpectInvalid(const Status& status, const std::string& text) {
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument && Contains(status, text),
              "expected InvalidArgument with '" << text << "', got: " << status.message());
}

// Attach's checks, and the calls' argument checks (which return before any
// barrier, so they need no peer).
void AttachErrors() {
  const size_t slot = 128;
  const size_t bytes = ShmCollectives::SegmentBytes(2, slot);
  EXPECT_TRUE(bytes >= 2 * slot + 4 * ShmCollectives::kExchangeAreaBytes &&
                  bytes >= ShmCollectives::SegmentBytes(1, slot),
              "SegmentBytes(2, 128) = " << bytes);
  std::unique_ptr<void, decltype(&std::free)> memory(std::aligned_alloc(64, bytes + 128),
                                                     &std::free);
  char* base = static_cast<char*>(memory.get());
  std::memset(base, 0, bytes + 128);
  std::unique_ptr<ShmCollectives> shm;
  auto attach = [&](void* segment, size_t segment_bytes, int rank, int size, size_t slot_bytes,
                    std::vector<int> job_ranks) {
    shm.reset();
    const Status status = ShmCollectives::Attach(segment, segment_bytes, rank, size, slot_bytes,
                                                 std::move(job_ranks), std::chrono::seconds(1),
                                                 &shm);
    EXPECT_TRUE(status.ok() == (shm != nullptr), "Attach: " << status.message());
    return status;
  };
  const std::string prefix = "shared-memory collectives: ";
  ExpectInvalid(attach(base, bytes, -1, 2, slot, {0, 1}),
                prefix + "rank -1 of 2 ranks (2 job ranks named)");
  ExpectInvalid(attach(base, bytes, 2, 2, slot, {0, 1}), prefix + "rank 2 of 2 ranks");
  ExpectInvalid(attach(base, bytes, 0, 0, slot, {}), prefix + "rank 0 of 0 ranks");
  ExpectInvalid(attach(base, bytes, 0, 2, slot, {0, 1, 2}),
                prefix + "rank 0 of 2 ranks (3 job ranks named)");
  ExpectInvalid(attach(base, bytes, 1, 2, slot, {5}), "(1 job ranks named)");
  for (size_t bad : {size_t{0}, size_t{100}, size_t{192}}) {
    ExpectInvalid(attach(base, bytes, 0, 2, bad, {0, 1}),
                  prefix + "slots of " + std::to_string(bad) +
                      " bytes; they must be a positive multiple of 128");
  }
  ExpectInvalid(attach(base + 8, bytes, 0, 2, slot, {0, 1}),
                prefix + "segment not 64-byte aligned");
  ExpectInvalid(attach(nullptr, bytes, 0, 2, slot, {0, 1}), "segment not 64-byte aligned");
  ExpectInvalid(attach(base, bytes - 1, 0, 2, slot, {0, 1}),
                prefix + "a segment of " + std::to_string(bytes - 1) +
                    " bytes is too small for 2 ranks with slots of 128 bytes (" +
                    std::to_string(bytes) + " needed)");
  Status status = attach(base + 64, bytes, 1, 2, slot, {3, 8});
  EXPECT_TRUE(status.ok(), status.message());
  EXPECT_TRUE(shm->rank() == 1 && shm->size() == 2 && shm->steps() == 0,
              "attached as rank " << shm->rank() << " of " << shm->size());

  // On a 2-rank instance without its peer: argument errors, and calls with
  // nothing to do, return at once without a barrier.
  float value = 1.0f;
  ExpectInvalid(shm->Allreduce(&value, &value, 1, DataType::kFloat32, ReduceOp::kAverage),
                "shared-memory allreduce: unsupported op Average");
  ExpectInvalid(shm->Allreduce(&value, &value, -1, DataType::kFloat32, ReduceOp::kSum),
                "-1 elements");
  ExpectInvalid(shm->Allreduce(nullptr, &value, 1, DataType::kFloat32, ReduceOp::kSum),
                "null buffer");
  ExpectInvalid(shm->Allreduce(&value, nullptr, 1, DataType::kFloat32, ReduceOp::kSum),
                "null buffer");
  ExpectInvalid(shm->Broadcast(&value, 4, 2), "shared-memory broadcast: root 2 of 2 ranks");
  ExpectInvalid(shm->Broadcast(&value, 4, -1), "root -1 of 2 ranks");
  ExpectInvalid(shm->Allgatherv(&value, &value, {4}),
                "shared-memory allgather: 1 sizes for 2 ranks");
  EXPECT_TRUE(shm->Allreduce(nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum).ok() &&
                  shm->Broadcast(nullptr, 0, 1).ok() &&
                  shm->Allgatherv(nullptr, nullptr, {0, 0}).ok(),
              "empty calls failed");
  EXPECT_TRUE(shm->steps() == 0, "empty or bad calls took " << shm->steps() << " steps");

  // One rank alone: everything works, nothing waits.
  std::memset(base, 0, bytes);
  status = attach(base, bytes, 0, 1, slot, {6});
  EXPECT_TRUE(status.ok(), status.message());
  double numbers[3] = {1.5, -2, 3};
  double out[3] = {};
  EXPECT_TRUE(shm->Allreduce(numbers, out, 3, DataType::kFloat64, ReduceOp::kProduct).ok() &&
                  out[0] == 1.5 && out[1] == -2 && out[2] == 3,
              "1 rank allreduce");
  Views views;
  bool fits = false;
  EXPECT_TRUE(shm->Exchange("abc", 3, &views, &fits).ok() && fits && views.size() == 1 &&
                  views[0].second == 3 && std::memcmp(views[0].first, "abc", 3) == 0,
              "1 rank exchange");
}

// --- The segment (unchanged from the allreduce engine's tests) ---

// Missing names, duplicate names, sizes /dev/shm cannot hold, bad arguments:
// clear errors, no crash, nothing left behind.
void SegmentErrors() {
  std::unique_ptr<ShmSegment> segment;
  const std::string missing = UniqueName();
  Status status = ShmSegment::Open(missing, 4096, &segment);
  EXPECT_TRUE(status.code() == StatusCode::kFailedPrecondition && Contains(status, missing) &&
                  Contains(status, "does not exist"),
              status.message());

  const std::string name = UniqueName();
  std::unique_ptr<ShmSegment> first;
  status = ShmSegment::Create(name, 4096, &first);
  EXPECT_TRUE(status.ok(), status.message());
  status = ShmSegment::Create(name, 4096, &segment);
  EXPECT_TRUE(status.code() == StatusCode::kFailedPrecondition &&
                  Contains(status, "already exists"),
              status.message());
  status = ShmSegment::Open(name, 8192, &segment);
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument && Contains(status, "4096 bytes"),
              status.message());
  std::unique_ptr<ShmSegment> second;
  status = ShmSegment::Open(name, 4096, &second);
  EXPECT_TRUE(status.ok(), status.message());
  static_cast<char*>(first->data())[100] = 42;
  EXPECT_TRUE(static_cast<char*>(second->data())[100] == 42, "the two mappings differ");
  EXPECT_TRUE(first->Unlink().ok() && first->Unlink().ok() && second->Unlink().ok(),
              "Unlink is not idempotent");
  status = ShmSegment::Open(name, 4096, &segment);
  EXPECT_TRUE(status.code() == StatusCode::kFailedPrecondition, "still there after Unlink");
  EXPECT_TRUE(second->size() == 4096 && static_cast<char*>(second->data())[100] == 42,
              "the mapping did not survive Unlink");

  const std::string huge = UniqueName();
  const size_t huge_bytes = size_t{1} << 50;  // 1 PiB
  status = ShmSegment::Create(huge, huge_bytes, &segment);
  EXPECT_TRUE(status.code() == StatusCode::kResourceExhausted &&
                  Contains(status, std::to_string(huge_bytes)) &&
                  Contains(status, "TFRING_SHM_BYTES") && Contains(status, "--shm-size"),
              status.message());
  status = ShmSegment::Open(huge, 4096, &segment);
  EXPECT_TRUE(status.code() == StatusCode::kFailedPrecondition,
              "a failed Create left its name behind");

  for (const std::string bad : {"", "/", "no_slash", "/a/b"}) {
    status = ShmSegment::Create(bad, 4096, &segment);
    EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument, "name '" << bad << "'");
  }
  status = ShmSegment::Create(UniqueName(), 0, &segment);
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument, "0 bytes: " << status.message());
}

// --- bench ---

// Tensors of the spans bench.
constexpr int kBenchTensors = 64;

struct Timing {
  double median_ms;
  double min_ms;
};

Timing Summarize(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  return {seconds[seconds.size() / 2] * 1e3, seconds[0] * 1e3};
}

// Per call, the slowest rank's time of `mode` (float32 Sum of `count`), or
// with `reduce_scatter` of a ReduceScatter into even slices instead.
Timing BenchMode(int size, int64_t count, size_t slot_bytes, Mode mode, int iterations,
                 bool reduce_scatter = false) {
  SharedMemory times(sizeof(double) * size * iterations);
  double* seconds = reinterpret_cast<double*>(times.data());
  RankOptions options;
  options.size = size;
  options.slot_bytes = slot_bytes;
  options.timeout = std::chrono::seconds(60);
  options.process.deadline = std::chrono::seconds(300);
  RunRanks(options, [&](int rank, ShmCollectives& shm, Shared&) {
    std::vector<float> input(count, 1.0f + rank), output(count, 0.0f);
    float* from = input.data();
    float* to = output.data();
    if (mode == Mode::kInPlace) to = from;
    // As a round of gradients: the same bytes in tensors of uneven sizes.
    const std::vector<ReduceSpan> spans =
        SplitIntoSpans(from, to, count, DataType::kFloat32, kBenchTensors);
    // Even slices, for the reduce-scatter.
    std::vector<int64_t> counts;
    for (int q = 0; q < size; ++q) counts.push_back(count * (q + 1) / size - count * q / size);
    for (int i = -2; i < iterations; ++i) {  // two to warm up
      const Clock::time_point start = Clock::now();
      const Status status =
          mode == Mode::kSpans ? shm.AllreduceSpans(spans, DataType::kFloat32, ReduceOp::kSum)
          : reduce_scatter
              ? shm.ReduceScatter(from, to, counts, DataType::kFloat32, ReduceOp::kSum)
              : shm.Allreduce(from, to, count, DataType::kFloat32, ReduceOp::kSum);
      if (i >= 0) seconds[rank * iterations + i] = SecondsSince(start);
      EXPECT_TRUE(status.ok(), status.message());
    }
  });
  std::vector<double> slowest(iterations, 0);
  for (int i = 0; i < iterations; ++i) {
    for (int r = 0; r < size; ++r) slowest[i] = std::max(slowest[i], seconds[r * iterations + i]);
  }
  return Summarize(slowest);
}

// bench <ranks> <MiB> [slot KiB]: float32 Sum, chunked (out of place, in
// place, and as kBenchTensors tensors in one AllreduceSpans) and as a
// reduce-scatter, against memcpy of the same bytes. Prints times, asserts
// nothing.
int Bench(int size, double mib, size_t slot_kib) {
  const int64_t count = std::max<int64_t>(1, static_cast<int64_t>(mib * 1024 * 1024 / 4));
  const double bytes = count * 4.0;
  const size_t slot_bytes = std::max<size_t>(128, slot_kib * 1024 / 128 * 128);
  const int iterations = std::max(5, std::min(200, static_cast<int>(1e9 / bytes)));
  auto line = [&](const char* what, const Timing& t) {
    std::printf("  %-28s median %9.3f ms  min %9.3f ms  (%6.2f GB/s at the median)\n", what,
                t.median_ms, t.min_ms, bytes / (t.median_ms * 1e-3) / 1e9);
  };
  std::printf("ranks %d, %.2f MiB float32 Sum, slots of %zu KiB, %d calls"
              " (per call the slowest rank)\n",
              size, bytes / 1024 / 1024, slot_bytes / 1024, iterations);
  line("chunked:", BenchMode(size, count, slot_bytes, Mode::kChunked, iterations));
  line("chunked in place:", BenchMode(size, count, slot_bytes, Mode::kInPlace, iterations));
  const std::string spans = "spans (" + std::to_string(kBenchTensors) + " tensors):";
  line(spans.c_str(), BenchMode(size, count, slot_bytes, Mode::kSpans, iterations));
  line("reduce-scatter:", BenchMode(size, count, slot_bytes, Mode::kChunked, iterations, true));
  std::vector<char> from(static_cast<size_t>(bytes), 1), to(static_cast<size_t>(bytes));
  std::vector<double> seconds;
  for (int i = -2; i < iterations; ++i) {
    const Clock::time_point start = Clock::now();
    std::memcpy(to.data(), from.data(), from.size());
    if (i >= 0) seconds.push_back(SecondsSince(start));
    from[i + 2] = to[from.size() - 1 - i - 2];  // keep the copies from being dropped
  }
  line("memcpy (one thread):", Summarize(seconds));
  return 0;
}

const std::vector<std::pair<std::string, std::function<void()>>>& Scenarios() {
  static const auto* scenarios = new std::vector<std::pair<std::string, std::function<void()>>>{
      {"allreduce_uint8", [] { AllreduceEveryOp(DataType::kUInt8); }},
      {"allreduce_int8", [] { AllreduceEveryOp(DataType::kInt8); }},
      {"allreduce_int32", [] { AllreduceEveryOp(DataType::kInt32); }},
      {"allreduce_int64", [] { AllreduceEveryOp(DataType::kInt64); }},
      {"allreduce_float16", [] { AllreduceEveryOp(DataType::kFloat16); }},
      {"allreduce_bfloat16", [] { AllreduceEveryOp(DataType::kBFloat16); }},
      {"allreduce_float32", [] { AllreduceEveryOp(DataType::kFloat32); }},
      {"allreduce_float64", [] { AllreduceEveryOp(DataType::kFloat64); }},
      {"allreduce_tiny_slot", AllreduceTinySlot},
      {"allreduce_spans", AllreduceSpansEveryDtype},
      {"round_calls", RoundCalls},
      {"many_mixed_calls", ManyMixedCalls},
      {"broadcast_every_root", BroadcastEveryRoot},
      {"allgatherv_layouts", AllgathervLayouts},
      {"reduce_scatter_layouts", ReduceScatterLayouts},
      {"reduce_scatter_tiny_slot", ReduceScatterTinySlot},
      {"exchange_messages", ExchangeMessages},
      {"barrier_across_processes", BarrierAcrossProcesses},
      {"late_peer_fails_too", LatePeerFailsToo},
      {"give_up_race", GiveUpRace},
      {"dead_peer_allreduce", [] { DeadPeer(DeadPeerCall::kAllreduce); }},
      {"dead_peer_exchange", [] { DeadPeer(DeadPeerCall::kExchange); }},
      {"dead_peer_reduce_scatter", [] { DeadPeer(DeadPeerCall::kReduceScatter); }},
      {"peer_timeout", PeerTimeout},
      {"attach_errors", AttachErrors},
      {"exchange_bad_length", ExchangeBadLength},
      {"giver_outside_the_ranks", GiverOutsideTheRanks},
      {"segment_size_overflow", SegmentSizeOverflow},
      {"segment_errors", SegmentErrors},
  };
  return *scenarios;
}

}  // namespace
}  // namespace tfring

int main(int argc, char** argv) {
  using tfring::Scenarios;
  using ::tfring::testing::TestFailure;
  if (argc >= 4 && std::string(argv[1]) == "bench") {
    try {
      return tfring::Bench(std::atoi(argv[2]), std::atof(argv[3]),
                           argc >= 5 ? std::atoi(argv[4]) : 32 * 1024);
    } catch (const TestFailure& failure) {
      std::printf("bench failed: %s\n", failure.message.c_str());
      return 1;
    }
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <scenario|all|list> | bench <ranks> <MiB> [slot KiB]\n",
                 argv[0]);
    return 2;
  }
  return ::tfring::testing::RunScenarios(Scenarios(), argv[1], "", [](auto fn) { fn(); });
}
