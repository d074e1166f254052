// FusionPlanner: groups a round's collectives into batches that run as one
// collective each.
//
// Why: a training step submits hundreds of gradients; one MPI call per small
// tensor is dominated by latency. Small allreduces of the same dtype and op
// are packed into the fusion buffer (up to TFRING_FUSION_THRESHOLD bytes) and
// reduced once; so are reducescatters, and allgathers of any dtypes (they
// move bytes). Large tensors (>= TFRING_DIRECT_THRESHOLD) skip the buffer
// and go straight from input to output, saving two copies. Alltoall and
// broadcast always run alone. Planning is a pure function of the ordered
// candidates and their sizes, both identical on all ranks, so every rank
// forms the same batches.
#ifndef TFRING_CC_EXECUTION_FUSION_PLANNER_H_
#define TFRING_CC_EXECUTION_FUSION_PLANNER_H_

#include <cstdint>
#include <vector>

#include "cc/negotiation/response.h"

namespace tfring {

// Every member of a fused batch starts at a multiple of this many bytes of
// the fusion buffer (vectorised copies and reductions stay aligned).
constexpr int64_t kFusionAlignment = 64;

// `bytes` rounded up to kFusionAlignment: a member's footprint in the buffer.
inline int64_t FusionFootprint(int64_t bytes) {
  return (bytes + kFusionAlignment - 1) / kFusionAlignment * kFusionAlignment;
}

struct Batch {
  // The candidates' `index` values, in execution order.
  std::vector<size_t> members;
  // True when the members share the fusion buffer.
  bool fused = false;
  // True when the members (allreduces) are reduced in one collective from
  // their own buffers (Transport::AllreduceSpans); `fused` is then false.
  bool spans = false;
};

struct FusionCandidate {
  size_t index = 0;  // the caller's index, copied into Batch::members
  const Request* request = nullptr;
  // The tensor's footprint in a fused batch, identical on every rank: the
  // input for allreduce and reducescatter, the gathered output for allgather.
  int64_t bytes = 0;
};

// Whether a fusible tensor of `bytes` (as in FusionCandidate) goes into a
// fused batch rather than running directly on its own buffers.
bool FitsFusionBuffer(int64_t bytes, int64_t fusion_threshold, int64_t direct_threshold);

// A fused batch's footprint (the sum of its members' FusionFootprint) never
// exceeds `fusion_threshold`, so a buffer of that size holds any batch. With
// `allreduce_spans` (a transport that reduces tensors from their own
// buffers), every allreduce of one dtype and op joins one spans batch
// instead, whatever its size: no buffer bounds it.
std::vector<Batch> PlanBatches(const std::vector<FusionCandidate>& candidates,
                               int64_t fusion_threshold, int64_t direct_threshold,
                               bool allreduce_spans = false);

}  // namespace tfring

#endif  // TFRING_CC_EXECUTION_FUSION_PLANNER_H_
