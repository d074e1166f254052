#include "cc/negotiation/response_cache.h"

#include <algorithm>

#include "cc/logging.h"

namespace tfring {

bool SameSignature(const Request& a, const Request& b) {
  if (a.type != b.type || a.dtype != b.dtype || a.shape.size() != b.shape.size()) return false;
  const size_t first_compared = HasRunTimeShape(a.type) ? 1 : 0;
  for (size_t i = first_compared; i < a.shape.size(); ++i) {
    if (a.shape[i] != b.shape[i]) return false;
  }
  if (IsReduction(a.type)) {
    return a.reduce_op == b.reduce_op && a.prescale_factor == b.prescale_factor &&
           a.postscale_factor == b.postscale_factor && a.compression == b.compression;
  }
  if (a.type == CollectiveType::kBroadcast) return a.root_rank == b.root_rank;
  return true;
}

ResponseCache::ResponseCache(int64_t capacity) : capacity_(std::max<int64_t>(capacity, 0)) {}

ResponseCache::Lookup ResponseCache::Find(const Request& request) const {
  auto it = by_name_.find(request.name);
  if (it == by_name_.end()) return {};
  const State state =
      SameSignature(slots_[it->second].response.request, request) ? State::kHit : State::kInvalid;
  return {state, it->second};
}

int64_t ResponseCache::FreeSlot() {
  const int64_t allocated = static_cast<int64_t>(slots_.size());
  for (int64_t slot = 0; slot < allocated; ++slot) {
    if (!slots_[slot].used) return slot;
  }
  if (allocated == capacity_) return -1;
  slots_.emplace_back();
  return allocated;
}

void ResponseCache::Put(const Response& response) {
  if (!enabled()) return;
  TFRING_CHECK(!response.is_error, "errors are never cached");
  auto it = by_name_.find(response.name());
  int64_t slot;
  if (it != by_name_.end()) {
    slot = it->second;
  } else {
    if (static_cast<int64_t>(by_name_.size()) == capacity_) Evict(recency_.back());
    slot = FreeSlot();
    TFRING_CHECK(slot >= 0, "no free cache slot after eviction");
    slots_[slot].used = true;
    slots_[slot].recency = recency_.insert(recency_.begin(), slot);
    by_name_[response.name()] = slot;
  }
  slots_[slot].response = response;
  Touch(slot);
}

const Response& ResponseCache::At(int64_t slot) const {
  TFRING_CHECK(slot >= 0 && slot < allocated_slots() && slots_[slot].used,
               "bad cache slot " << slot);
  return slots_[slot].response;
}

void ResponseCache::Touch(int64_t slot) {
  TFRING_CHECK(slot >= 0 && slot < allocated_slots() && slots_[slot].used,
               "touching empty cache slot " << slot);
  recency_.splice(recency_.begin(), recency_, slots_[slot].recency);
}

void ResponseCache::Evict(int64_t slot) {
  TFRING_CHECK(slot >= 0 && slot < allocated_slots() && slots_[slot].used,
               "evicting empty cache slot " << slot);
  Slot& entry = slots_[slot];
  by_name_.erase(entry.response.name());
  recency_.erase(entry.recency);
  entry = Slot();
}

}  // namespace tfring
