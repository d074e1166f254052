// FreeBufferCache: which freed output buffers OutputBufferPool keeps for
// reuse, and for how long. No TensorFlow here, so the policy is unit-tested
// on its own (tests/cc/free_buffer_cache_test.cc).
//
// Why a policy at all: keeping every freed buffer up to a byte cap filled the
// cap with sizes never asked for again (allgathers of sparse gradients,
// evaluation batches) and kept them forever, ~512 MiB per process. The rules:
//
// - Fit: Take(n) returns the smallest cached buffer of n to n + n/8 bytes
//   (exact sizes first), so variable-size outputs can reuse a slightly larger
//   buffer. The caller keeps the buffer's real capacity and Puts that back.
// - Bytes: at most max_bytes are cached. Put evicts the least recently freed
//   buffers to make room; a buffer larger than max_bytes is not cached.
// - Idle: every Put and Take advances a clock by one call. A buffer not taken
//   within idle_limit() calls of being put is released. The limit is twice
//   the longest reuse distance (calls from Put to Take) seen so far, kept
//   within [min_idle_calls, max_idle_calls]. Distances come from hits and
//   from misses of a size released for idleness at most max_idle_calls calls
//   before, so a steady loop's buffers come back in time (after one step of
//   misses if the loop is longer than the limit) while sizes not asked again
//   leave after about two steps' worth of calls.
//
// Not thread-safe: the allocator calls it under its mutex. Buffers leaving
// the cache are handed back in `released` for the caller to free (outside
// its lock).
#ifndef TFRING_OPS_KERNELS_FREE_BUFFER_CACHE_H_
#define TFRING_OPS_KERNELS_FREE_BUFFER_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tfring {
namespace tf_ops {

class FreeBufferCache {
 public:
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;  // the buffer's capacity
  };

  FreeBufferCache(size_t max_bytes, uint64_t min_idle_calls, uint64_t max_idle_calls);
  FreeBufferCache(const FreeBufferCache&) = delete;
  FreeBufferCache& operator=(const FreeBufferCache&) = delete;

  // Removes and returns the best-fitting cached buffer for `num_bytes`, or
  // {nullptr, 0} (a miss). Idle buffers are appended to `released` first.
  // Take(0) returns {nullptr, 0} and changes nothing.
  Buffer Take(size_t num_bytes, std::vector<Buffer>* released);

  // Caches `buffer`; appends to `released` whatever leaves the cache: idle
  // buffers, the least recently freed ones beyond max_bytes, or `buffer`
  // itself when it is empty or larger than max_bytes. A null ptr is ignored.
  void Put(Buffer buffer, std::vector<Buffer>* released);

  size_t cached_bytes() const { return cached_bytes_; }
  size_t cached_buffers() const { return by_tick_.size(); }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t idle_limit() const { return idle_limit_; }

 private:
  // A buffer released for idleness: if its size is asked for again, the
  // limit was too short for this workload.
  struct Ghost {
    size_t bytes;
    uint64_t put_tick;
  };

  void ReleaseIdle(std::vector<Buffer>* released);
  void ReleaseOldest(std::vector<Buffer>* released);
  void LearnReuseDistance(uint64_t distance);
  bool Fits(size_t capacity, size_t num_bytes) const {
    return capacity >= num_bytes && capacity - num_bytes <= num_bytes / 8;
  }

  const size_t max_bytes_;
  const uint64_t max_idle_calls_;

  uint64_t clock_ = 0;  // Put and Take calls so far
  uint64_t idle_limit_;  // starts at min_idle_calls, only grows
  // Each cached buffer under its put tick (unique: the clock advances on
  // every Put), oldest first, and under (capacity, put tick) for best fit.
  std::map<uint64_t, Buffer> by_tick_;
  std::map<std::pair<size_t, uint64_t>, void*> by_size_;
  // Idle releases of the last max_idle_calls calls, oldest first, and the
  // latest one's put tick per size.
  std::deque<Ghost> ghosts_;
  std::unordered_map<size_t, uint64_t> ghost_tick_by_size_;
  size_t cached_bytes_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace tf_ops
}  // namespace tfring

#endif  // TFRING_OPS_KERNELS_FREE_BUFFER_CACHE_H_
