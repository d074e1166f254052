// libtfring_shared_heap.so: a malloc that serves a rank's large allocations
// from one shared memory file, so the other ranks of its host can reach its
// tensors in place.
//
// Why: the ranks of a one-host job map each other's heaps (by opening
// /proc/<pid>/fd/<fd>, see cc/shared_heap_info.h), so an allreduce can read
// every rank's gradient tensor and write every rank's output where it lies,
// with no copy through a staging segment. TensorFlow allocates CPU tensors
// with aligned_alloc/posix_memalign, so serving every large allocation from
// one memfd makes every big tensor reachable by the peers. tfringrun
// preloads this library (LD_PRELOAD) into the ranks.
//
// What it does:
//  - Requests of at least kSharedHeapSmallestBytes with an alignment of at
//    most 2 MiB come from the heap: one memfd of `capacity` bytes
//    (TFRING_SHARED_HEAP_BYTES, a number of bytes, rounded up to 2 MiB; else
//    the machine's physical memory), mapped MAP_SHARED | MAP_NORESERVE and
//    created on the first such request. Everything else, and everything when
//    the heap is off (TFRING_SHARED_HEAP=0, or it could not be created),
//    goes to glibc's own functions (__libc_malloc and friends). free,
//    realloc and malloc_usable_size tell the two apart by address; a glibc
//    block that realloc grows large moves into the heap.
//  - The heap's blocks are multiples of a page, so every block is page
//    aligned (a larger alignment leaves a free gap below the block). Its
//    bookkeeping lives in side tables (std::map nodes from
//    __libc_malloc), never inside the shared memory: free blocks by address
//    (to merge neighbours) and by size (best fit), the used blocks by
//    address, and `top`, below which memory has been handed out. When
//    nothing fits, the request goes to glibc and counts as a fallback.
//  - Freed memory keeps its pages for reuse up to kRetainedBytes (512 MiB):
//    the blocks a training step frees and allocates again then cost no
//    page faults, which in shared memory cost more than in private memory.
//    Beyond that the largest free ranges that may hold data are punched
//    out of the file (MADV_REMOVE), so a rank's footprint does not stay at
//    its peak.
//  - fork: a child must not share the parent's heap (they would write each
//    other's memory), so in its fork handler the child copies the blocks in
//    use into private memory at the same addresses, reserves the rest of
//    the range inaccessible, closes the memfd and serves new large requests
//    from glibc (see Heap::MakePrivate). That costs a copy of the live
//    blocks per fork (vfork and posix_spawn, as Python's subprocess uses,
//    run no fork handlers and copy nothing); what other parent threads write
//    into the heap while the child copies may show in the child's copy.
//  - As it loads, it takes itself out of LD_PRELOAD, so the programs a rank
//    starts (compilers, shells) do not load it.
//
// Linux and glibc only; no tfring dependency (cc/shared_heap_info.h is the
// contract with the core). Link with -ldl -lpthread.

#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <utility>

#include "cc/shared_heap_info.h"
#include "tfring/preload_self.h"

// glibc's own allocator, under the names it exports for exactly this use.
// They throw nothing (as glibc's own declarations of malloc and free say),
// which lets the calls to them be tail calls.
extern "C" {
void* __libc_malloc(size_t size) noexcept;
void __libc_free(void* pointer) noexcept;
void* __libc_calloc(size_t count, size_t size) noexcept;
void* __libc_realloc(void* pointer, size_t size) noexcept;
void* __libc_memalign(size_t alignment, size_t size) noexcept;
}

#define TFRING_HEAP_EXPORT __attribute__((visibility("default")))

namespace {

// Blocks are page aligned; larger alignments, up to the largest (that of a
// huge page, which TensorFlow's and tfring's large buffers ask for), cost
// the gap below the block, which stays free for others.
constexpr size_t kHeapAlignment = 4096;
constexpr size_t kLargestAlignment = size_t{2} << 20;
// Freed memory keeps its pages up to this many bytes (below and above
// `top`), so the blocks a training step frees and allocates again (its
// tensors, MPI's temporary buffers) cost no page faults; beyond it the
// largest dirty free blocks give their pages back.
constexpr uint64_t kRetainedBytes = uint64_t{512} << 20;
constexpr uint64_t kCapacityUnit = uint64_t{2} << 20;
constexpr uint64_t kNoBlock = ~uint64_t{0};

// Writes `message` and `pointer` to stderr and aborts: the caller passed a
// pointer that is no block of the heap, or the heap cannot keep its promise.
[[noreturn]] void Die(const char* message, const void* pointer = nullptr) {
  char text[160];
  size_t length = 0;
  auto append = [&](const char* part) {
    while (*part != '\0' && length < sizeof(text) - 1) text[length++] = *part++;
  };
  append("tfring shared heap: ");
  append(message);
  if (pointer != nullptr) {
    char hex[2 + 16 + 1] = "0x";
    const uintptr_t value = reinterpret_cast<uintptr_t>(pointer);
    for (int digit = 0; digit < 16; ++digit) {
      hex[2 + digit] = "0123456789abcdef"[(value >> (60 - 4 * digit)) & 0xF];
    }
    hex[18] = '\0';
    append(" ");
    append(hex);
  }
  append("\n");
  ssize_t ignored = write(STDERR_FILENO, text, length);
  (void)ignored;
  std::abort();
}

// `bytes` rounded up to a multiple of `unit` (a power of two) into
// *rounded; false when that overflows.
bool RoundUp(uint64_t bytes, uint64_t unit, uint64_t* rounded) {
  if (bytes > ~uint64_t{0} - (unit - 1)) return false;
  *rounded = (bytes + unit - 1) & ~(unit - 1);
  return true;
}

// The side tables' allocator: glibc directly, so that bookkeeping never
// comes back into this file's malloc.
template <typename T>
struct LibcAllocator {
  using value_type = T;
  LibcAllocator() = default;
  template <typename U>
  LibcAllocator(const LibcAllocator<U>&) {}  // NOLINT: allocators convert implicitly
  T* allocate(size_t count) {
    void* memory = __libc_malloc(count * sizeof(T));
    if (memory == nullptr) Die("out of memory for the heap's tables");
    return static_cast<T*>(memory);
  }
  void deallocate(T* memory, size_t) { __libc_free(memory); }
  template <typename U>
  bool operator==(const LibcAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const LibcAllocator<U>&) const { return false; }
};

template <typename Value>
using OffsetMap = std::map<uint64_t, Value, std::less<uint64_t>,
                           LibcAllocator<std::pair<const uint64_t, Value>>>;

// The blocks of the shared memory file, as offsets from its start. Not
// thread safe: every call holds g_mutex.
class Heap {
 public:
  Heap(char* base, uint64_t capacity) : base_(base), capacity_(capacity) {}

  // The offset of a new block of `bytes` (a multiple of the block size), or
  // kNoBlock when none fits; *zeroed tells whether it reads as zeros.
  // The block starts at a multiple of `alignment` (a power of two, at most
  // kLargestAlignment; the heap's base is aligned to that).
  uint64_t Allocate(uint64_t bytes, uint64_t alignment, bool* zeroed) {
    auto align = [alignment](uint64_t offset) {
      return (offset + alignment - 1) & ~(alignment - 1);
    };
    // The smallest free block that holds the block once aligned (the
    // lowest one of that size); what it has left on either side stays free.
    for (auto fit = free_by_size_.lower_bound({bytes, 0}); fit != free_by_size_.end(); ++fit) {
      const uint64_t start = fit->second;
      const uint64_t offset = align(start);
      if (offset - start > fit->first - bytes) continue;
      const auto block = free_by_offset_.find(start);
      const FreeBlock found = block->second;
      RemoveFree(block);
      if (offset > start) AddFree(start, offset - start, found.released);
      const uint64_t end = start + found.size;
      if (end > offset + bytes) AddFree(offset + bytes, end - offset - bytes, found.released);
      *zeroed = found.released;
      used_.emplace(offset, bytes);
      return offset;
    }
    const uint64_t offset = align(top_);
    if (offset > capacity_ || bytes > capacity_ - offset) return kNoBlock;
    // The gap below an aligned block stays free (the block below `top` is
    // in use: a free one would have lowered `top`).
    if (offset > top_) AddFree(top_, offset - top_, top_ >= high_water_);
    top_ = offset + bytes;
    *zeroed = offset >= high_water_;
    high_water_ = std::max(high_water_, top_);
    used_.emplace(offset, bytes);
    return offset;
  }

  // The size of the block at `offset`; 0 when no block starts there.
  uint64_t BlockSize(uint64_t offset) const {
    const auto used = used_.find(offset);
    return used == used_.end() ? 0 : used->second;
  }

  // Frees the block at `offset`; false when no block starts there.
  bool Free(uint64_t offset) {
    const auto used = used_.find(offset);
    if (used == used_.end()) return false;
    const uint64_t bytes = used->second;
    used_.erase(used);
    Release(offset, bytes);
    return true;
  }

  // Makes the block at `offset` `bytes` long (a multiple of the block size)
  // where it is: shrinking always works; growing works into a free
  // neighbour or the untouched memory at `top`. False when it cannot.
  bool ResizeInPlace(uint64_t offset, uint64_t bytes) {
    const auto used = used_.find(offset);
    if (used == used_.end()) return false;
    const uint64_t old_bytes = used->second;
    const uint64_t end = offset + old_bytes;
    if (bytes <= old_bytes) {
      used->second = bytes;
      if (bytes < old_bytes) Release(offset + bytes, old_bytes - bytes);
      return true;
    }
    const uint64_t extra = bytes - old_bytes;
    if (end == top_) {
      if (extra > capacity_ - top_) return false;
      top_ += extra;
      high_water_ = std::max(high_water_, top_);
    } else {
      const auto next = free_by_offset_.find(end);
      if (next == free_by_offset_.end() || next->second.size < extra) return false;
      const FreeBlock rest = next->second;
      RemoveFree(next);
      if (rest.size > extra) AddFree(end + extra, rest.size - extra, rest.released);
    }
    used->second = bytes;
    return true;
  }

  // In a forked child only: the block at `offset` is forgotten (its size
  // into *bytes), without reuse; false when no block starts there.
  bool Forget(uint64_t offset, uint64_t* bytes) {
    const auto used = used_.find(offset);
    if (used == used_.end()) return false;
    *bytes = used->second;
    used_.erase(used);
    return true;
  }

  // In a forked child, before anything else runs: replaces the shared
  // mapping by private memory with the same contents at the same addresses
  // (copying only the blocks in use: free memory needs no contents) and the
  // rest of the range by an inaccessible reservation, so the addresses stay
  // the heap's. One copy and one mremap when a scratch mapping of `top`
  // bytes can be had, else through a small buffer.
  void MakePrivate() {
    if (top_ > 0) {
      void* copy = mmap(nullptr, top_, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (copy != MAP_FAILED) {
        for (const auto& [offset, bytes] : used_) {
          std::memcpy(static_cast<char*>(copy) + offset, base_ + offset, bytes);
        }
        if (mremap(copy, top_, top_, MREMAP_MAYMOVE | MREMAP_FIXED, base_) == MAP_FAILED) {
          munmap(copy, top_);
          copy = MAP_FAILED;
        }
      }
      if (copy == MAP_FAILED) CopyThroughBuffer();
    }
    if (capacity_ > top_ &&
        mmap(base_ + top_, capacity_ - top_, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
      Die("cannot reserve the heap's addresses in a forked child");
    }
  }

 private:
  struct FreeBlock {
    uint64_t size;
    bool released;  // its pages are punched out: it reads as zeros
  };

  void AddFree(uint64_t offset, uint64_t size, bool released) {
    free_by_offset_.emplace(offset, FreeBlock{size, released});
    free_by_size_.emplace(size, offset);
    if (!released) {
      dirty_by_size_.emplace(size, offset);
      dirty_free_bytes_ += size;
    }
  }

  // Removes a free block from the tables; the next one by address.
  OffsetMap<FreeBlock>::iterator RemoveFree(OffsetMap<FreeBlock>::iterator block) {
    free_by_size_.erase({block->second.size, block->first});
    if (!block->second.released) {
      dirty_by_size_.erase({block->second.size, block->first});
      dirty_free_bytes_ -= block->second.size;
    }
    return free_by_offset_.erase(block);
  }

  // Gives pages back, largest dirty range first, until at most
  // kRetainedBytes of freed memory keep theirs.
  void Trim() {
    while (dirty_free_bytes_ + (high_water_ - top_) > kRetainedBytes) {
      const uint64_t above_top = high_water_ - top_;
      const bool have_block = !dirty_by_size_.empty();
      if (above_top > 0 && (!have_block || above_top >= dirty_by_size_.rbegin()->first)) {
        if (!Punch(top_, above_top)) return;
        high_water_ = top_;
        continue;
      }
      if (!have_block) return;
      const uint64_t offset = dirty_by_size_.rbegin()->second;
      const auto block = free_by_offset_.find(offset);
      const uint64_t size = block->second.size;
      RemoveFree(block);
      const bool punched = Punch(offset, size);
      AddFree(offset, size, punched);
      if (!punched) return;
    }
  }

  // Punches [offset, offset + bytes) out of the file: its pages go back to
  // the system and it reads as zeros. By address, not through the fd,
  // which the program may have closed (and its number been reused).
  bool Punch(uint64_t offset, uint64_t bytes) {
    return madvise(base_ + offset, bytes, MADV_REMOVE) == 0;
  }

  // [offset, offset + bytes), just out of use, becomes free: merged with
  // the free blocks on either side (the merged block may hold data), or
  // with the memory at `top` when it reaches it; then Trim.
  void Release(uint64_t offset, uint64_t bytes) {
    uint64_t start = offset;
    uint64_t end = offset + bytes;
    auto next = free_by_offset_.lower_bound(offset);
    if (next != free_by_offset_.end() && next->first == end) {
      end += next->second.size;
      next = RemoveFree(next);
    }
    if (next != free_by_offset_.begin()) {
      const auto previous = std::prev(next);
      if (previous->first + previous->second.size == start) {
        start = previous->first;
        RemoveFree(previous);
      }
    }
    if (end == top_) {
      top_ = start;  // [top_, high_water_) may hold data
    } else {
      AddFree(start, end - start, false);
    }
    Trim();
  }

  // MakePrivate's way without a scratch mapping: each used block a buffer
  // at a time, copied out, replaced by private memory and copied back; then
  // the free blocks below `top` made inaccessible.
  void CopyThroughBuffer() {
    alignas(4096) static char buffer[1 << 20];
    for (const auto& [offset, bytes] : used_) {
      for (uint64_t done = 0; done < bytes; done += sizeof(buffer)) {
        const uint64_t length = std::min<uint64_t>(sizeof(buffer), bytes - done);
        char* const at = base_ + offset + done;
        std::memcpy(buffer, at, length);
        if (mmap(at, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                 -1, 0) == MAP_FAILED) {
          Die("cannot copy the heap into private memory in a forked child");
        }
        std::memcpy(at, buffer, length);
      }
    }
    for (const auto& [offset, block] : free_by_offset_) {
      if (mmap(base_ + offset, block.size, PROT_NONE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
        Die("cannot reserve the heap's addresses in a forked child");
      }
    }
  }

  char* const base_;
  const uint64_t capacity_;
  // Below top_: blocks in use and free blocks; no free block ends at top_.
  uint64_t top_ = 0;
  // Memory in [top_, high_water_) may hold old data; above, it reads as
  // zeros.
  uint64_t high_water_ = 0;
  OffsetMap<FreeBlock> free_by_offset_;
  std::set<std::pair<uint64_t, uint64_t>, std::less<std::pair<uint64_t, uint64_t>>,
           LibcAllocator<std::pair<uint64_t, uint64_t>>>
      free_by_size_;  // (size, offset)
  // The free blocks that may hold data, (size, offset), and their bytes.
  std::set<std::pair<uint64_t, uint64_t>, std::less<std::pair<uint64_t, uint64_t>>,
           LibcAllocator<std::pair<uint64_t, uint64_t>>>
      dirty_by_size_;
  uint64_t dirty_free_bytes_ = 0;
  OffsetMap<uint64_t> used_;  // offset -> size
};

// kUnset: not created yet. kOn: serving. kOff: never will (disabled or
// failed). kPrivate: this is a forked child of the heap's owner: the old
// blocks are private copies, new requests go to glibc.
enum State : int { kUnset, kOn, kOff, kPrivate };

// Everything below is constant-initialised, so usable before any
// constructor runs (libstdc++ allocates a large block as it starts).
std::atomic<int> g_state{kUnset};
// Set once, before g_state leaves kUnset (release; read after acquire).
char* g_base = nullptr;
uint64_t g_capacity = 0;
uint64_t g_block_bytes = 0;
int g_fd = -1;
int64_t g_pid = 0;
dev_t g_fd_device = 0;
ino_t g_fd_inode = 0;
std::atomic<uint64_t> g_fallbacks{0};
// Guards the heap's tables. Never held across a call that may come back
// into a large allocation (the tables allocate from glibc directly).
std::mutex g_mutex;
// The tables live here and are never destroyed: frees may come after exit
// handlers have run.
alignas(Heap) unsigned char g_heap_storage[sizeof(Heap)];
Heap* g_heap = nullptr;

using UsableSizeFunction = size_t (*)(void*);
std::atomic<UsableSizeFunction> g_glibc_usable_size{nullptr};

// Creates the heap (g_mutex held); false when it is off or cannot be had.
bool CreateHeap() {
  const char* enabled = std::getenv("TFRING_SHARED_HEAP");
  if (enabled != nullptr && std::strcmp(enabled, "0") == 0) return false;
  const long page = sysconf(_SC_PAGESIZE);
  if (page <= 0 || (page & (page - 1)) != 0) return false;
  const uint64_t block_bytes = std::max<uint64_t>(kHeapAlignment, page);
  uint64_t capacity = 0;
  const char* requested = std::getenv("TFRING_SHARED_HEAP_BYTES");
  if (requested != nullptr && *requested >= '0' && *requested <= '9') {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(requested, &end, 10);
    if (*end == '\0' && value != ~0ull) capacity = value;
  }
  if (capacity == 0) {
    const long pages = sysconf(_SC_PHYS_PAGES);
    if (pages <= 0) return false;
    capacity = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  }
  if (!RoundUp(capacity, std::max(kCapacityUnit, block_bytes), &capacity) ||
      capacity > static_cast<uint64_t>(INT64_MAX)) {
    return false;
  }
  const int fd = memfd_create("tfring-shared-heap", MFD_CLOEXEC);
  if (fd < 0) return false;
  struct stat file;
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(capacity)) == 0 && fstat(fd, &file) == 0) {
    // At an address aligned to kLargestAlignment: reserve a little more,
    // map the file over the aligned part, give the ends back.
    const uint64_t reserved = capacity + kLargestAlignment;
    void* range = mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
    if (range != MAP_FAILED) {
      const uintptr_t start = reinterpret_cast<uintptr_t>(range);
      const uintptr_t aligned = (start + kLargestAlignment - 1) & ~(kLargestAlignment - 1);
      base = mmap(reinterpret_cast<void*>(aligned), capacity, PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_NORESERVE | MAP_FIXED, fd, 0);
      if (base == MAP_FAILED) {
        munmap(range, reserved);
      } else {
        if (aligned > start) munmap(range, aligned - start);
        const uintptr_t end = start + reserved;
        if (end > aligned + capacity) {
          munmap(reinterpret_cast<void*>(aligned + capacity), end - aligned - capacity);
        }
      }
    }
  }
  if (base == MAP_FAILED) {
    close(fd);
    return false;
  }
  g_base = static_cast<char*>(base);
  g_capacity = capacity;
  g_block_bytes = block_bytes;
  g_fd = fd;
  g_fd_device = file.st_dev;
  g_fd_inode = file.st_ino;
  g_pid = getpid();
  g_heap = new (g_heap_storage) Heap(g_base, capacity);
  return true;
}

// Whether g_fd still names the memfd: the program may have closed it, and
// the number been reused.
bool FdIsTheHeaps() {
  struct stat file;
  return fstat(g_fd, &file) == 0 && file.st_dev == g_fd_device && file.st_ino == g_fd_inode;
}

void LockForFork() { g_mutex.lock(); }
void UnlockInParent() { g_mutex.unlock(); }

// The forked child's side (see Heap::MakePrivate). Single threaded, with
// g_mutex held since the parent's fork.
void MakePrivateInChild() {
  if (g_state.load(std::memory_order_relaxed) == kOn) {
    g_heap->MakePrivate();
    if (FdIsTheHeaps()) close(g_fd);
    g_state.store(kPrivate, std::memory_order_release);
  }
  g_mutex.unlock();
}

void RegisterForkHandlers() {
  static std::atomic<bool> registered{false};
  if (!registered.exchange(true)) {
    pthread_atfork(LockForFork, UnlockInParent, MakePrivateInChild);
  }
}

// Whether the heap serves allocations, creating it on the first call.
bool HeapOn() {
  int state = g_state.load(std::memory_order_acquire);
  if (state == kUnset) {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_state.load(std::memory_order_relaxed) == kUnset) {
        g_state.store(CreateHeap() ? kOn : kOff, std::memory_order_release);
      }
    }
    // Not under g_mutex: pthread_atfork takes glibc's fork lock, which a
    // fork in progress holds while it waits for g_mutex.
    RegisterForkHandlers();
    state = g_state.load(std::memory_order_acquire);
  }
  return state == kOn;
}

// Whether `pointer` lies in the heap's range (its blocks, or their private
// copies in a forked child).
bool InHeap(const void* pointer) {
  const int state = g_state.load(std::memory_order_acquire);
  return (state == kOn || state == kPrivate) &&
         reinterpret_cast<uintptr_t>(pointer) - reinterpret_cast<uintptr_t>(g_base) < g_capacity;
}

uint64_t OffsetOf(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) - reinterpret_cast<uintptr_t>(g_base);
}

// A heap block of at least `bytes` (*zeroed: whether it reads as zeros),
// or nullptr: the heap is off (glibc serves), or full (glibc serves, and
// that counts as a fallback).
void* HeapAllocate(size_t bytes, bool* zeroed, size_t alignment = kHeapAlignment) {
  if (!HeapOn()) return nullptr;
  uint64_t rounded;
  uint64_t offset = kNoBlock;
  if (RoundUp(bytes, g_block_bytes, &rounded)) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_state.load(std::memory_order_relaxed) != kOn) return nullptr;
    offset = g_heap->Allocate(rounded, std::max<uint64_t>(alignment, g_block_bytes), zeroed);
  }
  if (offset == kNoBlock) {
    g_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  return g_base + offset;
}

__attribute__((noinline)) void HeapFree(void* pointer) {
  const uint64_t offset = OffsetOf(pointer);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_state.load(std::memory_order_relaxed) == kPrivate) {
    // A forked child's copy: its pages go, its addresses stay reserved.
    uint64_t bytes;
    if (!g_heap->Forget(offset, &bytes)) Die("free(): invalid pointer", pointer);
    madvise(pointer, bytes, MADV_DONTNEED);
    return;
  }
  if (!g_heap->Free(offset)) Die("free(): invalid pointer", pointer);
}

// A new allocation of `bytes` with `alignment` (at most kLargestAlignment for
// the heap), as memalign.
void* AlignedAllocate(size_t alignment, size_t bytes) {
  if (bytes >= kSharedHeapSmallestBytes && alignment <= kLargestAlignment) {
    bool zeroed;
    if (void* block = HeapAllocate(bytes, &zeroed, alignment)) return block;
  }
  return __libc_memalign(alignment, bytes);
}

// realloc of a heap block: in place when it can, else moved to a new
// allocation (the heap's or glibc's, by size).
void* HeapRealloc(void* pointer, size_t bytes) {
  const uint64_t offset = OffsetOf(pointer);
  uint64_t old_bytes;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    old_bytes = g_heap->BlockSize(offset);
    if (old_bytes == 0) Die("realloc(): invalid pointer", pointer);
    uint64_t rounded;
    if (bytes >= kSharedHeapSmallestBytes && RoundUp(bytes, g_block_bytes, &rounded)) {
      if (g_state.load(std::memory_order_relaxed) == kOn) {
        if (g_heap->ResizeInPlace(offset, rounded)) return pointer;
      } else if (rounded <= old_bytes) {
        return pointer;  // a forked child's copy, shrunk in name only
      }
    }
  }
  void* moved = nullptr;
  if (bytes >= kSharedHeapSmallestBytes) {
    bool zeroed;
    moved = HeapAllocate(bytes, &zeroed);
  }
  if (moved == nullptr) moved = __libc_malloc(bytes);
  if (moved == nullptr) return nullptr;  // errno is ENOMEM; `pointer` stays
  std::memcpy(moved, pointer, std::min<uint64_t>(old_bytes, bytes));
  HeapFree(pointer);
  return moved;
}

UsableSizeFunction GlibcUsableSize() {
  UsableSizeFunction function = g_glibc_usable_size.load(std::memory_order_acquire);
  if (function == nullptr) {
    // dlsym may allocate; small requests go straight to glibc, no lock held.
    function = reinterpret_cast<UsableSizeFunction>(dlsym(RTLD_NEXT, "malloc_usable_size"));
    g_glibc_usable_size.store(function, std::memory_order_release);
  }
  return function;
}

// realloc of a glibc block: one that grows large moves into the heap (so
// peers can reach it), copying what glibc says it holds; the rest stays.
void* GlibcRealloc(void* pointer, size_t bytes) {
  const UsableSizeFunction usable_size = GlibcUsableSize();
  if (bytes >= kSharedHeapSmallestBytes && usable_size != nullptr) {
    bool zeroed;
    if (void* moved = HeapAllocate(bytes, &zeroed)) {
      std::memcpy(moved, pointer, std::min(usable_size(pointer), bytes));
      __libc_free(pointer);
      return moved;
    }
  }
  return __libc_realloc(pointer, bytes);
}

// malloc of at least kSharedHeapSmallestBytes: the heap's, or glibc's when
// the heap is off or full.
__attribute__((noinline)) void* LargeMalloc(size_t bytes) {
  bool zeroed;
  if (void* block = HeapAllocate(bytes, &zeroed)) return block;
  return __libc_malloc(bytes);
}

__attribute__((constructor)) void Start() {
  tfring_preload::RemoveSelfFromPreload(reinterpret_cast<const void*>(&Start));
  RegisterForkHandlers();
  GlibcUsableSize();
}

}  // namespace

extern "C" {

// malloc and free are called for every small block of the program too:
// their glibc paths are tail calls, one compare and one jump through the
// GOT (-fno-plt) on top of glibc's own cost (measured: 1.2 ns more per
// malloc and free pair, 2.7 ns with calls through the PLT), the heap's
// paths out of line.
TFRING_HEAP_EXPORT void* malloc(size_t bytes) noexcept {
  if (__builtin_expect(bytes >= kSharedHeapSmallestBytes, 0)) return LargeMalloc(bytes);
  return __libc_malloc(bytes);
}

TFRING_HEAP_EXPORT void free(void* pointer) noexcept {
  if (__builtin_expect(InHeap(pointer), 0)) return HeapFree(pointer);
  return __libc_free(pointer);
}

TFRING_HEAP_EXPORT void* calloc(size_t count, size_t size) noexcept {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  if (bytes >= kSharedHeapSmallestBytes) {
    bool zeroed = false;
    if (void* block = HeapAllocate(bytes, &zeroed)) {
      if (!zeroed) std::memset(block, 0, bytes);
      return block;
    }
  }
  return __libc_calloc(count, size);
}

TFRING_HEAP_EXPORT void* realloc(void* pointer, size_t bytes) noexcept {
  if (pointer == nullptr) return malloc(bytes);
  if (!InHeap(pointer)) return GlibcRealloc(pointer, bytes);
  if (bytes == 0) {
    HeapFree(pointer);  // as glibc: realloc(p, 0) frees p
    return nullptr;
  }
  return HeapRealloc(pointer, bytes);
}

TFRING_HEAP_EXPORT int posix_memalign(void** out, size_t alignment, size_t bytes) noexcept {
  if (alignment == 0 || alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) {
    return EINVAL;
  }
  void* block = AlignedAllocate(alignment, bytes);
  if (block == nullptr) return ENOMEM;
  *out = block;
  return 0;
}

// As glibc before 2.38: any alignment, rounded up to a power of two.
TFRING_HEAP_EXPORT void* aligned_alloc(size_t alignment, size_t bytes) noexcept {
  return AlignedAllocate(alignment, bytes);
}

TFRING_HEAP_EXPORT void* memalign(size_t alignment, size_t bytes) noexcept {
  return AlignedAllocate(alignment, bytes);
}

TFRING_HEAP_EXPORT void* valloc(size_t bytes) noexcept {
  return AlignedAllocate(static_cast<size_t>(sysconf(_SC_PAGESIZE)), bytes);
}

TFRING_HEAP_EXPORT void* pvalloc(size_t bytes) noexcept {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  uint64_t rounded;
  if (!RoundUp(bytes, page, &rounded) || rounded > SIZE_MAX) {
    errno = ENOMEM;
    return nullptr;
  }
  return AlignedAllocate(page, static_cast<size_t>(rounded));
}

TFRING_HEAP_EXPORT size_t malloc_usable_size(void* pointer) noexcept {
  if (pointer == nullptr) return 0;
  if (InHeap(pointer)) {
    std::lock_guard<std::mutex> lock(g_mutex);
    return static_cast<size_t>(g_heap->BlockSize(OffsetOf(pointer)));
  }
  const UsableSizeFunction glibc = GlibcUsableSize();
  return glibc == nullptr ? 0 : glibc(pointer);
}

// C23's sized frees, which a newer glibc may route past free().
TFRING_HEAP_EXPORT void free_sized(void* pointer, size_t) noexcept { free(pointer); }
TFRING_HEAP_EXPORT void free_aligned_sized(void* pointer, size_t, size_t) noexcept {
  free(pointer);
}

// Creates the heap if no large request has yet. Reports none too when the
// program has closed the memfd (its number may name another file now), as
// the peers could not open it.
TFRING_HEAP_EXPORT void tfring_shared_heap_info(TfringSharedHeapInfo* info) {
  if (info == nullptr) return;
  const bool on = HeapOn() && FdIsTheHeaps();
  info->present = on ? 1 : 0;
  info->fd = on ? g_fd : -1;
  info->pid = on ? g_pid : static_cast<int64_t>(getpid());
  info->base = on ? g_base : nullptr;
  info->capacity = on ? g_capacity : 0;
  info->fallbacks = g_fallbacks.load(std::memory_order_relaxed);
}

}  // extern "C"
