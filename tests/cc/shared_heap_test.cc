// Tests of libtfring_shared_heap.so (tfring/shared_heap.cc), the malloc that
// serves a rank's large allocations from one shared memfd.
//
// How: this program runs with the library preloaded, so its own malloc,
// new and posix_memalign are the library's; it finds tfring_shared_heap_info
// as the core does (dlsym(RTLD_DEFAULT)). Scenarios that need another
// environment (a small heap, the heap off) or another process (a peer that
// maps the heap) start this binary again as `child <name> [args]`, with
// LD_PRELOAD naming the library again (it took itself out as it loaded). The
// layouts the scenarios expect hold in a fresh process and after the
// scenarios before them (each frees what it allocates, so the heap merges
// back to its start).
//
// Usage: shared_heap_test <scenario|all|list>
//        shared_heap_test bench <count> <KiB>
//        shared_heap_test child <name> [args]
// Prints "PASS <scenario>" or "FAIL <scenario>: why" per scenario and exits
// non-zero if any failed; `bench` times malloc+free pairs of the library
// next to glibc's own (no assertions). Driven from tests/test_shared_heap.py.

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cc/shared_heap_info.h"
#include "tests/cc/expect.h"

extern char** environ;

// glibc's own, for the benchmark's baseline.
extern "C" {
void* __libc_malloc(size_t size);
void __libc_free(void* pointer);
}

namespace tfring {
namespace {

using ::tfring::testing::TestFailure;
using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kPage = 4096;
constexpr size_t kSmallest = kSharedHeapSmallestBytes;

using InfoFunction = void (*)(TfringSharedHeapInfo*);

InfoFunction InfoSymbol() {
  return reinterpret_cast<InfoFunction>(dlsym(RTLD_DEFAULT, kSharedHeapInfoSymbol));
}

TfringSharedHeapInfo Info() {
  const InfoFunction function = InfoSymbol();
  EXPECT_TRUE(function != nullptr, kSharedHeapInfoSymbol
                                       << " not found: run with "
                                          "LD_PRELOAD=libtfring_shared_heap.so");
  TfringSharedHeapInfo info;
  std::memset(&info, 0xEE, sizeof(info));
  function(&info);
  return info;
}

bool InRange(const void* pointer, const TfringSharedHeapInfo& info) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(pointer);
  const uintptr_t base = reinterpret_cast<uintptr_t>(info.base);
  return info.base != nullptr && at >= base && at - base < info.capacity;
}

bool InHeap(const void* pointer) { return InRange(pointer, Info()); }

// `pointer`, hidden from the compiler's analysis.
void* Opaque(void* pointer) {
  asm volatile("" : "+r"(pointer));
  return pointer;
}

bool Aligned(const void* pointer, size_t alignment) {
  return reinterpret_cast<uintptr_t>(pointer) % alignment == 0;
}

// The path of the preloaded library, as the loader found it.
std::string LibraryPath() {
  Dl_info info;
  const InfoFunction function = InfoSymbol();
  EXPECT_TRUE(function != nullptr, "the library is not loaded");
  EXPECT_TRUE(dladdr(reinterpret_cast<void*>(function), &info) != 0 && info.dli_fname,
              "dladdr does not know the library");
  return info.dli_fname;
}

// The bytes of the memfd that hold pages.
uint64_t FileBytes(int fd) {
  struct stat file;
  EXPECT_TRUE(fstat(fd, &file) == 0, "fstat of the memfd: " << std::strerror(errno));
  return static_cast<uint64_t>(file.st_blocks) * 512;
}

// Deterministic byte `i` of pattern `seed`.
unsigned char PatternByte(uint64_t seed, size_t i) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  return static_cast<unsigned char>(x ^ (x >> 17));
}

void Fill(void* data, size_t bytes, uint64_t seed) {
  unsigned char* p = static_cast<unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) p[i] = PatternByte(seed, i);
}

void ExpectPattern(const void* data, size_t bytes, uint64_t seed, const std::string& what) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    EXPECT_TRUE(p[i] == PatternByte(seed, i), what << ": byte " << i << " of " << bytes
                                                   << " is " << int(p[i]) << ", expected "
                                                   << int(PatternByte(seed, i)));
  }
}

void ExpectAll(const void* data, size_t bytes, unsigned char value, const std::string& what) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    EXPECT_TRUE(p[i] == value, what << ": byte " << i << " of " << bytes << " is " << int(p[i])
                                    << ", expected " << int(value));
  }
}

// --- Processes ---

// Runs this binary as `child <args>` with the library preloaded again and
// `environment` ("NAME=value", or "NAME=" to remove NAME) over this
// process's; its exit status as waitpid reports it.
int RunChild(const std::vector<std::string>& args,
             const std::vector<std::string>& environment = {}) {
  std::vector<std::string> overrides = {"LD_PRELOAD=" + LibraryPath()};
  overrides.insert(overrides.end(), environment.begin(), environment.end());
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> strings;
  for (char** entry = environ; *entry != nullptr; ++entry) strings.push_back(*entry);
  for (const std::string& override : overrides) {
    std::vector<std::string> kept;
    for (const std::string& entry : strings) {
      if (name_of(entry) != name_of(override)) kept.push_back(entry);
    }
    if (override.back() != '=') kept.push_back(override);
    strings = kept;
  }
  std::vector<std::string> argv_strings = {"/proc/self/exe", "child"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  for (std::string& entry : strings) envp.push_back(entry.data());
  envp.push_back(nullptr);
  pid_t pid;
  const int error = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(),
                                envp.data());
  EXPECT_TRUE(error == 0, "posix_spawn: " << std::strerror(error));
  int status = 0;
  EXPECT_TRUE(waitpid(pid, &status, 0) == pid, "waitpid: " << std::strerror(errno));
  return status;
}

void ExpectChildPasses(const std::vector<std::string>& args,
                       const std::vector<std::string>& environment = {}) {
  const int status = RunChild(args, environment);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "child " << args[0] << " ended with status " << status
                       << " (its output is above)");
}

// Forks; the child runs `body` and exits 0, or 1 when a check failed
// (after printing why). Returns the child's pid.
pid_t ForkRunning(const std::function<void()>& body) {
  std::fflush(stdout);
  const pid_t pid = fork();
  EXPECT_TRUE(pid >= 0, "fork: " << std::strerror(errno));
  if (pid == 0) {
    int code = 0;
    try {
      body();
    } catch (const TestFailure& failure) {
      std::fprintf(stderr, "in forked child: %s\n", failure.message.c_str());
      code = 1;
    }
    _exit(code);
  }
  return pid;
}

// Waits for `pid` up to `limit` (then SIGKILLs it); its status.
int WaitWithDeadline(pid_t pid, std::chrono::seconds limit) {
  const Clock::time_point start = Clock::now();
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    EXPECT_TRUE(done >= 0, "waitpid: " << std::strerror(errno));
    if (done == pid) return status;
    if (Clock::now() - start > limit) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      EXPECT_TRUE(false, "process " << pid << " still running after " << limit.count()
                                    << " s (a deadlock?)");
    }
    usleep(1000);
  }
}

void ExpectForkedPasses(const std::function<void()>& body, const std::string& what) {
  const int status = WaitWithDeadline(ForkRunning(body), std::chrono::seconds(60));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              what << ": forked child ended with status " << status);
}

// --- Scenarios ---

void InfoScenario() {
  void* block = malloc(kMiB);
  const TfringSharedHeapInfo info = Info();
  EXPECT_TRUE(info.present == 1, "present is " << info.present);
  EXPECT_TRUE(InRange(block, info), "a 1 MiB malloc at " << block << " is not in the heap at "
                                                         << info.base << " (" << info.capacity
                                                         << " bytes)");
  EXPECT_TRUE(info.pid == getpid(), "pid is " << info.pid << ", not " << getpid());
  EXPECT_TRUE(info.capacity > 0 && info.capacity % (2 * kMiB) == 0,
              "capacity " << info.capacity);
  EXPECT_TRUE(Aligned(info.base, kPage), "base " << info.base);
  EXPECT_TRUE(info.fallbacks == 0, "fallbacks " << info.fallbacks);
  struct stat file;
  EXPECT_TRUE(fstat(info.fd, &file) == 0, "fstat of fd " << info.fd << ": "
                                                          << std::strerror(errno));
  EXPECT_TRUE(static_cast<uint64_t>(file.st_size) == info.capacity,
              "the memfd has " << file.st_size << " bytes, capacity " << info.capacity);
  char target[256] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(info.fd);
  EXPECT_TRUE(readlink(link.c_str(), target, sizeof(target) - 1) > 0, "readlink " << link);
  EXPECT_TRUE(std::strstr(target, "memfd:tfring-shared-heap") != nullptr,
              link << " is " << target);
  // The memfd must not leak into programs the rank starts.
  EXPECT_TRUE((fcntl(info.fd, F_GETFD) & FD_CLOEXEC) != 0, "the memfd is not close-on-exec");
  free(block);
}

void SmallStaysPrivate() {
  void* tiny = malloc(100);
  void* below = malloc(kSmallest - 1);
  void* smallest = malloc(kSmallest);
  char* array = new char[kMiB];
  std::vector<float> vector(kMiB);
  EXPECT_TRUE(tiny != nullptr && !InHeap(tiny), "malloc(100) at " << tiny << " is in the heap");
  EXPECT_TRUE(below != nullptr && !InHeap(below), "malloc(64 KiB - 1) is in the heap");
  EXPECT_TRUE(InHeap(smallest) && Aligned(smallest, kPage),
              "malloc(64 KiB) at " << smallest << " is not a heap page");
  EXPECT_TRUE(InHeap(array), "new char[1 MiB] is not in the heap");
  EXPECT_TRUE(InHeap(vector.data()), "a 4 MiB std::vector is not in the heap");
  std::memset(tiny, 1, 100);
  std::memset(below, 2, kSmallest - 1);
  std::memset(smallest, 3, kSmallest);
  free(tiny);
  free(below);
  free(smallest);
  delete[] array;
}

void Alignment() {
  for (const size_t alignment : {size_t{16}, size_t{64}, size_t{256}, kPage}) {
    for (const size_t bytes : {kSmallest, kMiB + 1, 5 * kMiB + 3}) {
      void* posix = nullptr;
      EXPECT_TRUE(posix_memalign(&posix, alignment, bytes) == 0, "posix_memalign failed");
      void* aligned = aligned_alloc(alignment, bytes);
      void* mem = memalign(alignment, bytes);
      for (void* block : {posix, aligned, mem}) {
        EXPECT_TRUE(InHeap(block) && Aligned(block, alignment),
                    bytes << " bytes at " << alignment << ": " << block);
        std::memset(block, 0x5A, bytes);
      }
      free(posix);
      free(aligned);
      free(mem);
    }
  }
  void* page = valloc(kMiB);
  void* rounded = pvalloc(kSmallest - 100);  // rounds up to 64 KiB: the heap's
  EXPECT_TRUE(InHeap(page) && Aligned(page, kPage), "valloc: " << page);
  EXPECT_TRUE(InHeap(rounded) && Aligned(rounded, kPage), "pvalloc: " << rounded);
  EXPECT_TRUE(malloc_usable_size(rounded) >= kSmallest, "pvalloc did not round up");
  free(page);
  free(rounded);
  char* aligned_new = new (std::align_val_t(512)) char[kMiB];
  EXPECT_TRUE(InHeap(aligned_new) && Aligned(aligned_new, 512), "aligned new");
  operator delete[](aligned_new, std::align_val_t(512));
  // Beyond a page, up to a huge page (the output pool's 2 MiB buffers): the
  // heap's too, the gaps below them reused; beyond that, glibc's.
  std::vector<void*> blocks;
  for (int round = 0; round < 3; ++round) {
    for (const size_t alignment : {size_t{8192}, 2 * kMiB, size_t{65536}, 2 * kMiB}) {
      void* posix = nullptr;
      EXPECT_TRUE(posix_memalign(&posix, alignment, kMiB + 4096 * round) == 0,
                  "posix_memalign failed");
      void* aligned = aligned_alloc(alignment, 3 * kMiB);
      for (void* block : {posix, aligned}) {
        EXPECT_TRUE(block != nullptr && InHeap(block) && Aligned(block, alignment),
                    "alignment " << alignment << ": " << block);
        blocks.push_back(block);
      }
      std::memset(posix, 0x5A, kMiB);
      std::memset(aligned, 0x5B, 3 * kMiB);
      void* plain = malloc(kSmallest);  // may land in a gap
      EXPECT_TRUE(InHeap(plain), "a plain block after aligned ones: " << plain);
      std::memset(plain, 0x5C, kSmallest);
      blocks.push_back(plain);
    }
  }
  for (void* block : blocks) free(block);
  void* beyond = nullptr;
  EXPECT_TRUE(posix_memalign(&beyond, 4 * kMiB, kMiB) == 0 && !InHeap(beyond) &&
                  Aligned(beyond, 4 * kMiB),
              "4 MiB alignment: " << beyond);
  free(beyond);
  // Small: glibc's, aligned all the same.
  void* small = nullptr;
  EXPECT_TRUE(posix_memalign(&small, 64, 1000) == 0 && !InHeap(small) && Aligned(small, 64),
              "small aligned: " << small);
  free(small);
  void* untouched = &small;
  for (const size_t bad : {size_t{0}, size_t{3}, size_t{12}, size_t{4}}) {
    EXPECT_TRUE(posix_memalign(&untouched, bad, kMiB) == EINVAL,
                "posix_memalign with alignment " << bad << " is not EINVAL");
  }
  EXPECT_TRUE(untouched == &small, "a failed posix_memalign wrote its result");
}

void ReuseAndMerge() {
  const size_t part = 3 * kMiB + 5 * kPage;  // a size nothing else uses
  char* block[5];
  for (char*& b : block) b = static_cast<char*>(malloc(part));
  char* guard = static_cast<char*>(malloc(kSmallest));
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(InHeap(block[i]), "block " << i << " is not in the heap");
    if (i > 0) {
      EXPECT_TRUE(block[i] == block[i - 1] + part,
                  "fresh blocks are not laid out in order: " << static_cast<void*>(block[i])
                      << " after " << static_cast<void*>(block[i - 1]));
    }
  }
  EXPECT_TRUE(guard == block[4] + part, "the guard is not after the blocks");
  // Holes: [1, 2] (merged, 2 parts) and [4] (1 part, below the guard).
  free(block[1]);
  free(block[2]);
  free(block[4]);
  char* one = static_cast<char*>(malloc(part));
  EXPECT_TRUE(one == block[4], "best fit: one part should take hole [4], not the larger one");
  char* two = static_cast<char*>(malloc(2 * part));
  EXPECT_TRUE(two == block[1], "two parts should fit in the merged hole [1, 2]");
  // Part of a hole, then the rest of it.
  free(two);
  char* half = static_cast<char*>(malloc(part));
  char* other_half = static_cast<char*>(malloc(part));
  EXPECT_TRUE(half == block[1] && other_half == block[2], "a hole split in order");
  free(half);
  free(other_half);
  free(one);
  free(block[0]);
  free(block[3]);
  // Everything up to the guard is free and merged: five parts fit at block 0.
  char* five = static_cast<char*>(malloc(5 * part));
  EXPECT_TRUE(five == block[0], "five parts should fit where the five blocks were");
  free(five);
  // A block freed at the top lowers it: the guard's space is reused too.
  free(guard);
  char* six = static_cast<char*>(malloc(6 * part));
  EXPECT_TRUE(six == block[0], "after freeing everything, six parts start at block 0");
  free(six);
}

void CallocZeroes() {
  // A dirty free block below the top.
  char* dirty = static_cast<char*>(malloc(kMiB));
  char* guard = static_cast<char*>(malloc(kSmallest));
  std::memset(dirty, 0xAB, kMiB);
  free(dirty);
  char* zeroed = static_cast<char*>(calloc(kMiB, 1));
  EXPECT_TRUE(zeroed == dirty, "calloc should reuse the free block");
  ExpectAll(zeroed, kMiB, 0, "calloc of a reused dirty block");
  free(zeroed);
  // A released free block (beyond the 512 MiB the heap retains: punched
  // out).
  const size_t big = 640 * kMiB;
  char* large = static_cast<char*>(malloc(big));
  char* guard2 = static_cast<char*>(malloc(kSmallest));
  std::memset(large, 0xCD, big);
  free(large);
  char* large_zeroed = static_cast<char*>(calloc(big / 8, 8));
  EXPECT_TRUE(large_zeroed == large, "calloc should reuse the released block");
  ExpectAll(large_zeroed, big, 0, "calloc of a released block");
  free(large_zeroed);
  free(guard2);
  // Freed at the top, kept dirty (within what the heap retains).
  char* top = static_cast<char*>(malloc(2 * kMiB));
  std::memset(top, 0xEF, 2 * kMiB);
  free(top);
  char* top_zeroed = static_cast<char*>(calloc(2, kMiB));
  EXPECT_TRUE(top_zeroed == top, "calloc should reuse the top");
  ExpectAll(top_zeroed, 2 * kMiB, 0, "calloc at the top");
  free(top_zeroed);
  free(guard);
  char* fresh = static_cast<char*>(calloc(kSmallest / 8, 8));
  EXPECT_TRUE(InHeap(fresh), "a 64 KiB calloc is not in the heap");
  ExpectAll(fresh, kSmallest, 0, "a fresh calloc");
  free(fresh);
  errno = 0;
  volatile size_t half_of_everything = SIZE_MAX / 2;  // no compile-time warning
  EXPECT_TRUE(calloc(half_of_everything, 4) == nullptr && errno == ENOMEM,
              "an overflowing calloc did not fail with ENOMEM");
  void* none = calloc(0, kMiB);
  free(none);
}

void ReleaseMemory() {
  const int fd = Info().fd;
  // A free block below the top beyond the 512 MiB the heap retains gives
  // its pages back.
  const size_t big = 640 * kMiB;
  char* large = static_cast<char*>(malloc(big));
  char* guard = static_cast<char*>(malloc(kSmallest));
  std::memset(large, 1, big);
  std::memset(guard, 1, kSmallest);
  const uint64_t filled = FileBytes(fd);
  EXPECT_TRUE(filled >= big, "the memfd holds " << filled << " bytes after a 640 MiB memset");
  free(large);
  const uint64_t after_free = FileBytes(fd);
  EXPECT_TRUE(after_free + big <= filled, "freeing 640 MiB left the memfd at "
                                              << after_free << " bytes (was " << filled
                                              << ")");
  // A smaller free block keeps its pages, and so does one freed at the top
  // within what is retained.
  char* small = static_cast<char*>(malloc(8 * kMiB));
  EXPECT_TRUE(small == large, "the released block is not reused");
  char* guard2 = static_cast<char*>(malloc(kSmallest));
  std::memset(small, 2, 8 * kMiB);
  const uint64_t with_small = FileBytes(fd);
  free(small);
  EXPECT_TRUE(FileBytes(fd) == with_small, "an 8 MiB free block gave its pages back");
  free(guard2);
  free(guard);
  // A large block freed at the top gives its pages back too.
  char* top = static_cast<char*>(malloc(big));
  std::memset(top, 3, big);
  const uint64_t with_top = FileBytes(fd);
  free(top);
  const uint64_t after_top = FileBytes(fd);
  EXPECT_TRUE(after_top + big <= with_top, "freeing 640 MiB at the top left the memfd at "
                                               << after_top << " bytes (was " << with_top
                                               << ")");
}

void Realloc() {
  char* block = static_cast<char*>(malloc(1000));
  Fill(block, 1000, 1);
  block = static_cast<char*>(realloc(block, kMiB));
  EXPECT_TRUE(InHeap(block), "realloc to 1 MiB did not move into the heap");
  ExpectPattern(block, 1000, 1, "realloc small to large");
  Fill(block, kMiB, 2);
  char* grown = static_cast<char*>(realloc(block, 8 * kMiB));
  EXPECT_TRUE(InHeap(grown), "realloc to 8 MiB left the heap");
  ExpectPattern(grown, kMiB, 2, "realloc 1 MiB to 8 MiB");
  Fill(grown, 8 * kMiB, 3);
  char* shrunk = static_cast<char*>(realloc(grown, 2 * kMiB));
  EXPECT_TRUE(shrunk == grown, "shrinking a heap block moved it");
  EXPECT_TRUE(malloc_usable_size(shrunk) == 2 * kMiB,
              "after shrinking, usable size " << malloc_usable_size(shrunk));
  ExpectPattern(shrunk, 2 * kMiB, 3, "realloc 8 MiB to 2 MiB");
  char* small = static_cast<char*>(realloc(shrunk, 1000));
  EXPECT_TRUE(small != nullptr && !InHeap(small), "realloc to 1000 bytes stayed in the heap");
  ExpectPattern(small, 1000, 3, "realloc large to small");
  free(small);

  char* from_null = static_cast<char*>(realloc(nullptr, kMiB));
  EXPECT_TRUE(InHeap(from_null), "realloc(nullptr, 1 MiB) is not in the heap");
  EXPECT_TRUE(realloc(from_null, 0) == nullptr, "realloc(p, 0) should free p");

  // Growing in place: at the top, and into a free neighbour.
  char* a = static_cast<char*>(malloc(kMiB));
  char* b = static_cast<char*>(malloc(2 * kMiB));
  char* guard = static_cast<char*>(malloc(kSmallest));
  Fill(a, kMiB, 4);
  free(b);
  char* a2 = static_cast<char*>(realloc(a, 2 * kMiB));
  EXPECT_TRUE(a2 == a, "growing into a free neighbour moved the block");
  char* a3 = static_cast<char*>(realloc(a2, 3 * kMiB));
  EXPECT_TRUE(a3 == a, "growing to the end of a free neighbour moved the block");
  ExpectPattern(a3, kMiB, 4, "realloc in place");
  char* a4 = static_cast<char*>(realloc(a3, 3 * kMiB + kPage));
  EXPECT_TRUE(a4 != a && InHeap(a4), "growing past the guard did not move the block");
  ExpectPattern(a4, kMiB, 4, "realloc moved");
  free(guard);
  char* at_top = static_cast<char*>(realloc(a4, 20 * kMiB));
  EXPECT_TRUE(at_top == a4, "growing the block at the top moved it");
  ExpectPattern(at_top, kMiB, 4, "realloc at the top");
  // reallocarray is glibc's, and calls realloc.
  char* array = static_cast<char*>(reallocarray(at_top, 4, 8 * kMiB));
  EXPECT_TRUE(InHeap(array), "reallocarray left the heap");
  ExpectPattern(array, kMiB, 4, "reallocarray");
  free(array);

  // A large glibc block grown moves into the heap; shrunk, it stays glibc's.
  void* foreign = nullptr;
  EXPECT_TRUE(posix_memalign(&foreign, 4 * kMiB, kMiB) == 0 && !InHeap(foreign),
              "4 MiB aligned");
  Fill(foreign, kMiB, 5);
  char* foreign2 = static_cast<char*>(realloc(foreign, 4 * kMiB));
  EXPECT_TRUE(InHeap(foreign2), "glibc's block grown to 4 MiB did not move into the heap");
  ExpectPattern(foreign2, kMiB, 5, "realloc of a glibc block");
  free(foreign2);
  char* small_foreign = static_cast<char*>(malloc(5000));
  Fill(small_foreign, 5000, 6);
  small_foreign = static_cast<char*>(realloc(small_foreign, 3000));
  EXPECT_TRUE(small_foreign != nullptr && !InHeap(small_foreign), "a small realloc moved");
  ExpectPattern(small_foreign, 3000, 6, "a small realloc");
  free(small_foreign);
}

void UsableSize() {
  void* block = malloc(kMiB + 1);
  EXPECT_TRUE(malloc_usable_size(block) == kMiB + kPage,
              "usable size of 1 MiB + 1: " << malloc_usable_size(block));
  std::memset(block, 7, malloc_usable_size(block));
  free(block);
  void* small = malloc(100);
  const size_t small_usable = malloc_usable_size(small);
  EXPECT_TRUE(small_usable >= 100 && small_usable < 200, "usable size of 100: " << small_usable);
  free(small);
  EXPECT_TRUE(malloc_usable_size(nullptr) == 0, "usable size of nullptr");
  void* foreign = nullptr;
  EXPECT_TRUE(posix_memalign(&foreign, 8192, kMiB) == 0, "posix_memalign");
  EXPECT_TRUE(malloc_usable_size(foreign) >= kMiB, "usable size of a glibc block");
  free(foreign);
}

// Where a stamped block (see Threads) differs, and whose stamp is there.
std::string Overwritten(const char* data, size_t bytes, uint64_t tag) {
  std::ostringstream out;
  out << bytes << " bytes at " << static_cast<const void*>(data) << " stamped " << std::hex
      << tag;
  for (size_t at = 0; at + 16 <= bytes; at += kPage) {
    uint64_t found;
    std::memcpy(&found, data + at, 8);
    if (found != tag) {
      out << "; at byte " << std::dec << at << ": " << std::hex << found;
      return out.str();
    }
  }
  uint64_t last;
  std::memcpy(&last, data + bytes - 8, 8);
  out << "; the last word: " << last;
  return out.str();
}

// Threads allocating, filling, checking and freeing at once, in every way.
void Threads() {
  const uint64_t fallbacks = Info().fallbacks;
  constexpr int kThreads = 8;
  constexpr int kSlots = 12;
  constexpr int kSteps = 20000;
  std::atomic<int> failures{0};
  std::vector<std::string> messages(kThreads);
  // Writes `tag` into one word of every page (that ends 8 bytes before
  // the block does) and into the last word; checks them.
  auto stamp = [](char* data, size_t bytes, uint64_t tag) {
    for (size_t at = 0; at + 16 <= bytes; at += kPage) std::memcpy(data + at, &tag, 8);
    if (bytes >= 8) std::memcpy(data + bytes - 8, &tag, 8);
  };
  auto stamped = [](const char* data, size_t bytes, uint64_t tag) {
    for (size_t at = 0; at + 16 <= bytes; at += kPage) {
      if (std::memcmp(data + at, &tag, 8) != 0) return false;
    }
    return bytes < 8 || std::memcmp(data + bytes - 8, &tag, 8) == 0;
  };
  // The page words of a block of `bytes` that lie in its first `kept`.
  auto stamped_pages = [](const char* data, size_t bytes, size_t kept, uint64_t tag) {
    for (size_t at = 0; at + 16 <= bytes && at + 8 <= kept; at += kPage) {
      if (std::memcmp(data + at, &tag, 8) != 0) return false;
    }
    return true;
  };
  auto work = [&](int thread) {
    std::mt19937_64 random(thread * 7919 + 1);
    struct Slot {
      char* data = nullptr;
      size_t bytes = 0;
      uint64_t tag = 0;
    } slots[kSlots];
    for (int step = 0; step < kSteps && failures.load() == 0; ++step) {
      Slot& slot = slots[random() % kSlots];
      if (slot.data != nullptr) {
        if (!stamped(slot.data, slot.bytes, slot.tag)) {
          messages[thread] = "step " + std::to_string(step) + ": a block was overwritten: " +
                             Overwritten(slot.data, slot.bytes, slot.tag);
          failures.fetch_add(1);
          return;
        }
        if (random() % 3 == 0) {
          // Grow or shrink, across the threshold too.
          const size_t bytes = 1 + random() % (2 * kMiB);
          char* moved = static_cast<char*>(realloc(slot.data, bytes));
          if (moved == nullptr || !stamped_pages(moved, slot.bytes, bytes, slot.tag)) {
            messages[thread] = "step " + std::to_string(step) + ": realloc lost contents";
            failures.fetch_add(1);
            return;
          }
          slot.data = moved;
          slot.bytes = bytes;
          slot.tag = (uint64_t{1} << 63) | (uint64_t(thread) << 48) | step;
          stamp(slot.data, slot.bytes, slot.tag);
          continue;
        }
        free(slot.data);
        slot.data = nullptr;
        continue;
      }
      // Sizes from 16 bytes to 8 MiB, spread evenly in log scale, and now
      // and then one of 64 MiB or more.
      const size_t bytes = random() % 4096 == 0 ? 64 * kMiB : size_t{16} << (random() % 19);
      const size_t jitter = random() % bytes;
      slot.bytes = bytes + jitter;
      switch (random() % 4) {
        case 0: slot.data = static_cast<char*>(malloc(slot.bytes)); break;
        case 1: {
          slot.data = static_cast<char*>(calloc(1, slot.bytes));
          if (slot.data != nullptr && slot.bytes >= 8 &&
              (std::memcmp(slot.data, "\0\0\0\0\0\0\0\0", 8) != 0 ||
               std::memcmp(slot.data + slot.bytes - 8, "\0\0\0\0\0\0\0\0", 8) != 0)) {
            messages[thread] = "step " + std::to_string(step) + ": calloc not zero";
            failures.fetch_add(1);
            return;
          }
          break;
        }
        case 2: {
          void* aligned = nullptr;
          if (posix_memalign(&aligned, 64, slot.bytes) == 0) {
            slot.data = static_cast<char*>(aligned);
          }
          break;
        }
        default: slot.data = static_cast<char*>(aligned_alloc(kPage, slot.bytes)); break;
      }
      if (slot.data == nullptr) {
        messages[thread] = "step " + std::to_string(step) + ": allocation failed";
        failures.fetch_add(1);
        return;
      }
      slot.tag = (uint64_t(thread) << 48) | step;
      stamp(slot.data, slot.bytes, slot.tag);
    }
    for (Slot& slot : slots) {
      if (slot.data != nullptr && !stamped(slot.data, slot.bytes, slot.tag)) {
        messages[thread] = "at the end: a block was overwritten";
        failures.fetch_add(1);
      }
      free(slot.data);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(messages[t].empty(), "thread " << t << ": " << messages[t]);
  }
  EXPECT_TRUE(Info().fallbacks == fallbacks, "threads caused fallbacks");
  // Everything merged back: one large block fits at the bottom again.
  void* whole = malloc(64 * kMiB);
  EXPECT_TRUE(InHeap(whole), "64 MiB after the threads is not in the heap");
  free(whole);
}

void FullFallsBack() {
  ExpectChildPasses({"full"}, {"TFRING_SHARED_HEAP_BYTES=8388608"});
}

void FullChild() {
  const TfringSharedHeapInfo info = Info();
  EXPECT_TRUE(info.present == 1 && info.capacity == 8 * kMiB, "capacity " << info.capacity);
  const uint64_t before = info.fallbacks;
  // With any other block in the heap, two blocks of 4 MiB do not both fit.
  char* pin = static_cast<char*>(malloc(kSmallest));
  EXPECT_TRUE(InHeap(pin), "64 KiB is not in the heap");
  char* first = static_cast<char*>(malloc(4 * kMiB));
  char* second = static_cast<char*>(malloc(4 * kMiB));
  char* third = static_cast<char*>(malloc(4 * kMiB));
  EXPECT_TRUE(InHeap(first), "the first 4 MiB is not in the heap");
  EXPECT_TRUE(!InHeap(second) && !InHeap(third), "a second 4 MiB fit in 8 MiB");
  EXPECT_TRUE(Info().fallbacks == before + 2, "fallbacks " << Info().fallbacks << ", expected "
                                                           << before + 2);
  for (char* block : {first, second, third}) {
    std::memset(block, 9, 4 * kMiB);
    EXPECT_TRUE(malloc_usable_size(block) >= 4 * kMiB, "usable size");
  }
  free(second);
  free(third);
  // Too large for the heap at all: calloc, posix_memalign, realloc.
  char* zeros = static_cast<char*>(calloc(1, 16 * kMiB));
  EXPECT_TRUE(zeros != nullptr && !InHeap(zeros), "a 16 MiB calloc");
  ExpectAll(zeros, 16 * kMiB, 0, "a fallen-back calloc");
  free(zeros);
  void* aligned = nullptr;
  EXPECT_TRUE(posix_memalign(&aligned, 64, 16 * kMiB) == 0 && !InHeap(aligned) &&
                  Aligned(aligned, 64),
              "a 16 MiB posix_memalign");
  free(aligned);
  Fill(first, 4 * kMiB, 6);
  char* moved = static_cast<char*>(realloc(first, 16 * kMiB));
  EXPECT_TRUE(moved != nullptr && !InHeap(moved), "a 16 MiB realloc");
  ExpectPattern(moved, 4 * kMiB, 6, "realloc out of a full heap");
  free(moved);
  EXPECT_TRUE(Info().fallbacks == before + 5, "fallbacks " << Info().fallbacks << ", expected "
                                                           << before + 5);
  // Freed space serves again.
  char* again = static_cast<char*>(malloc(4 * kMiB));
  EXPECT_TRUE(again == first, "the freed 4 MiB is not reused");
  free(again);
  free(pin);
}

void SmallCapacity() {
  ExpectChildPasses({"capacity", "4194304"}, {"TFRING_SHARED_HEAP_BYTES=3000000"});
  ExpectChildPasses({"capacity", "2097152"}, {"TFRING_SHARED_HEAP_BYTES=1"});
}

void CapacityChild(const std::string& expected) {
  void* block = malloc(kSmallest);
  const TfringSharedHeapInfo info = Info();
  EXPECT_TRUE(info.present == 1 && info.capacity == std::stoull(expected),
              "capacity " << info.capacity << ", expected " << expected);
  EXPECT_TRUE(InRange(block, info), "a 64 KiB malloc is not in the heap");
  free(block);
}

void PeerMapsHeap() {
  const size_t bytes = 4 * kMiB + 3 * kPage;
  char* block = static_cast<char*>(malloc(bytes));
  const TfringSharedHeapInfo info = Info();
  EXPECT_TRUE(InRange(block, info), "the block is not in the heap");
  Fill(block, bytes, 7);
  const uint64_t offset = block - static_cast<char*>(info.base);
  // This process, through a second mapping of the same file.
  const std::string path = "/proc/self/fd/" + std::to_string(info.fd);
  const int fd = open(path.c_str(), O_RDWR);
  EXPECT_TRUE(fd >= 0, "open " << path << ": " << std::strerror(errno));
  void* alias = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset);
  close(fd);
  EXPECT_TRUE(alias != MAP_FAILED && alias != block, "mmap of " << path);
  ExpectPattern(alias, bytes, 7, "the second mapping");
  Fill(alias, bytes, 8);
  ExpectPattern(block, bytes, 8, "written through the second mapping");
  munmap(alias, bytes);
  // Another process, through /proc/<pid>/fd/<fd>: reads seed 8, writes 9.
  ExpectChildPasses({"peer", std::to_string(info.pid), std::to_string(info.fd),
                     std::to_string(offset), std::to_string(bytes)});
  ExpectPattern(block, bytes, 9, "written by the peer");
  free(block);
}

void PeerChild(const std::string& pid, const std::string& fd, const std::string& offset,
               const std::string& bytes_text) {
  const size_t bytes = std::stoull(bytes_text);
  const std::string path = "/proc/" + pid + "/fd/" + fd;
  const int file = open(path.c_str(), O_RDWR);
  EXPECT_TRUE(file >= 0, "open " << path << ": " << std::strerror(errno));
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, file,
                      static_cast<off_t>(std::stoull(offset)));
  close(file);
  EXPECT_TRUE(mapped != MAP_FAILED, "mmap of " << path << ": " << std::strerror(errno));
  ExpectPattern(mapped, bytes, 8, "the peer's view");
  Fill(mapped, bytes, 9);
  munmap(mapped, bytes);
}

// Whether /proc/self/maps still shows the memfd.
bool MapsMemfd() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("tfring-shared-heap") != std::string::npos) return true;
  }
  return false;
}

void ForkChildPrivate() {
  const size_t bytes = 8 * kMiB;
  char* block = static_cast<char*>(malloc(bytes));
  char* other = static_cast<char*>(malloc(kMiB));
  std::memset(block, 0x11, bytes);
  std::memset(other, 0x33, kMiB);
  const TfringSharedHeapInfo parent = Info();
  EXPECT_TRUE(InRange(block, parent) && InRange(other, parent), "not in the heap");
  ExpectForkedPasses(
      [&] {
        ExpectAll(block, bytes, 0x11, "the child's copy");
        EXPECT_TRUE(!MapsMemfd(), "the child still maps the memfd");
        const TfringSharedHeapInfo child = Info();
        EXPECT_TRUE(child.present == 0 && child.fd == -1 && child.pid == getpid(),
                    "in the child, present " << child.present);
        EXPECT_TRUE(fcntl(parent.fd, F_GETFD) == -1, "the child kept the memfd open");
        std::memset(block, 0x22, bytes);
        EXPECT_TRUE(malloc_usable_size(block) == bytes, "usable size in the child");
        // New large blocks are glibc's; old ones can be freed and grown.
        char* fresh = static_cast<char*>(malloc(16 * kMiB));
        EXPECT_TRUE(fresh != nullptr && !InRange(fresh, parent),
                    "a new block in the child is in the heap's range");
        std::memset(fresh, 0x44, 16 * kMiB);
        free(fresh);
        free(other);
        char* grown = static_cast<char*>(realloc(block, 16 * kMiB));
        EXPECT_TRUE(grown != nullptr && !InRange(grown, parent), "realloc in the child");
        ExpectAll(grown, bytes, 0x22, "realloc in the child");
        // A grandchild forks from private memory: nothing to do.
        ExpectForkedPasses([&] { ExpectAll(grown, bytes, 0x22, "the grandchild's copy"); },
                           "grandchild");
        free(grown);
      },
      "child");
  ExpectAll(block, bytes, 0x11, "the parent's block after the child wrote its copy");
  ExpectAll(other, kMiB, 0x33, "the parent's other block after the child freed it");
  EXPECT_TRUE(Info().present == 1 && MapsMemfd(), "the parent lost its heap");
  char* more = static_cast<char*>(malloc(2 * kMiB));
  EXPECT_TRUE(InHeap(more), "the parent's heap stopped serving");
  free(more);
  free(other);
  free(block);
}

// This process's address space in bytes (VmSize).
uint64_t AddressSpaceBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  }
  EXPECT_TRUE(false, "no VmSize in /proc/self/status");
  return 0;
}

// The child's copy when it cannot have a scratch mapping as large as the
// heap's used part (RLIMIT_AS just above what the parent has): it copies
// through its small buffer instead, block by block.
void ForkChildPrivateWithoutScratch() {
  const size_t bytes = 48 * kMiB;
  char* block = static_cast<char*>(malloc(bytes));
  char* after = static_cast<char*>(malloc(kMiB));
  EXPECT_TRUE(InHeap(block) && InHeap(after), "not in the heap");
  Fill(block, bytes, 11);
  Fill(after, kMiB, 12);
  rlimit old_limit;
  EXPECT_TRUE(getrlimit(RLIMIT_AS, &old_limit) == 0, "getrlimit: " << std::strerror(errno));
  // Inherited by the child; the parent takes its old limit back at once.
  const rlimit tight = {AddressSpaceBytes() + 8 * kMiB, old_limit.rlim_max};
  EXPECT_TRUE(setrlimit(RLIMIT_AS, &tight) == 0, "setrlimit: " << std::strerror(errno));
  const pid_t pid = ForkRunning([&] {
    void* scratch = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    EXPECT_TRUE(scratch == MAP_FAILED, "the child could map " << bytes << " bytes after all");
    ExpectPattern(block, bytes, 11, "the child's copy");
    ExpectPattern(after, kMiB, 12, "the child's copy of the next block");
    EXPECT_TRUE(!MapsMemfd(), "the child still maps the memfd");
    std::memset(block, 0x22, bytes);
    std::memset(after, 0x23, kMiB);
    free(after);
  });
  const bool restored = setrlimit(RLIMIT_AS, &old_limit) == 0;
  const int status = WaitWithDeadline(pid, std::chrono::seconds(60));
  EXPECT_TRUE(restored, "setrlimit: " << std::strerror(errno));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "forked child ended with status " << status);
  ExpectPattern(block, bytes, 11, "the parent's block after the child wrote its copy");
  ExpectPattern(after, kMiB, 12, "the parent's next block after the child freed it");
  free(after);
  free(block);
}

// Forks while other threads allocate and free: the fork handlers keep the
// tables whole and nothing deadlocks.
void ForkWhileAllocating() {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 random(t + 100);
      std::vector<void*> held;
      while (!stop.load()) {
        held.push_back(malloc(kSmallest + random() % (4 * kMiB)));
        if (held.size() > 8) {
          free(held.front());
          held.erase(held.begin());
        }
      }
      for (void* block : held) free(block);
    });
  }
  char* kept = static_cast<char*>(malloc(kMiB));
  std::memset(kept, 0x5C, kMiB);
  for (int round = 0; round < 20; ++round) {
    ExpectForkedPasses(
        [&] {
          ExpectAll(kept, kMiB, 0x5C, "a kept block in the child");
          for (int i = 0; i < 10; ++i) {
            void* block = malloc(kMiB * (i + 1));
            std::memset(block, i, kMiB * (i + 1));
            free(block);
          }
          free(kept);
        },
        "round " + std::to_string(round));
  }
  stop.store(true);
  for (std::thread& thread : threads) thread.join();
  ExpectAll(kept, kMiB, 0x5C, "the kept block in the parent");
  free(kept);
}

void BadFreeAborts() {
  for (const char* how : {"interior", "double"}) {
    const int status = RunChild({"bad_free", how});
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
                "a " << how << " free ended with status " << status << ", not SIGABRT");
  }
}

void BadFreeChild(const std::string& how) {
  const rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  char* block = static_cast<char*>(malloc(kMiB));
  EXPECT_TRUE(InHeap(block), "not in the heap");
  std::fprintf(stderr, "(an abort with 'invalid pointer' is expected next)\n");
  // Through Opaque, so the compiler does not see (and refuse) the bug.
  if (how == "interior") {
    free(Opaque(block + kPage));
  } else {
    void* same = Opaque(block);
    free(block);
    free(same);
  }
  EXPECT_TRUE(false, "the bad free returned");
}

void ClosedFd() { ExpectChildPasses({"closed_fd"}); }

// The program closes the memfd: the heap still serves (and gives pages back,
// by address), but reports none, as peers could not open it.
void ClosedFdChild() {
  char* before = static_cast<char*>(malloc(kMiB));
  const TfringSharedHeapInfo info = Info();
  EXPECT_TRUE(info.present == 1 && InRange(before, info), "no heap to start with");
  EXPECT_TRUE(close(info.fd) == 0, "close: " << std::strerror(errno));
  // Reuse the number for another file.
  const int other = open("/dev/null", O_RDONLY);
  EXPECT_TRUE(other == info.fd, "the number was not reused (" << other << ")");
  const TfringSharedHeapInfo after = Info();
  EXPECT_TRUE(after.present == 0 && after.fd == -1, "still reported, fd " << after.fd);
  char* large = static_cast<char*>(malloc(96 * kMiB));
  char* guard = static_cast<char*>(malloc(kSmallest));
  EXPECT_TRUE(InRange(large, info) && InRange(guard, info), "the heap stopped serving");
  std::memset(large, 0x77, 96 * kMiB);
  free(large);
  char* zeroed = static_cast<char*>(calloc(1, 96 * kMiB));
  EXPECT_TRUE(zeroed == large, "the released block was not reused");
  ExpectAll(zeroed, 96 * kMiB, 0, "calloc of a block released without the fd");
  free(zeroed);
  free(guard);
  free(before);
  close(other);
}

void PassThrough() { ExpectChildPasses({"pass_through"}, {"TFRING_SHARED_HEAP=0"}); }

void UnmappableHeap() {
  // 2^60 bytes cannot be mapped: the heap is off and glibc serves.
  ExpectChildPasses({"pass_through"}, {"TFRING_SHARED_HEAP_BYTES=1152921504606846976"});
}

void PassThroughChild() {
  const TfringSharedHeapInfo info = Info();
  EXPECT_TRUE(info.present == 0 && info.fd == -1 && info.base == nullptr &&
                  info.capacity == 0 && info.pid == getpid() && info.fallbacks == 0,
              "present " << info.present << ", fd " << info.fd << ", capacity "
                         << info.capacity);
  char* block = static_cast<char*>(malloc(16 * kMiB));
  EXPECT_TRUE(block != nullptr, "malloc");
  Fill(block, 16 * kMiB, 10);
  EXPECT_TRUE(malloc_usable_size(block) >= 16 * kMiB, "usable size");
  block = static_cast<char*>(realloc(block, 32 * kMiB));
  ExpectPattern(block, 16 * kMiB, 10, "realloc");
  free(block);
  char* zeros = static_cast<char*>(calloc(4, kMiB));
  ExpectAll(zeros, 4 * kMiB, 0, "calloc");
  free(zeros);
  void* aligned = nullptr;
  EXPECT_TRUE(posix_memalign(&aligned, kPage, kMiB) == 0 && Aligned(aligned, kPage),
              "posix_memalign");
  free(aligned);
  EXPECT_TRUE(Info().present == 0, "the heap appeared");
}

void PreloadRemoved() {
  const std::string library = LibraryPath();
  const char* preload = std::getenv("LD_PRELOAD");
  EXPECT_TRUE(preload == nullptr || std::strstr(preload, library.c_str()) == nullptr,
              "LD_PRELOAD still names the library: " << preload);
  // Other entries stay, in order, whatever the separators.
  ExpectChildPasses({"preload", "libm.so.6:libdl.so.2"},
                    {"LD_PRELOAD=libm.so.6 " + library + ":libdl.so.2:" + library});
  ExpectChildPasses({"preload", "(unset)"}, {"LD_PRELOAD=" + library + " " + library});
}

void PreloadChild(const std::string& expected) {
  const char* preload = std::getenv("LD_PRELOAD");
  const std::string got = preload == nullptr ? "(unset)" : preload;
  EXPECT_TRUE(got == expected, "LD_PRELOAD is '" << got << "', expected '" << expected << "'");
  EXPECT_TRUE(InfoSymbol() != nullptr, "the library did not load");
}

// --- Benchmark ---

template <typename Allocate, typename Release>
double NanosecondsPerPair(int count, size_t bytes, Allocate allocate, Release release) {
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < count; ++i) {
    char* block = static_cast<char*>(allocate(bytes));
    block[0] = static_cast<char>(i);  // one page touched, so nothing is optimised out
    release(block);
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / count;
}

int Bench(int count, size_t bytes) {
  for (int round = 0; round < 2; ++round) {  // the first round warms both up
    const double heap = NanosecondsPerPair(count, bytes, malloc, free);
    const double glibc = NanosecondsPerPair(count, bytes, __libc_malloc, __libc_free);
    std::printf("malloc+free of %zu KiB, %d times: heap %.0f ns, glibc %.0f ns a pair\n",
                bytes / 1024, count, heap, glibc);
  }
  std::printf("heap present: %d\n", Info().present);
  return 0;
}

const std::vector<std::pair<std::string, std::function<void()>>>& Scenarios() {
  static const auto* scenarios = new std::vector<std::pair<std::string, std::function<void()>>>{
      {"info", InfoScenario},
      {"small_stays_private", SmallStaysPrivate},
      {"alignment", Alignment},
      {"reuse_and_merge", ReuseAndMerge},
      {"calloc_zeroes", CallocZeroes},
      {"release_memory", ReleaseMemory},
      {"realloc", Realloc},
      {"usable_size", UsableSize},
      {"threads", Threads},
      {"full_falls_back", FullFallsBack},
      {"small_capacity", SmallCapacity},
      {"peer_maps_heap", PeerMapsHeap},
      {"fork_child_private", ForkChildPrivate},
      {"fork_child_private_without_scratch", ForkChildPrivateWithoutScratch},
      {"fork_while_allocating", ForkWhileAllocating},
      {"bad_free_aborts", BadFreeAborts},
      {"closed_fd", ClosedFd},
      {"pass_through", PassThrough},
      {"unmappable_heap", UnmappableHeap},
      {"preload_removed", PreloadRemoved},
  };
  return *scenarios;
}

// `child <name> [args]`: what the scenarios above start. Exit 0 when it
// passed, 1 (after printing why) when not.
int Child(const std::vector<std::string>& args) {
  try {
    const std::string& name = args.at(0);
    if (name == "full") {
      FullChild();
    } else if (name == "capacity") {
      CapacityChild(args.at(1));
    } else if (name == "peer") {
      PeerChild(args.at(1), args.at(2), args.at(3), args.at(4));
    } else if (name == "closed_fd") {
      ClosedFdChild();
    } else if (name == "pass_through") {
      PassThroughChild();
    } else if (name == "bad_free") {
      BadFreeChild(args.at(1));
    } else if (name == "preload") {
      PreloadChild(args.at(1));
    } else {
      std::fprintf(stderr, "unknown child '%s'\n", name.c_str());
      return 2;
    }
  } catch (const TestFailure& failure) {
    std::fprintf(stderr, "FAIL child %s: %s\n", args[0].c_str(), failure.message.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tfring

int main(int argc, char** argv) {
  using ::tfring::testing::TestFailure;
  if (argc >= 3 && std::string(argv[1]) == "child") {
    return tfring::Child(std::vector<std::string>(argv + 2, argv + argc));
  }
  if (argc == 4 && std::string(argv[1]) == "bench") {
    try {
      return tfring::Bench(std::atoi(argv[2]), std::stoull(argv[3]) * 1024);
    } catch (const TestFailure& failure) {
      std::printf("bench failed: %s\n", failure.message.c_str());
      return 1;
    }
  }
  if (argc != 2) {
    std::fprintf(stderr,
                 "usage: %s <scenario|all|list> | bench <count> <KiB> | child <name> [args]\n",
                 argv[0]);
    return 2;
  }
  return ::tfring::testing::RunScenarios(tfring::Scenarios(), argv[1], "",
                                         [](auto fn) { fn(); });
}
