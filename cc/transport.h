// Transport: the communication primitives the core needs, and nothing else.
//
// Why an interface: the negotiation and execution logic is tested in one
// process with ranks as threads (LoopbackTransport) and runs for real over
// MPI (MpiTransport). Later backends (NCCL for data, other launchers) slot in
// here. Every call is collective over all ranks and blocks the calling (the
// background) thread until this rank's part is done.
#ifndef TFRING_CC_TRANSPORT_H_
#define TFRING_CC_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cc/common.h"
#include "cc/status.h"

namespace tfring {

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // --- Negotiation (small messages, every round) ---
  // Element-wise bitwise AND of `words` over all ranks, in place.
  virtual Status BitwiseAndAllreduce(std::vector<uint64_t>* words) = 0;
  // Rank 0 receives every rank's bytes (indexed by rank) in `gathered`;
  // other ranks leave it untouched.
  virtual Status GatherToRoot(const std::string& local, std::vector<std::string>* gathered) = 0;
  // Rank 0's `bytes` replace every other rank's.
  virtual Status BroadcastFromRoot(std::string* bytes) = 0;

  // --- Data ---
  // output = reduction of every rank's input. `input` may equal `output`.
  // `op` is kSum, kMin, kMax or kProduct (Average is a scaled Sum).
  virtual Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                           ReduceOp op) = 0;
  // Allreduce whose traffic between hosts may be encoded as `compression`
  // (wire_codec.h); only called with kNone or for float32 kSum. Transports
  // whose ranks share one host reduce exactly: they ignore it (the default).
  virtual Status AllreduceWire(const void* input, void* output, int64_t count, DataType dtype,
                               ReduceOp op, WireCompression compression) {
    (void)compression;
    return Allreduce(input, output, count, dtype, op);
  }
  // Whether AllreduceSpans is this transport's way to reduce several tensors
  // of one dtype: true where it reduces from the tensors' own buffers as
  // cheaply as from one packed buffer (shared memory), so packing would only
  // add copies.
  virtual bool ReducesSpans() const { return false; }
  // Reduces every span (the same spans, in the same order, on every rank)
  // in one collective, as if they were concatenated, and scales each result
  // by its span's factor / divisor. Only called where ReducesSpans().
  virtual Status AllreduceSpans(const std::vector<ReduceSpan>& spans, DataType dtype,
                                ReduceOp op) {
    (void)spans;
    (void)dtype;
    (void)op;
    return Status::Internal("this transport reduces one buffer at a time (ReducesSpans() is false)");
  }
  // Idle rounds. Ranks must all take part in every negotiation round, so a
  // rank with nothing to do runs a round every cycle to answer the others.
  // A transport that can tell when a peer waits for this rank in a round
  // starts calling `on_call` (from a thread of its own, any number of
  // times, until StopWatchingRoundCalls returns) and returns true; the
  // caller then runs idle rounds only when called. False: no such signal.
  virtual bool WatchRoundCalls(std::function<void()> on_call) {
    (void)on_call;
    return false;
  }
  virtual void StopWatchingRoundCalls() {}
  // Every rank learns every rank's `local` words (as many on every rank),
  // concatenated in rank order into `all`.
  virtual Status AllgatherInt64s(const std::vector<int64_t>& local, std::vector<int64_t>* all) = 0;
  // Concatenates each rank's bytes, in rank order, into `output`. A null
  // `input` means in place: this rank's bytes are already at its position
  // in `output`.
  virtual Status Allgatherv(const void* input, int64_t input_bytes, void* output,
                            const std::vector<int64_t>& bytes_per_rank) = 0;
  virtual Status Broadcast(void* buffer, int64_t bytes, int root_rank) = 0;
  // Rank r sends send_bytes[j] bytes (consecutive in `input`, in rank order)
  // to each rank j and receives recv_bytes[j] bytes from each rank j
  // (consecutive in `output`, in rank order).
  virtual Status Alltoallv(const void* input, const std::vector<int64_t>& send_bytes,
                           void* output, const std::vector<int64_t>& recv_bytes) = 0;
  // Reduces the ranks' inputs of sum(counts) elements element-wise; rank r
  // receives the counts[r] elements that follow counts[0..r-1]. `input` may
  // equal `output` (in place: `output` holds the whole input and the result
  // goes to its start). `op` as for Allreduce.
  virtual Status ReduceScatter(const void* input, void* output,
                               const std::vector<int64_t>& counts, DataType dtype,
                               ReduceOp op) = 0;
  // The same reduction, but rank r's counts[r] elements stay at their place
  // in `output` (which spans sum(counts) elements, like `input`); what the
  // rest of `output` then holds is unspecified. `input` equals `output` or
  // does not overlap it. The hierarchical allreduce's first step: only the
  // slice each rank sends across hosts needs reducing. By default an
  // Allreduce of the whole (correct, and no cheaper); shared memory reduces
  // only the slices.
  virtual Status ReduceScatterAtOffsets(const void* input, void* output,
                                        const std::vector<int64_t>& counts, DataType dtype,
                                        ReduceOp op) {
    int64_t total = 0;
    for (int64_t count : counts) total += count;
    return Allreduce(input, output, total, dtype, op);
  }
};

}  // namespace tfring

#endif  // TFRING_CC_TRANSPORT_H_
