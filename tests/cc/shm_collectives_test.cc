// Tests of the shared-memory allreduce engine (cc/shm_allreduce.h) and its
// segment (cc/shm_segment.h), with ranks as threads of one process: thread 0
// creates the segment, the others open it, then it is unlinked and each
// thread drives its own ShmAllreduce over it.
//
// Usage: shm_allreduce_test <scenario|all|list>
//        shm_allreduce_test bench <ranks> <MiB> [chunk KiB]
// Prints "PASS <scenario>" or "FAIL <scenario>: why" per scenario and exits
// non-zero if any failed; `bench` prints GB/s (no assertions). Driven from
// tests/test_shm_allreduce.py.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cc/reduce_kernels.h"
#include "cc/shm_allreduce.h"
#include "cc/shm_segment.h"
#include "tests/cc/expect.h"

namespace tfring {
namespace {

using ::tfring::testing::TestFailure;
using Bytes = std::vector<unsigned char>;

constexpr int64_t kLargeCount = 1000003;
// Not a power of two, so chunk and slice boundaries fall at odd places.
constexpr size_t kTestChunkBytes = 64 * 1000;
constexpr std::chrono::nanoseconds kTestTimeout = std::chrono::seconds(20);

std::string UniqueName() {
  static std::atomic<int> counter{0};
  return "/tfring_shm_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
}

// Blocks until `count` threads have arrived (reusable).
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int count) : count_(count) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    changed_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  const int count_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// Runs body(rank, allreduce) on `size` threads over one fresh segment and
// rethrows the first failure.
void RunRanks(int size, size_t chunk_bytes, std::chrono::nanoseconds timeout,
              const std::function<void(int, ShmAllreduce&)>& body) {
  const std::string name = UniqueName();
  const size_t bytes = ShmAllreduce::SegmentBytes(size, chunk_bytes);
  ThreadBarrier barrier(size);
  std::mutex failure_mutex;
  std::string failure;
  auto record = [&](const std::string& message) {
    std::lock_guard<std::mutex> lock(failure_mutex);
    if (failure.empty()) failure = message;
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      std::unique_ptr<ShmSegment> segment;
      Status created;
      if (rank == 0) created = ShmSegment::Create(name, bytes, &segment);
      barrier.Wait();
      if (rank != 0) created = ShmSegment::Open(name, bytes, &segment);
      barrier.Wait();
      if (rank == 0 && created.ok()) created = segment->Unlink();
      if (!created.ok()) {
        record("rank " + std::to_string(rank) + ": " + created.message());
        return;  // the others then time out rather than hang
      }
      std::unique_ptr<ShmAllreduce> allreduce;
      Status attached =
          ShmAllreduce::Attach(segment->data(), segment->size(), rank, size, chunk_bytes,
                               timeout, &allreduce);
      if (!attached.ok()) {
        record(attached.message());
        return;
      }
      try {
        body(rank, *allreduce);
      } catch (const TestFailure& f) {
        record("rank " + std::to_string(rank) + ": " + f.message);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_TRUE(failure.empty(), failure);
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

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ReferenceSixteenBit(ReduceOp op, const std::vector<Bytes>& inputs, int64_t count,
                         Bytes* out) {
  out->resize(count * 2);
  for (int64_t i = 0; i < count; ++i) {
    uint16_t acc;
    std::memcpy(&acc, inputs[0].data() + i * 2, 2);
    for (size_t r = 1; r < inputs.size(); ++r) {
      uint16_t value;
      std::memcpy(&value, inputs[r].data() + i * 2, 2);
      acc = FromFloat(Apply(op, ToFloat(acc), ToFloat(value)));
    }
    std::memcpy(out->data() + i * 2, &acc, 2);
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

// Values whose reductions over 4 ranks stay in range (no signed overflow).
Bytes RandomInput(DataType dtype, ReduceOp op, int64_t count, uint32_t seed) {
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
      case DataType::kInt8: put(static_cast<int8_t>(product ? integer(-3, 3) : integer(-30, 30)));
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

std::string Describe(int size, DataType dtype, ReduceOp op, int64_t count) {
  return std::string(ReduceOpName(op)) + " " + DataTypeName(dtype) + " x" +
         std::to_string(count) + " on " + std::to_string(size) + " ranks";
}

void ExpectMatches(const Bytes& expected, const Bytes& got, const std::string& what) {
  EXPECT_TRUE(expected.size() == got.size(), what << ": size " << got.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(expected[i] == got[i], what << ": first differing byte " << i);
  }
}

// One allreduce on `size` ranks, checked against the reference on every rank.
void CheckOne(int size, size_t chunk_bytes, DataType dtype, ReduceOp op, int64_t count,
              bool in_place) {
  std::vector<Bytes> inputs;
  for (int r = 0; r < size; ++r) {
    inputs.push_back(RandomInput(dtype, op, count, 1000 * size + 10 * r + count % 7));
  }
  const Bytes expected = Reference(dtype, op, inputs, count);
  std::vector<Bytes> outputs(size, Bytes(count * DataTypeSize(dtype), 0xAB));
  const std::string what = Describe(size, dtype, op, count);
  RunRanks(size, chunk_bytes, kTestTimeout, [&](int rank, ShmAllreduce& allreduce) {
    if (in_place) outputs[rank] = inputs[rank];
    const void* input = in_place ? outputs[rank].data() : inputs[rank].data();
    Status status = allreduce.Allreduce(input, outputs[rank].data(), count, dtype, op);
    EXPECT_TRUE(status.ok(), what << ": " << status.message());
  });
  for (int r = 0; r < size; ++r) {
    ExpectMatches(expected, outputs[r], what + ", rank " + std::to_string(r));
  }
}

void EveryOpAndSize(DataType dtype) {
  for (int size = 1; size <= 4; ++size) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{size - 1}, kLargeCount}) {
        CheckOne(size, kTestChunkBytes, dtype, op, count, /*in_place=*/false);
      }
    }
  }
}

// Thousands of small allreduces in a row, of mixed dtypes, ops and counts:
// the step counters keep growing and the slot sets keep alternating.
void ManyConsecutive() {
  const int size = 3;
  const int calls = 3000;
  const DataType dtypes[] = {DataType::kFloat32, DataType::kInt64, DataType::kBFloat16,
                             DataType::kUInt8};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProduct};
  const size_t chunk_bytes = 256;
  RunRanks(size, chunk_bytes, kTestTimeout, [&](int rank, ShmAllreduce& allreduce) {
    uint64_t chunks = 0;
    for (int call = 0; call < calls; ++call) {
      const DataType dtype = dtypes[call % 4];
      const ReduceOp op = ops[(call / 4) % 4];
      const int64_t count = (call * 37) % 150;
      std::vector<Bytes> inputs;
      for (int r = 0; r < size; ++r) inputs.push_back(RandomInput(dtype, op, count, call + r));
      const Bytes expected = Reference(dtype, op, inputs, count);
      Bytes output(expected.size());
      Status status = allreduce.Allreduce(inputs[rank].data(), output.data(), count, dtype, op);
      EXPECT_TRUE(status.ok(), "call " << call << ": " << status.message());
      ExpectMatches(expected, output, "call " + std::to_string(call) + " " +
                                          Describe(size, dtype, op, count));
      const int64_t per_chunk = chunk_bytes / DataTypeSize(dtype);
      chunks += (count + per_chunk - 1) / per_chunk;
    }
    EXPECT_TRUE(allreduce.steps() == 2 * chunks,
                "steps " << allreduce.steps() << " after " << chunks << " chunks");
  });
}

// input == output, large and small, on every size.
void InPlace() {
  for (int size = 1; size <= 4; ++size) {
    CheckOne(size, kTestChunkBytes, DataType::kFloat32, ReduceOp::kSum, kLargeCount, true);
    CheckOne(size, kTestChunkBytes, DataType::kInt64, ReduceOp::kMax, kLargeCount, true);
    CheckOne(size, kTestChunkBytes, DataType::kFloat16, ReduceOp::kSum, 3, true);
  }
}

// The smallest chunk (64 bytes: one cache line, so at most one rank has a
// non-empty slice) against counts around it.
void TinyChunks() {
  for (int size = 2; size <= 4; ++size) {
    for (int64_t count = 0; count <= 40; ++count) {
      CheckOne(size, 64, DataType::kFloat64, ReduceOp::kSum, count, false);
    }
    CheckOne(size, 64, DataType::kInt8, ReduceOp::kMin, 1000, false);
  }
}

// One rank attaches but never calls: the others fail with Aborted naming it
// once the timeout has passed, and keep failing at once afterwards.
void DeadPeer() {
  const int size = 3;
  const auto timeout = std::chrono::milliseconds(500);
  for (int dead : {2, 0}) {
    RunRanks(size, kTestChunkBytes, timeout, [&](int rank, ShmAllreduce& allreduce) {
      if (rank == dead) return;
      std::vector<float> data(1000, 1.0f);
      const auto start = std::chrono::steady_clock::now();
      Status status = allreduce.Allreduce(data.data(), data.data(), 1000, DataType::kFloat32,
                                          ReduceOp::kSum);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_TRUE(status.code() == StatusCode::kAborted, "status " << status.message());
      const std::string named = "rank " + std::to_string(dead) + " did not arrive";
      EXPECT_TRUE(status.message().find(named) != std::string::npos,
                  "message does not name rank " << dead << ": " << status.message());
      EXPECT_TRUE(waited >= 0.45 && waited < 3.0, "aborted after " << waited << " s");
      const auto again = std::chrono::steady_clock::now();
      Status second = allreduce.Allreduce(data.data(), data.data(), 1000, DataType::kFloat32,
                                          ReduceOp::kSum);
      EXPECT_TRUE(second.code() == StatusCode::kAborted, "second call: " << second.message());
      EXPECT_TRUE(std::chrono::steady_clock::now() - again < std::chrono::milliseconds(100),
                  "the second call waited again");
    });
  }
}

bool Contains(const Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

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

// Attach's and Allreduce's argument checks.
void BadArguments() {
  const size_t bytes = ShmAllreduce::SegmentBytes(2, 128);
  std::unique_ptr<void, decltype(&std::free)> memory(std::aligned_alloc(64, bytes + 64),
                                                     &std::free);
  char* base = static_cast<char*>(memory.get());
  std::unique_ptr<ShmAllreduce> allreduce;
  const auto timeout = std::chrono::seconds(1);
  Status status = ShmAllreduce::Attach(base, bytes - 8, 0, 2, 128, timeout, &allreduce);
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument && Contains(status, "too small"),
              status.message());
  status = ShmAllreduce::Attach(base + 8, bytes, 0, 2, 128, timeout, &allreduce);
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument && Contains(status, "aligned"),
              status.message());
  status = ShmAllreduce::Attach(base, bytes, 0, 2, 100, timeout, &allreduce);
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument, "chunk of 100 bytes accepted");
  status = ShmAllreduce::Attach(base, bytes, 2, 2, 128, timeout, &allreduce);
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument, "rank 2 of 2 accepted");
  std::memset(base, 0, bytes);
  status = ShmAllreduce::Attach(base, bytes, 0, 1, 128, timeout, &allreduce);
  EXPECT_TRUE(status.ok(), status.message());
  float value = 1.0f;
  status = allreduce->Allreduce(&value, &value, 1, DataType::kFloat32, ReduceOp::kAverage);
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument && Contains(status, "Average"),
              status.message());
  status = allreduce->Allreduce(&value, &value, -1, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument, "count -1 accepted");
}

// bench <ranks> <MiB> [chunk KiB]: float32 Sum throughput against memcpy.
int Bench(int size, double mib, size_t chunk_kib) {
  const int64_t count = static_cast<int64_t>(mib * 1024 * 1024 / 4);
  const double bytes = count * 4.0;
  const size_t chunk_bytes = chunk_kib * 1024;
  const int iterations = std::max(3, static_cast<int>(2e9 / bytes));
  std::vector<double> seconds(size);
  RunRanks(size, chunk_bytes, std::chrono::seconds(60), [&](int rank, ShmAllreduce& allreduce) {
    std::vector<float> input(count, 1.0f + rank), output(count);
    for (int warm = 0; warm < 2; ++warm) {
      allreduce.Allreduce(input.data(), output.data(), count, DataType::kFloat32,
                          ReduceOp::kSum);
    }
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) {
      Status status = allreduce.Allreduce(input.data(), output.data(), count,
                                          DataType::kFloat32, ReduceOp::kSum);
      EXPECT_TRUE(status.ok(), status.message());
    }
    seconds[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                        .count() / iterations;
  });
  std::vector<char> from(static_cast<size_t>(bytes), 1), to(static_cast<size_t>(bytes));
  std::memcpy(to.data(), from.data(), from.size());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    std::memcpy(to.data(), from.data(), from.size());
    from[i % from.size()] = static_cast<char>(to[(i * 7) % to.size()]);
  }
  const double memcpy_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      iterations;
  double slowest = 0;
  for (double s : seconds) slowest = std::max(slowest, s);
  std::printf("ranks %d, %.1f MiB float32 Sum, chunk %zu KiB, %d iterations\n", size, mib,
              chunk_kib, iterations);
  std::printf("  shm allreduce: %8.3f ms  %6.2f GB/s (bytes per rank / time)\n",
              slowest * 1e3, bytes / slowest / 1e9);
  std::printf("  memcpy:        %8.3f ms  %6.2f GB/s (one thread, same bytes)\n",
              memcpy_s * 1e3, bytes / memcpy_s / 1e9);
  std::printf("  allreduce time / memcpy time: %.2f\n", slowest / memcpy_s);
  return 0;
}

const std::vector<std::pair<std::string, std::function<void()>>>& Scenarios() {
  static const auto* scenarios = new std::vector<std::pair<std::string, std::function<void()>>>{
      {"ops_uint8", [] { EveryOpAndSize(DataType::kUInt8); }},
      {"ops_int8", [] { EveryOpAndSize(DataType::kInt8); }},
      {"ops_int32", [] { EveryOpAndSize(DataType::kInt32); }},
      {"ops_int64", [] { EveryOpAndSize(DataType::kInt64); }},
      {"ops_float16", [] { EveryOpAndSize(DataType::kFloat16); }},
      {"ops_bfloat16", [] { EveryOpAndSize(DataType::kBFloat16); }},
      {"ops_float32", [] { EveryOpAndSize(DataType::kFloat32); }},
      {"ops_float64", [] { EveryOpAndSize(DataType::kFloat64); }},
      {"many_consecutive", ManyConsecutive},
      {"in_place", InPlace},
      {"tiny_chunks", TinyChunks},
      {"dead_peer", DeadPeer},
      {"segment_errors", SegmentErrors},
      {"bad_arguments", BadArguments},
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
                           argc >= 5 ? std::atoi(argv[4]) : 1024);
    } catch (const TestFailure& failure) {
      std::printf("bench failed: %s\n", failure.message.c_str());
      return 1;
    }
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <scenario|all|list> | bench <ranks> <MiB> [chunk KiB]\n",
                 argv[0]);
    return 2;
  }
  return ::tfring::testing::RunScenarios(Scenarios(), argv[1], "", [](auto fn) { fn(); });
}
