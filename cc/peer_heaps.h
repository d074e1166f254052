// PeerHeaps: the shared heaps of every rank on this host, mapped into this
// process, so the shared-memory allreduce can read each rank's input and
// write each rank's output where they are (shm_collectives.h, "Direct").
//
// Why: tfringrun preloads libtfring_shared_heap.so into the ranks of a
// one-host job (tfring/shared_heap.cc), which serves large allocations, and
// so TensorFlow's tensors, from one memfd per process. A rank that maps its
// peers' memfds (through /proc/<pid>/fd/<fd>, as the same user) sees their
// tensors at a fixed offset from where it mapped them. The heap library
// says where its heap is through a C function the core looks up at run time
// (shared_heap_info.h); without the library nothing changes.
//
// Set-up is collective over the ranks of one host: every rank publishes its
// heap (pid, fd, capacity), maps the others' (a process maps each peer
// once, whatever number of process sets share it, and keeps the mappings
// until it exits), and the ranks agree: either every rank maps every heap,
// or no rank uses any.
#ifndef TFRING_CC_PEER_HEAPS_H_
#define TFRING_CC_PEER_HEAPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/shm_collectives.h"
#include "cc/status.h"
#include "cc/transport.h"

namespace tfring {

// This process's heap as the preloaded library reports it; present false
// when the library is absent or serves no heap.
struct OwnSharedHeap {
  bool present = false;
  int fd = -1;
  int64_t pid = 0;
  char* base = nullptr;
  uint64_t capacity = 0;
};
OwnSharedHeap FindOwnSharedHeap();

// Collective over `transport`'s ranks, which share one host. On success
// *heaps holds every rank's heap as mapped here (rank order; this rank's is
// its own mapping), or is empty when some rank has no heap or could not map
// a peer's; then *why_not says why. Fails only when the transport fails.
Status ConnectPeerHeaps(Transport* transport, std::vector<HeapView>* heaps,
                        std::string* why_not);

}  // namespace tfring

#endif  // TFRING_CC_PEER_HEAPS_H_
