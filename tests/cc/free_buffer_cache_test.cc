// Tests of FreeBufferCache, the output pool's policy: byte bound, least
// recently freed evicted first, idle release, best fit.
//
// Usage: free_buffer_cache_test <case|all|list>
// Prints "PASS <case>" or "FAIL <case>: why" per case and exits non-zero if
// any failed. Driven from tests/test_free_buffer_cache.py.
//
// Buffers are tokens (distinct addresses, never dereferenced). The harness
// checks on every call that what the cache holds plus what it released is
// exactly what was put and not taken back.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/cc/expect.h"
#include "tfring/ops/kernels/free_buffer_cache.h"

namespace tfring {
namespace tf_ops {
namespace {

using ::tfring::testing::TestFailure;

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;
constexpr uint64_t kNeverIdle = uint64_t{1} << 40;
// OutputBufferPool's idle bounds for its default 512 MiB.
constexpr uint64_t kPoolMinIdle = 64;
constexpr uint64_t kPoolMaxIdle = 4096;

// A cache plus the bookkeeping that checks it.
class Harness {
 public:
  Harness(size_t max_bytes, uint64_t min_idle, uint64_t max_idle)
      : max_bytes_(max_bytes), cache_(max_bytes, min_idle, max_idle) {}

  FreeBufferCache& cache() { return cache_; }
  const std::vector<FreeBufferCache::Buffer>& last_released() const { return released_; }

  // Take(num_bytes), or a fresh token of exactly num_bytes on a miss (what the
  // allocator does). *hit says which.
  FreeBufferCache::Buffer Acquire(size_t num_bytes, bool* hit = nullptr) {
    released_.clear();
    FreeBufferCache::Buffer buffer = cache_.Take(num_bytes, &released_);
    if (hit != nullptr) *hit = buffer.ptr != nullptr;
    if (buffer.ptr != nullptr) {
      EXPECT_TRUE(held_.count(buffer.ptr) == 1, "Take returned a buffer it did not hold");
      EXPECT_TRUE(held_[buffer.ptr] == buffer.bytes,
                  "Take reported " << buffer.bytes << " bytes for a " << held_[buffer.ptr]
                                   << "-byte buffer");
      EXPECT_TRUE(buffer.bytes >= num_bytes && buffer.bytes - num_bytes <= num_bytes / 8,
                  "a " << buffer.bytes << "-byte buffer for " << num_bytes << " bytes");
      held_.erase(buffer.ptr);
    } else {
      buffer = Fresh(num_bytes);
    }
    CheckReleased();
    return buffer;
  }

  // A new buffer of num_bytes, not from the cache.
  FreeBufferCache::Buffer Fresh(size_t num_bytes) {
    return {reinterpret_cast<void*>(++next_token_ * 64), num_bytes};
  }

  void Release(FreeBufferCache::Buffer buffer) {
    released_.clear();
    cache_.Put(buffer, &released_);
    if (buffer.ptr != nullptr) held_[buffer.ptr] = buffer.bytes;
    CheckReleased();
  }

 private:
  void CheckReleased() {
    for (const FreeBufferCache::Buffer& buffer : released_) {
      auto it = held_.find(buffer.ptr);
      EXPECT_TRUE(it != held_.end(), "released a buffer it did not hold (or twice)");
      EXPECT_TRUE(it->second == buffer.bytes, "released a buffer with the wrong size");
      held_.erase(it);
    }
    size_t bytes = 0;
    for (const auto& [ptr, size] : held_) bytes += size;
    EXPECT_TRUE(cache_.cached_buffers() == held_.size(),
                "cached_buffers() " << cache_.cached_buffers() << " but " << held_.size()
                                    << " put and neither taken nor released");
    EXPECT_TRUE(cache_.cached_bytes() == bytes,
                "cached_bytes() " << cache_.cached_bytes() << " but " << bytes << " held");
    EXPECT_TRUE(bytes <= max_bytes_, "holds " << bytes << " bytes, bound " << max_bytes_);
  }

  const size_t max_bytes_;
  FreeBufferCache cache_;
  std::map<void*, size_t> held_;
  std::vector<FreeBufferCache::Buffer> released_;
  uintptr_t next_token_ = 0;
};

// 300 distinct sizes, each allocated and freed in turn (an allgather of
// sparse gradients, evaluation batches): the cache never holds more than its
// bound.
void DistinctSizesStayWithinBound() {
  const size_t bound = 32 * kMiB;
  Harness harness(bound, kNeverIdle, kNeverIdle);
  size_t peak = 0;
  for (int i = 0; i < 300; ++i) {
    harness.Release(harness.Acquire(1 * kMiB + i * 4 * kKiB));  // checks the bound
    peak = std::max(peak, harness.cache().cached_bytes());
  }
  EXPECT_TRUE(peak > bound - 2 * kMiB, "the bound was never reached: peak " << peak);
}

// After 300 distinct sizes, the latest freed buffers are the ones cached: the
// latest size is reused, the first ones are gone.
void MostRecentlyFreedAreKept() {
  const size_t bound = 32 * kMiB;
  Harness harness(bound, kPoolMinIdle, kPoolMaxIdle);
  std::vector<size_t> sizes;
  for (int i = 0; i < 300; ++i) sizes.push_back(1 * kMiB + i * 4 * kKiB);
  for (size_t size : sizes) harness.Release(harness.Acquire(size));
  bool hit = false;
  harness.Acquire(sizes.back(), &hit);
  EXPECT_TRUE(hit, "the latest freed size (" << sizes.back() << " bytes) was not kept");
  harness.Acquire(sizes[sizes.size() - 2], &hit);
  EXPECT_TRUE(hit, "the second latest freed size was not kept");
  harness.Acquire(sizes.front(), &hit);
  EXPECT_TRUE(!hit, "the first size was still cached after 299 newer ones");
}

// A training loop: the same outputs every step, all live then all freed, or
// each freed before the next is allocated. Every step after the first reuses.
void SteadyLoopReusesExactSizes() {
  for (bool all_live : {true, false}) {
    Harness harness(512 * kMiB, kPoolMinIdle, kPoolMaxIdle);
    std::vector<size_t> sizes;
    for (int i = 0; i < 20; ++i) sizes.push_back(256 * kKiB + i * 96 * kKiB);
    const int steps = 50;
    for (int step = 0; step < steps; ++step) {
      std::vector<FreeBufferCache::Buffer> live;
      for (size_t size : sizes) {
        bool hit = false;
        FreeBufferCache::Buffer buffer = harness.Acquire(size, &hit);
        EXPECT_TRUE(hit == (step > 0), "step " << step << " size " << size << " hit=" << hit
                                               << " (all_live=" << all_live << ")");
        EXPECT_TRUE(buffer.bytes == size, "an exact size was not reused exactly");
        if (all_live) {
          live.push_back(buffer);
        } else {
          harness.Release(buffer);
        }
      }
      for (const FreeBufferCache::Buffer& buffer : live) harness.Release(buffer);
    }
    EXPECT_TRUE(harness.cache().hits() == sizes.size() * (steps - 1),
                "hits " << harness.cache().hits());
    EXPECT_TRUE(harness.cache().misses() == sizes.size(), "misses " << harness.cache().misses());
    EXPECT_TRUE(harness.cache().cached_buffers() == sizes.size(),
                "cached " << harness.cache().cached_buffers());
  }
}

// A loop of more outputs than the initial idle limit: the first reuse misses
// teach the cache the loop's length; from the third step on everything hits.
void LongLoopTeachesTheIdleLimit() {
  Harness harness(1024 * kMiB, kPoolMinIdle, kPoolMaxIdle);
  const int outputs = 300;
  for (int step = 0; step < 6; ++step) {
    std::vector<FreeBufferCache::Buffer> live;
    for (int i = 0; i < outputs; ++i) {
      bool hit = false;
      live.push_back(harness.Acquire(256 * kKiB + i * 4 * kKiB, &hit));
      if (step >= 2) EXPECT_TRUE(hit, "step " << step << " output " << i << " missed");
    }
    for (const FreeBufferCache::Buffer& buffer : live) harness.Release(buffer);
  }
  EXPECT_TRUE(harness.cache().idle_limit() >= 2 * outputs,
              "idle limit " << harness.cache().idle_limit());
}

// Buffers nobody asks for again are released after the idle limit, even far
// below the byte bound: a steady loop with one new size per step keeps only
// the loop's buffers and the last few new ones.
void IdleBuffersAreReleased() {
  const uint64_t min_idle = 16;
  Harness harness(1024 * kMiB, min_idle, kPoolMaxIdle);
  const std::vector<size_t> steady = {300 * kKiB, 700 * kKiB, 2 * kMiB, 5 * kMiB};
  size_t most_cached = 0;
  for (int step = 0; step < 300; ++step) {
    std::vector<FreeBufferCache::Buffer> live;
    for (size_t size : steady) {
      bool hit = false;
      live.push_back(harness.Acquire(size, &hit));
      EXPECT_TRUE(hit == (step > 0), "steady size " << size << " at step " << step);
    }
    live.push_back(harness.Acquire(8 * kMiB + step * 64 * kKiB));  // a new size each step
    for (const FreeBufferCache::Buffer& buffer : live) harness.Release(buffer);
    if (step >= 10) most_cached = std::max(most_cached, harness.cache().cached_buffers());
  }
  // 10 calls a step, released after 16: at most 2 of the new sizes remain.
  EXPECT_TRUE(most_cached <= steady.size() + 2,
              "up to " << most_cached << " buffers cached for a loop of " << steady.size()
                       << " sizes plus one new size a step");
  EXPECT_TRUE(harness.cache().idle_limit() == min_idle,
              "idle limit grew to " << harness.cache().idle_limit());

  // Once the loop stops, a different workload releases everything it left.
  for (int i = 0; i < 100; ++i) harness.Release(harness.Acquire(300 * kKiB + 4 * kKiB));
  EXPECT_TRUE(harness.cache().cached_buffers() == 1,
              harness.cache().cached_buffers() << " buffers still cached");
}

// Zero sizes, null pointers, buffers larger than the bound, a zero bound.
void ZeroAndOversize() {
  const size_t bound = 4 * kMiB;
  Harness harness(bound, kPoolMinIdle, kPoolMaxIdle);
  FreeBufferCache& cache = harness.cache();
  std::vector<FreeBufferCache::Buffer> released;
  EXPECT_TRUE(cache.Take(0, &released).ptr == nullptr, "Take(0) returned a buffer");
  EXPECT_TRUE(cache.hits() == 0 && cache.misses() == 0, "Take(0) counted");
  harness.Release({nullptr, kMiB});
  EXPECT_TRUE(harness.last_released().empty(), "a null buffer was released");

  FreeBufferCache::Buffer empty = harness.Acquire(1);
  harness.Release({empty.ptr, 0});
  EXPECT_TRUE(harness.last_released().size() == 1, "a zero-byte buffer was cached");

  FreeBufferCache::Buffer huge = harness.Acquire(bound + 1);
  harness.Release(huge);
  EXPECT_TRUE(harness.last_released().size() == 1 && harness.last_released()[0].ptr == huge.ptr,
              "a buffer larger than the bound was cached");

  // Exactly the bound fits, and is evicted by the next one.
  FreeBufferCache::Buffer whole = harness.Acquire(bound);
  harness.Release(whole);
  EXPECT_TRUE(cache.cached_bytes() == bound, "a buffer of exactly the bound was not cached");
  harness.Release(harness.Acquire(kMiB));
  EXPECT_TRUE(harness.last_released().size() == 1 && harness.last_released()[0].ptr == whole.ptr,
              "the older buffer was not evicted for the newer one");
  bool hit = true;
  harness.Acquire(2 * bound, &hit);
  EXPECT_TRUE(!hit, "Take of twice the bound hit");

  Harness disabled(0, kPoolMinIdle, kPoolMaxIdle);
  disabled.Release(disabled.Acquire(kMiB));
  EXPECT_TRUE(disabled.cache().cached_buffers() == 0, "a zero bound cached a buffer");
}

// A request takes the smallest cached buffer within 1/8 above it.
void BestFitWithinAnEighth() {
  Harness harness(64 * kMiB, kPoolMinIdle, kPoolMaxIdle);
  for (size_t size : {1100 * kKiB, 1000 * kKiB, 1050 * kKiB, 2000 * kKiB}) {
    harness.Release(harness.Fresh(size));
  }
  for (size_t expected : {1000 * kKiB, 1050 * kKiB, 1100 * kKiB}) {
    bool hit = false;
    FreeBufferCache::Buffer buffer = harness.Acquire(1000 * kKiB, &hit);
    EXPECT_TRUE(hit && buffer.bytes == expected,
                "got " << buffer.bytes << " bytes (hit=" << hit << "), expected " << expected);
  }
  bool hit = true;
  harness.Acquire(1000 * kKiB, &hit);
  EXPECT_TRUE(!hit, "a buffer twice the request was used");
  FreeBufferCache::Buffer buffer = harness.Acquire(1800 * kKiB, &hit);
  EXPECT_TRUE(hit && buffer.bytes == 2000 * kKiB,
              "1800 KiB did not reuse the 2000 KiB buffer with its real capacity");
}

const std::vector<std::pair<std::string, std::function<void()>>>& Cases() {
  static const auto* cases = new std::vector<std::pair<std::string, std::function<void()>>>{
      {"distinct_sizes_stay_within_bound", DistinctSizesStayWithinBound},
      {"most_recently_freed_are_kept", MostRecentlyFreedAreKept},
      {"steady_loop_reuses_exact_sizes", SteadyLoopReusesExactSizes},
      {"long_loop_teaches_the_idle_limit", LongLoopTeachesTheIdleLimit},
      {"idle_buffers_are_released", IdleBuffersAreReleased},
      {"zero_and_oversize", ZeroAndOversize},
      {"best_fit_within_an_eighth", BestFitWithinAnEighth},
  };
  return *cases;
}

}  // namespace
}  // namespace tf_ops
}  // namespace tfring

int main(int argc, char** argv) {
  using tfring::tf_ops::Cases;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <case|all|list>\n", argv[0]);
    return 2;
  }
  const std::string which = argv[1];
  return ::tfring::testing::RunScenarios(Cases(), which, "", [](auto fn) { fn(); });
}
