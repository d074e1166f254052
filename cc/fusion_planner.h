// FusionPlanner: groups a round's allreduce responses into batches that run
// as one collective each.
//
// Why: a training step submits hundreds of gradients; one MPI call per small
// tensor is dominated by latency. Small allreduces of the same dtype and op
// are packed into the fusion buffer (up to TFRING_FUSION_THRESHOLD bytes);
// large ones (>= TFRING_DIRECT_THRESHOLD) skip the buffer and reduce straight
// from input to output, saving two copies. Planning is a pure function of the
// ordered response list and the tensor sizes, both identical on all ranks, so
// every rank forms the same batches.
#ifndef TFRING_CC_FUSION_PLANNER_H_
#define TFRING_CC_FUSION_PLANNER_H_

#include <cstdint>
#include <vector>

#include "cc/response.h"

namespace tfring {

// Every member of a fused batch starts at a multiple of this many bytes of
// the fusion buffer (vectorised copies and reductions stay aligned).
constexpr int64_t kFusionAlignment = 64;

// `bytes` rounded up to kFusionAlignment: a member's footprint in the buffer.
inline int64_t FusionFootprint(int64_t bytes) {
  return (bytes + kFusionAlignment - 1) / kFusionAlignment * kFusionAlignment;
}

struct Batch {
  // Indices into the response list, in execution order.
  std::vector<size_t> members;
  // True when the members share the fusion buffer.
  bool fused = false;
};

// `byte_sizes[i]` is the size of response i's tensor on this rank. A fused
// batch's footprint (the sum of its members' FusionFootprint) never exceeds
// `fusion_threshold`, so a buffer of that size holds any batch.
std::vector<Batch> PlanBatches(const ResponseList& responses,
                               const std::vector<int64_t>& byte_sizes,
                               int64_t fusion_threshold, int64_t direct_threshold);

}  // namespace tfring

#endif  // TFRING_CC_FUSION_PLANNER_H_
