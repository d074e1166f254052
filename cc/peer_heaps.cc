#include "cc/peer_heaps.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "cc/shared_heap_info.h"

namespace tfring {
namespace {

using HeapInfoFunction = void (*)(TfringSharedHeapInfo*);

// What /proc/<pid>/fd/<fd> of a heap points at ("/memfd:<name> (deleted)").
constexpr char kHeapFileName[] = "/memfd:tfring-shared-heap";

// A peer's heap mapped here: by pid, for the life of the process.
struct Mapping {
  char* data = nullptr;
  uint64_t capacity = 0;
};

std::mutex& MappingsMutex() {
  static std::mutex* mutex = new std::mutex();
  return *mutex;
}

std::map<int64_t, Mapping>& Mappings() {
  static auto* mappings = new std::map<int64_t, Mapping>();
  return *mappings;
}

// Maps process `pid`'s heap (its fd `fd`, `capacity` bytes), or says why not.
Status MapPeerHeap(int64_t pid, int fd, uint64_t capacity, Mapping* mapping) {
  std::lock_guard<std::mutex> lock(MappingsMutex());
  auto found = Mappings().find(pid);
  if (found != Mappings().end() && found->second.capacity >= capacity) {
    *mapping = found->second;
    return Status::OK();
  }
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // The fd must still be the peer's heap: a memfd of that name and size.
  char target[256] = {0};
  const ssize_t length = readlink(path.c_str(), target, sizeof(target) - 1);
  if (length < 0 || std::strncmp(target, kHeapFileName, std::strlen(kHeapFileName)) != 0) {
    return Status::FailedPrecondition(path + " is not a tfring shared heap (" +
                                      (length < 0 ? std::string(std::strerror(errno))
                                                  : std::string(target)) +
                                      "); the ranks must run as the same user");
  }
  const int opened = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (opened < 0) {
    return Status::FailedPrecondition("cannot open " + path + " (" + std::strerror(errno) +
                                      "): the ranks must run as the same user");
  }
  struct stat file;
  if (fstat(opened, &file) != 0 || static_cast<uint64_t>(file.st_size) != capacity) {
    close(opened);
    return Status::FailedPrecondition(path + " does not hold the " + std::to_string(capacity) +
                                      " bytes its owner reported");
  }
  void* data = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                    opened, 0);
  const int map_errno = errno;
  close(opened);  // the mapping keeps the memory
  if (data == MAP_FAILED) {
    return Status::FailedPrecondition("cannot map " + std::to_string(capacity) + " bytes of " +
                                      path + " (" + std::strerror(map_errno) + ")");
  }
  mapping->data = static_cast<char*>(data);
  mapping->capacity = capacity;
  Mappings()[pid] = *mapping;
  return Status::OK();
}

}  // namespace

OwnSharedHeap FindOwnSharedHeap() {
  OwnSharedHeap own;
  auto info_function =
      reinterpret_cast<HeapInfoFunction>(dlsym(RTLD_DEFAULT, kSharedHeapInfoSymbol));
  if (info_function == nullptr) return own;
  TfringSharedHeapInfo info{};
  info_function(&info);
  if (info.present != 1 || info.base == nullptr || info.capacity == 0) return own;
  own.present = true;
  own.fd = info.fd;
  own.pid = info.pid;
  own.base = static_cast<char*>(info.base);
  own.capacity = info.capacity;
  return own;
}

Status ConnectPeerHeaps(Transport* transport, std::vector<HeapView>* heaps,
                        std::string* why_not) {
  heaps->clear();
  const OwnSharedHeap own = FindOwnSharedHeap();
  std::vector<int64_t> all;
  TFRING_RETURN_IF_ERROR(transport->AllgatherInt64s(
      {own.present ? 1 : 0, own.pid, own.fd, static_cast<int64_t>(own.capacity)}, &all));
  const int size = transport->size();
  std::vector<HeapView> mapped(size);
  std::string problem;
  for (int q = 0; q < size && problem.empty(); ++q) {
    const int64_t* entry = all.data() + 4 * q;
    if (entry[0] != 1) {
      problem = "rank " + std::to_string(q) + " of the host has no shared heap "
                "(libtfring_shared_heap.so not preloaded, or TFRING_SHARED_HEAP=0)";
    } else if (q == transport->rank()) {
      mapped[q] = HeapView{own.base, own.capacity};
    } else {
      Mapping mapping;
      const Status status =
          MapPeerHeap(entry[1], static_cast<int>(entry[2]), static_cast<uint64_t>(entry[3]),
                      &mapping);
      if (status.ok()) {
        mapped[q] = HeapView{mapping.data, static_cast<uint64_t>(entry[3])};
      } else {
        problem = "rank " + std::to_string(q) + "'s heap: " + status.message();
      }
    }
  }
  std::vector<uint64_t> everyone_mapped{problem.empty() ? ~0ull : 0ull};
  TFRING_RETURN_IF_ERROR(transport->BitwiseAndAllreduce(&everyone_mapped));
  if (everyone_mapped[0] == 0) {
    *why_not = problem.empty() ? "another rank could not map every heap" : problem;
    return Status::OK();
  }
  *heaps = std::move(mapped);
  return Status::OK();
}

}  // namespace tfring
