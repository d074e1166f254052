// The contract between libtfring_shared_heap.so (tfring/shared_heap.cc, a
// malloc that tfringrun preloads into the ranks of a one-host job) and the
// core, which maps the other ranks' heaps (peer_heaps.h).
//
// Why a contract and not a dependency: the heap library is preloaded before
// anything else and must not depend on the core, and the core must work
// without it. The core looks the function below up at run time
// (dlsym(RTLD_DEFAULT)); when it is absent, or reports no heap, every
// allocation is private and the data path copies through the segment.
//
// The heap: the library serves allocations of at least
// kSharedHeapSmallestBytes from one memfd of `capacity` bytes mapped at
// `base` (MAP_SHARED), so another process of the same user can map the same
// memory by opening /proc/<pid>/fd/<fd> and read or write those buffers in
// place.
#ifndef TFRING_CC_SHARED_HEAP_INFO_H_
#define TFRING_CC_SHARED_HEAP_INFO_H_

#include <cstddef>
#include <cstdint>

extern "C" {

struct TfringSharedHeapInfo {
  int32_t present;      // 1 when the heap is serving allocations, 0 otherwise
  int32_t fd;           // the memfd, open in process `pid`
  int64_t pid;          // the process that owns the heap
  void* base;           // where the heap is mapped in that process
  uint64_t capacity;    // bytes reserved (and mapped) at `base`
  uint64_t fallbacks;   // large allocations served by glibc because the heap was full
};

// Fills *info; always succeeds. Calls from any thread.
void tfring_shared_heap_info(TfringSharedHeapInfo* info);

}  // extern "C"

// The smallest allocation the heap serves; smaller ones stay with glibc.
inline constexpr size_t kSharedHeapSmallestBytes = 64 * 1024;
// The name the core looks up.
inline constexpr char kSharedHeapInfoSymbol[] = "tfring_shared_heap_info";

#endif  // TFRING_CC_SHARED_HEAP_INFO_H_
