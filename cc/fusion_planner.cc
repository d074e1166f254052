#include "cc/fusion_planner.h"

#include <map>
#include <utility>

namespace tfring {
namespace {

ReduceOp EffectiveOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

}  // namespace

std::vector<Batch> PlanBatches(const ResponseList& responses,
                               const std::vector<int64_t>& byte_sizes,
                               int64_t fusion_threshold, int64_t direct_threshold) {
  std::vector<Batch> batches;
  // Open fused batch per (dtype, op), as an index into `batches`.
  std::map<std::pair<DataType, ReduceOp>, size_t> open_batch;
  std::map<size_t, int64_t> open_bytes;

  for (size_t i = 0; i < responses.size(); ++i) {
    const Response& response = responses[i];
    const Request& request = response.request;
    const int64_t bytes = FusionFootprint(byte_sizes[i]);
    const bool fusible = !response.is_error && request.type == CollectiveType::kAllreduce &&
                         fusion_threshold > 0 && byte_sizes[i] < direct_threshold &&
                         bytes <= fusion_threshold;
    if (!fusible) {
      batches.push_back(Batch{{i}, false});
      continue;
    }
    const auto key = std::make_pair(request.dtype, EffectiveOp(request.reduce_op));
    auto it = open_batch.find(key);
    if (it != open_batch.end() && open_bytes[it->second] + bytes <= fusion_threshold) {
      batches[it->second].members.push_back(i);
      open_bytes[it->second] += bytes;
      continue;
    }
    open_batch[key] = batches.size();
    open_bytes[batches.size()] = bytes;
    batches.push_back(Batch{{i}, true});
  }
  return batches;
}

}  // namespace tfring
