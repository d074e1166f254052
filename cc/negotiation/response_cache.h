// ResponseCache: the responses of tensors already negotiated, so that steady
// state training steps agree with one bitwise AND over a bit vector (a bit
// per cache slot) instead of gathering requests at rank 0.
//
// Every rank holds an identical cache: it changes only through Put, Touch and
// Evict calls made in the same order on every rank (driven by the response
// list all ranks execute). Slot numbers are therefore the same everywhere and
// a bit means the same tensor on every rank.
#ifndef TFRING_CC_NEGOTIATION_RESPONSE_CACHE_H_
#define TFRING_CC_NEGOTIATION_RESPONSE_CACHE_H_

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "cc/common.h"
#include "cc/negotiation/response.h"

namespace tfring {

// True when `a` and `b` can be answered by the same response: same type,
// dtype, op, root, scale factors and shape (for allgather and alltoall, all
// but the first dimension).
bool SameSignature(const Request& a, const Request& b);

class ResponseCache {
 public:
  enum class State { kMiss, kHit, kInvalid };
  struct Lookup {
    State state = State::kMiss;
    int64_t slot = -1;
  };

  explicit ResponseCache(int64_t capacity);

  bool enabled() const { return capacity_ > 0; }
  int64_t capacity() const { return capacity_; }
  // Slots allocated so far: they grow one at a time up to the capacity as
  // tensors are cached, so a large capacity costs nothing up front.
  int64_t allocated_slots() const { return static_cast<int64_t>(slots_.size()); }
  // 64-bit words needed for one bit per slot.
  int64_t num_words() const { return (capacity_ + 63) / 64; }

  // kHit: cached with the same signature; kInvalid: cached under this name
  // with a different signature (all ranks must evict it and renegotiate).
  Lookup Find(const Request& request) const;
  // Stores a successful response, replacing one of the same name, evicting
  // the least recently used when full. Marks it most recently used.
  void Put(const Response& response);
  const Response& At(int64_t slot) const;
  void Touch(int64_t slot);
  void Evict(int64_t slot);

 private:
  struct Slot {
    bool used = false;
    Response response;
    std::list<int64_t>::iterator recency;
  };
  // An unused slot, allocating one while below the capacity; -1 if full.
  int64_t FreeSlot();

  int64_t capacity_;
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int64_t> by_name_;
  std::list<int64_t> recency_;  // front: most recently used
};

}  // namespace tfring

#endif  // TFRING_CC_NEGOTIATION_RESPONSE_CACHE_H_
