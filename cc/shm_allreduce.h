// ShmAllreduce: allreduce among the ranks of one host through a shared-memory
// segment, without MPI on the data path.
//
// Why: on one host MPI's allreduce costs about three memcpys of the data
// plus a fresh temporary per call; staging through one shared segment costs
// about 2.5 memcpys (each rank copies in, reduces 1/size of it, copies out)
// and allocates nothing per call. The transport that picks it per op (and
// keeps MPI for the negotiation and the cross-host part) is not written yet.
//
// Algorithm, per chunk of at most chunk_bytes: every rank copies its part of
// the input into its own slot; barrier; rank r reduces slice r of the chunk
// across all slots, in rank order 0, 1, ..., size-1, into slot 0's slice r;
// barrier; every rank copies the whole reduced chunk out of slot 0. Each
// slice is computed by one rank only, so every rank receives identical bits.
// Slots come in two sets used by alternate chunks, so two barriers per chunk
// suffice: a rank overwrites a set only after every rank has left the chunk
// that used it last.
//
// Barriers are per-rank 64-bit step counters, one cache line each, that only
// ever grow (release on publish, acquire on read). A waiting rank spins
// briefly, then yields, then sleeps, and gives up with Aborted, naming the
// ranks that did not arrive, when they make no progress for `timeout`. After
// that the instance refuses further calls: the ranks' steps no longer match.
//
// float16/bfloat16 are reduced pairwise with ReduceInto (widened to float
// per operation and rounded back after each), as the other transports do.
//
// Not thread-safe: one instance per rank per segment, used by one thread,
// every rank making the same sequence of calls with the same count, dtype
// and op.
#ifndef TFRING_CC_SHM_ALLREDUCE_H_
#define TFRING_CC_SHM_ALLREDUCE_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "cc/common.h"
#include "cc/status.h"

namespace tfring {

class ShmAllreduce {
 public:
  // Bytes of the control area and of a segment for `size` ranks with
  // `chunk_bytes` per slot (a positive multiple of 64).
  static size_t ControlBytes(int size);
  static size_t SegmentBytes(int size, size_t chunk_bytes);

  // Uses the `segment_bytes` bytes at `segment` (zero-filled when created,
  // 64-byte aligned, shared by all `size` ranks; this is rank `rank`), which
  // must hold SegmentBytes(size, chunk_bytes). The memory must outlive the
  // instance.
  static Status Attach(void* segment, size_t segment_bytes, int rank, int size,
                       size_t chunk_bytes, std::chrono::nanoseconds timeout,
                       std::unique_ptr<ShmAllreduce>* allreduce);

  // output = op over every rank's input, element-wise. `input` may equal
  // `output`. op: kSum, kMin, kMax or kProduct.
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype, ReduceOp op);

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t chunk_bytes() const { return chunk_bytes_; }
  // Barrier steps this rank has completed (two per chunk).
  uint64_t steps() const { return steps_; }

 private:
  ShmAllreduce(char* segment, int rank, int size, size_t chunk_bytes,
               std::chrono::nanoseconds timeout);

  std::atomic<uint64_t>& StepFlag(int rank) const;
  char* Slot(uint64_t chunk, int rank) const;
  // Publishes this rank's next step and waits until every rank reached it.
  Status Barrier();
  Status ReduceChunk(const void* input, void* output, int64_t count, DataType dtype,
                     ReduceOp op);

  char* const segment_;
  const int rank_;
  const int size_;
  const size_t chunk_bytes_;
  const std::chrono::nanoseconds timeout_;
  uint64_t steps_ = 0;
  uint64_t chunks_ = 0;
  Status broken_;
};

}  // namespace tfring

#endif  // TFRING_CC_SHM_ALLREDUCE_H_
