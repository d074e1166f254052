#include "tfring/ops/kernels/free_buffer_cache.h"

#include <algorithm>

namespace tfring {
namespace tf_ops {

FreeBufferCache::FreeBufferCache(size_t max_bytes, uint64_t min_idle_calls,
                                 uint64_t max_idle_calls)
    : max_bytes_(max_bytes),
      max_idle_calls_(max_idle_calls),
      idle_limit_(std::min(min_idle_calls, max_idle_calls)) {}

FreeBufferCache::Buffer FreeBufferCache::Take(size_t num_bytes,
                                              std::vector<Buffer>* released) {
  if (num_bytes == 0) return {};
  ++clock_;
  ReleaseIdle(released);
  // The smallest capacity >= num_bytes, and of those the longest cached.
  auto fit = by_size_.lower_bound({num_bytes, 0});
  if (fit == by_size_.end() || !Fits(fit->first.first, num_bytes)) {
    ++misses_;
    // A buffer of this size was released for idleness: the workload reuses
    // buffers after more calls than the limit allowed.
    auto ghost = ghost_tick_by_size_.find(num_bytes);
    if (ghost != ghost_tick_by_size_.end()) {
      LearnReuseDistance(clock_ - ghost->second);
      ghost_tick_by_size_.erase(ghost);
    }
    return {};
  }
  const Buffer buffer{fit->second, fit->first.first};
  const uint64_t put_tick = fit->first.second;
  by_size_.erase(fit);
  by_tick_.erase(put_tick);
  cached_bytes_ -= buffer.bytes;
  ++hits_;
  LearnReuseDistance(clock_ - put_tick);
  return buffer;
}

void FreeBufferCache::Put(Buffer buffer, std::vector<Buffer>* released) {
  if (buffer.ptr == nullptr) return;
  ++clock_;
  ReleaseIdle(released);
  if (buffer.bytes == 0 || buffer.bytes > max_bytes_) {
    released->push_back(buffer);
    return;
  }
  by_tick_.emplace(clock_, buffer);
  by_size_.emplace(std::make_pair(buffer.bytes, clock_), buffer.ptr);
  cached_bytes_ += buffer.bytes;
  while (cached_bytes_ > max_bytes_) ReleaseOldest(released);
}

void FreeBufferCache::ReleaseIdle(std::vector<Buffer>* released) {
  while (!by_tick_.empty() && clock_ - by_tick_.begin()->first > idle_limit_) {
    const Ghost ghost{by_tick_.begin()->second.bytes, by_tick_.begin()->first};
    ghosts_.push_back(ghost);
    ghost_tick_by_size_[ghost.bytes] = ghost.put_tick;
    ReleaseOldest(released);
  }
  // A reuse distance beyond max_idle_calls could not be served anyway.
  while (!ghosts_.empty() && clock_ - ghosts_.front().put_tick > max_idle_calls_) {
    auto latest = ghost_tick_by_size_.find(ghosts_.front().bytes);
    if (latest != ghost_tick_by_size_.end() && latest->second == ghosts_.front().put_tick) {
      ghost_tick_by_size_.erase(latest);
    }
    ghosts_.pop_front();
  }
}

void FreeBufferCache::ReleaseOldest(std::vector<Buffer>* released) {
  auto oldest = by_tick_.begin();
  const Buffer buffer = oldest->second;
  by_size_.erase({buffer.bytes, oldest->first});
  by_tick_.erase(oldest);
  cached_bytes_ -= buffer.bytes;
  released->push_back(buffer);
}

void FreeBufferCache::LearnReuseDistance(uint64_t distance) {
  if (distance > max_idle_calls_) return;
  idle_limit_ = std::min(max_idle_calls_, std::max(idle_limit_, 2 * distance));
}

}  // namespace tf_ops
}  // namespace tfring
