// ShmCollectives: allreduce, reduce-scatter, broadcast, allgather and
// small-message exchange among the ranks of one host, through one
// shared-memory segment.
//
// Why: on one host MPI moves every byte through its own shared-memory
// queues, about three copies of the data for an allreduce plus a temporary
// per call, and tens of microseconds per small collective. Here every rank
// owns a slot of the segment that the others read directly, and the ranks
// meet at a shared-memory barrier (shm_barrier.h) that costs well under a
// microsecond when they are in step.
//
// Segment layout: the barrier; two sets of per-rank exchange areas (small
// messages of the negotiation, used by alternate calls); one slot per rank.
//
// Allreduce. Slice r of the data (cache-line aligned) is reduced by rank r
// alone, folding the ranks' values in rank order, so every rank receives
// identical bits. The data moves from the tensors' own buffers in chunks
// (of at most 512 KiB, which stay in cache) through the first two chunks of
// the slots, used alternately. Rank r copies the slices the other ranks
// reduce into its slot, reduces its own slice from its own input and the
// others' slots into its output and their slots, and copies the others'
// results out of its own slot. One barrier per chunk: the reduction of chunk
// c and the copy-out of chunk c-1 share a phase. Several tensors run as one
// pipeline over their concatenation (AllreduceSpans: a chunk may end inside
// one tensor and go on in the next), so a round of hundreds of gradients
// costs what one tensor of their total size costs, with no packing copies;
// the reducing rank scales its slice (Average, postscale) before writing it
// out, so that costs no pass of its own. Only two chunks of each slot are
// ever used: slots bigger than 1 MiB gain nothing.
//
// Reduce-scatter (for the hierarchical allreduce, which sends each rank's
// slice across hosts and then gathers the slices, so the others' reduced
// slices would be copied out for nothing). Rank r reduces its own slice,
// given by the caller, into its own output alone. Each round, every rank
// copies the next piece of each other rank's slice from its input into its
// slot (the chunk area split into one piece per other rank); after the
// barrier each reduces its own piece from its input and the others' slots,
// folding in rank order as Allreduce does (so the bits equal Allreduce's).
// No copy-out, and one result written where Allreduce writes one per rank:
// at 2 ranks about 60% of an Allreduce's memory traffic. A last barrier
// keeps the slots unwritten until every rank has read them.
//
// A rank reads another rank's slot only between two barriers that the owner
// also passes, and reads its own slot after the barrier that follows the
// others' writes, which is what makes one barrier per phase enough.
//
// Not thread-safe: one instance per rank, used by one thread, every rank
// making the same sequence of calls with matching arguments.
#ifndef TFRING_CC_SHM_SHM_COLLECTIVES_H_
#define TFRING_CC_SHM_SHM_COLLECTIVES_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cc/common.h"
#include "cc/shm/shm_barrier.h"
#include "cc/status.h"

namespace tfring {

class ShmCollectives {
 public:
  // Bytes of one rank's exchange area, length word included.
  static constexpr size_t kExchangeAreaBytes = 8 * 1024;
  // The largest message Exchange carries.
  static constexpr size_t kExchangeCapacity = kExchangeAreaBytes - 64;

  // Bytes of a segment for `size` ranks with slots of `slot_bytes` (a
  // positive multiple of 128); 0 when that many bytes do not fit a size_t
  // (or size < 1).
  static size_t SegmentBytes(int size, size_t slot_bytes);

  // Uses the `segment_bytes` bytes at `segment` (zero-filled when created,
  // 64-byte aligned, shared by all `size` ranks) as rank `rank`; they must
  // hold SegmentBytes(size, slot_bytes) and outlive the instance.
  // `job_ranks[r]` names rank r in messages. A rank that does not arrive at
  // a data operation's barrier within `timeout` (while alive) fails it.
  static Status Attach(void* segment, size_t segment_bytes, int rank, int size,
                       size_t slot_bytes, std::vector<int> job_ranks,
                       std::chrono::nanoseconds timeout,
                       std::unique_ptr<ShmCollectives>* collectives);

  int rank() const { return rank_; }
  int size() const { return size_; }

  // output = op over every rank's input, element-wise. `input` may equal
  // `output`. op: kSum, kMin, kMax or kProduct.
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype, ReduceOp op);
  // Every span reduced as Allreduce does, in one pipeline over all of them,
  // each result scaled by its span's factor / divisor (common.h).
  Status AllreduceSpans(const std::vector<ReduceSpan>& spans, DataType dtype, ReduceOp op);
  // Rank r's counts[r] elements of the reduction (op over every rank's
  // input, element-wise), those after counts[0..r-1], land at the same place
  // in its `output` (which spans sum(counts) elements); nothing else of
  // `output` is written. `input` equals `output` or does not overlap it. The
  // same bits as Allreduce gives for those elements. op as for Allreduce.
  Status ReduceScatter(const void* input, void* output, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op);
  // Rank `root`'s `bytes` bytes at `buffer` replace every other rank's.
  Status Broadcast(void* buffer, int64_t bytes, int root);
  // Concatenates each rank's bytes in rank order into `output`; a null
  // `input` means this rank's part is already in place in `output`.
  Status Allgatherv(const void* input, void* output, const std::vector<int64_t>& bytes_per_rank);

  // Every rank publishes `bytes` bytes. If every rank's fit in
  // kExchangeCapacity, *fits is true and (*views)[r] is rank r's message
  // (valid until this rank's next Exchange returns; a view may be passed as
  // that call's data); otherwise *fits is false on
  // every rank and nothing was exchanged. A negotiation step: waits as long
  // as the peers are alive. A length word in the segment that is neither a
  // message's length nor the mark of one too big (a torn or stale write)
  // fails the call with Aborted naming the rank: no view ever reaches
  // outside the peer's exchange area.
  Status Exchange(const void* data, size_t bytes,
                  std::vector<std::pair<const char*, size_t>>* views, bool* fits);

  // Round calls among the ranks (shm_barrier.h); an Exchange that waits
  // for its peers calls them. Thread-safe.
  uint32_t RoundCalls() const { return barrier_.RoundCalls(); }
  void WaitForRoundCall(uint32_t seen, std::chrono::nanoseconds limit) const {
    barrier_.WaitForRoundCall(seen, limit);
  }
  void CallRound() const { barrier_.CallRound(); }

  // Barriers passed so far.
  uint64_t steps() const { return barrier_.steps(); }

 private:
  ShmCollectives(char* segment, int rank, int size, size_t slot_bytes,
                 std::vector<int> job_ranks, std::chrono::nanoseconds timeout);

  char* Slot(int rank) const;
  // Bytes per chunk of a chunked operation (a half slot at most).
  int64_t ChunkBytes() const;
  char* ExchangeArea(uint64_t call, int rank) const;
  Status DataBarrier(const char* what) { return barrier_.Wait(what, timeout_); }
  // The first element of slice `r` of `count` elements (cache-line aligned).
  int64_t SliceStart(int r, int64_t count, int64_t element_bytes) const;
  Status ChunkedAllreduce(const std::vector<ReduceSpan>& spans, DataType dtype, ReduceOp op);
  // ReduceScatter's rounds, `piece` elements of each rank's slice a round;
  // `starts[q]`: the first element of rank q's slice.
  Status PiecewiseReduceScatter(const char* input, char* output,
                                const std::vector<int64_t>& counts,
                                const std::vector<int64_t>& starts, int64_t piece,
                                DataType dtype, ReduceOp op);
  // Reduces `count` elements of the ranks' data, rank q's at sources[q],
  // scales the result by factor / divisor, and writes it to every pointer in
  // `results`; to results[i] with streaming stores where bit i of `streamed`
  // is set.
  void ReduceSlice(const std::vector<const char*>& sources, const std::vector<char*>& results,
                   int64_t count, DataType dtype, ReduceOp op, double factor, int64_t divisor,
                   uint64_t streamed);

  char* const segment_;
  const int rank_;
  const int size_;
  const size_t slot_bytes_;
  const std::chrono::nanoseconds timeout_;
  ShmBarrier barrier_;
  uint64_t exchanges_ = 0;
  std::vector<char> block_;  // this rank's reduction scratch
};

}  // namespace tfring

#endif  // TFRING_CC_SHM_SHM_COLLECTIVES_H_
