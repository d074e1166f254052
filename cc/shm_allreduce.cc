#include "cc/shm_allreduce.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "cc/reduce_kernels.h"

namespace tfring {
namespace {

constexpr size_t kCacheLine = 64;
// Spins before the first yield: about a microsecond or two of polling.
constexpr int kSpinsBeforeYield = 256;
// Yields until a wait has lasted this long, then sleeps (on a host with few
// cores a spinning rank would steal the core of the rank it waits for).
constexpr std::chrono::microseconds kYieldFor{100};
constexpr std::chrono::microseconds kFirstSleep{10};
constexpr std::chrono::microseconds kLongestSleep{500};
// The reduction walks its slice in blocks this big, so the accumulator
// stays in cache while every rank's block is folded into it.
constexpr size_t kReduceBlockBytes = 32 * 1024;

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the step counters live in shared memory and must be lock-free");
static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t),
              "a step counter must be a plain 64-bit word");

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

bool IsSupportedOp(ReduceOp op) {
  return op == ReduceOp::kSum || op == ReduceOp::kMin || op == ReduceOp::kMax ||
         op == ReduceOp::kProduct;
}

std::string Seconds(std::chrono::nanoseconds duration) {
  std::ostringstream text;
  text << std::chrono::duration<double>(duration).count() << " s";
  return text.str();
}

}  // namespace

size_t ShmAllreduce::ControlBytes(int size) {
  return static_cast<size_t>(size) * kCacheLine;
}

size_t ShmAllreduce::SegmentBytes(int size, size_t chunk_bytes) {
  // Two sets of `size` slots (alternate chunks use alternate sets).
  return ControlBytes(size) + 2 * static_cast<size_t>(size) * chunk_bytes;
}

Status ShmAllreduce::Attach(void* segment, size_t segment_bytes, int rank, int size,
                            size_t chunk_bytes, std::chrono::nanoseconds timeout,
                            std::unique_ptr<ShmAllreduce>* allreduce) {
  if (size < 1 || rank < 0 || rank >= size) {
    return Status::InvalidArgument("shared-memory allreduce: rank " + std::to_string(rank) +
                                   " of " + std::to_string(size) + " ranks");
  }
  if (chunk_bytes == 0 || chunk_bytes % kCacheLine != 0) {
    return Status::InvalidArgument("shared-memory allreduce: chunk of " +
                                   std::to_string(chunk_bytes) +
                                   " bytes; it must be a positive multiple of 64");
  }
  if (segment == nullptr || reinterpret_cast<uintptr_t>(segment) % kCacheLine != 0) {
    return Status::InvalidArgument("shared-memory allreduce: segment not 64-byte aligned");
  }
  const size_t needed = SegmentBytes(size, chunk_bytes);
  if (segment_bytes < needed) {
    return Status::InvalidArgument(
        "shared-memory allreduce: a segment of " + std::to_string(segment_bytes) +
        " bytes is too small for " + std::to_string(size) + " ranks with chunks of " +
        std::to_string(chunk_bytes) + " bytes (" + std::to_string(needed) + " needed)");
  }
  allreduce->reset(
      new ShmAllreduce(static_cast<char*>(segment), rank, size, chunk_bytes, timeout));
  return Status::OK();
}

ShmAllreduce::ShmAllreduce(char* segment, int rank, int size, size_t chunk_bytes,
                           std::chrono::nanoseconds timeout)
    : segment_(segment), rank_(rank), size_(size), chunk_bytes_(chunk_bytes),
      timeout_(timeout) {
  // Starts the counters' lifetime in this process without writing to them
  // (std::atomic's default constructor is trivial): the creator's zero fill
  // is their initial value, and peers may already have advanced theirs.
  for (int r = 0; r < size_; ++r) new (segment_ + r * kCacheLine) std::atomic<uint64_t>;
}

std::atomic<uint64_t>& ShmAllreduce::StepFlag(int rank) const {
  return *std::launder(reinterpret_cast<std::atomic<uint64_t>*>(segment_ + rank * kCacheLine));
}

char* ShmAllreduce::Slot(uint64_t chunk, int rank) const {
  const size_t set = static_cast<size_t>(chunk % 2);
  return segment_ + ControlBytes(size_) + (set * size_ + rank) * chunk_bytes_;
}

Status ShmAllreduce::Barrier() {
  const uint64_t target = ++steps_;
  StepFlag(rank_).store(target, std::memory_order_release);
  auto all_arrived = [&] {
    for (int r = 0; r < size_; ++r) {
      if (StepFlag(r).load(std::memory_order_acquire) < target) return false;
    }
    return true;
  };
  const auto start = std::chrono::steady_clock::now();
  for (int spin = 0; spin < kSpinsBeforeYield; ++spin) {
    if (all_arrived()) return Status::OK();
    CpuRelax();
  }
  std::chrono::microseconds sleep = kFirstSleep;
  while (!all_arrived()) {
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited < kYieldFor) {
      std::this_thread::yield();
      continue;
    }
    if (waited > timeout_) {
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (StepFlag(r).load(std::memory_order_acquire) < target) missing.push_back(r);
      }
      if (missing.empty()) return Status::OK();  // arrived just now
      broken_ = Status::Aborted(
          "shared-memory allreduce on rank " + std::to_string(rank_) + ": " +
          RanksToString(missing) + " did not arrive within " + Seconds(timeout_) +
          " (barrier step " + std::to_string(target) +
          "); a peer died or stopped calling, and the local ranks can no longer agree");
      return broken_;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kLongestSleep);
  }
  return Status::OK();
}

Status ShmAllreduce::Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                               ReduceOp op) {
  if (!broken_.ok()) return broken_;
  if (!IsSupportedOp(op)) {
    return Status::InvalidArgument(std::string("shared-memory allreduce: unsupported op ") +
                                   ReduceOpName(op) + " (Sum, Min, Max or Product)");
  }
  if (count < 0 || (count > 0 && (input == nullptr || output == nullptr))) {
    return Status::InvalidArgument("shared-memory allreduce: " + std::to_string(count) +
                                   " elements with a null buffer or a negative count");
  }
  const int64_t element_bytes = DataTypeSize(dtype);
  const int64_t chunk_elements = static_cast<int64_t>(chunk_bytes_) / element_bytes;
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  for (int64_t done = 0; done < count; done += chunk_elements) {
    const int64_t elements = std::min(chunk_elements, count - done);
    TFRING_RETURN_IF_ERROR(ReduceChunk(in + done * element_bytes, out + done * element_bytes,
                                       elements, dtype, op));
  }
  return Status::OK();
}

Status ShmAllreduce::ReduceChunk(const void* input, void* output, int64_t count,
                                 DataType dtype, ReduceOp op) {
  const uint64_t chunk = chunks_++;
  const int64_t element_bytes = DataTypeSize(dtype);
  const size_t bytes = static_cast<size_t>(count * element_bytes);
  std::memcpy(Slot(chunk, rank_), input, bytes);
  TFRING_RETURN_IF_ERROR(Barrier());

  // Slices start on cache-line boundaries, so no two ranks write one line.
  const int64_t line_elements = static_cast<int64_t>(kCacheLine) / element_bytes;
  const int64_t lines = (count + line_elements - 1) / line_elements;
  auto slice_start = [&](int r) {
    return std::min(count, lines * r / size_ * line_elements);
  };
  const int64_t begin = slice_start(rank_);
  const int64_t end = slice_start(rank_ + 1);
  const int64_t block_elements = static_cast<int64_t>(kReduceBlockBytes) / element_bytes;
  char* result = Slot(chunk, 0);
  for (int64_t block = begin; block < end; block += block_elements) {
    const int64_t elements = std::min(block_elements, end - block);
    const int64_t offset = block * element_bytes;
    for (int r = 1; r < size_; ++r) {
      ReduceInto(dtype, op, Slot(chunk, r) + offset, result + offset, elements);
    }
  }
  TFRING_RETURN_IF_ERROR(Barrier());

  std::memcpy(output, result, bytes);
  return Status::OK();
}

}  // namespace tfring
