#include "cc/execution/fusion_planner.h"

#include <map>
#include <tuple>

namespace tfring {
namespace {

// Candidates with the same key may share a batch: one collective call with
// one dtype, one op and one wire compression (allgathers move bytes, so any
// dtypes mix).
using BatchKey = std::tuple<CollectiveType, DataType, ReduceOp, WireCompression>;

bool IsFusibleType(CollectiveType type) {
  return type == CollectiveType::kAllreduce || type == CollectiveType::kAllgather ||
         type == CollectiveType::kReducescatter;
}

BatchKey KeyOf(const Request& request) {
  if (request.type == CollectiveType::kAllgather) {
    return {request.type, DataType::kUInt8, ReduceOp::kSum, WireCompression::kNone};
  }
  // Average is a Sum followed by a division per tensor.
  const ReduceOp op = request.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : request.reduce_op;
  return {request.type, request.dtype, op, request.compression};
}

}  // namespace

bool FitsFusionBuffer(int64_t bytes, int64_t fusion_threshold, int64_t direct_threshold) {
  return fusion_threshold > 0 && bytes < direct_threshold &&
         FusionFootprint(bytes) <= fusion_threshold;
}

std::vector<Batch> PlanBatches(const std::vector<FusionCandidate>& candidates,
                               int64_t fusion_threshold, int64_t direct_threshold,
                               bool allreduce_spans) {
  std::vector<Batch> batches;
  // The open batch per key, as an index into `batches`, and its footprint.
  std::map<BatchKey, size_t> open_batch;
  std::map<size_t, int64_t> open_bytes;

  for (const FusionCandidate& candidate : candidates) {
    const Request& request = *candidate.request;
    const int64_t bytes = FusionFootprint(candidate.bytes);
    // A spans batch has no buffer to fill: any size joins, without bound.
    const bool spans = allreduce_spans && request.type == CollectiveType::kAllreduce;
    const bool fusible = spans || (IsFusibleType(request.type) &&
                                   FitsFusionBuffer(candidate.bytes, fusion_threshold,
                                                    direct_threshold));
    if (!fusible) {
      batches.push_back(Batch{{candidate.index}, false});
      continue;
    }
    const BatchKey key = KeyOf(request);
    auto it = open_batch.find(key);
    if (it != open_batch.end() &&
        (spans || open_bytes[it->second] + bytes <= fusion_threshold)) {
      batches[it->second].members.push_back(candidate.index);
      open_bytes[it->second] += bytes;
      continue;
    }
    open_batch[key] = batches.size();
    open_bytes[batches.size()] = bytes;
    batches.push_back(Batch{{candidate.index}, !spans, spans});
  }
  return batches;
}

}  // namespace tfring
