#include "cc/transport/hierarchical_transport.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "cc/logging.h"

namespace tfring {

HierarchicalTransport::HierarchicalTransport(Transport* flat, std::unique_ptr<Transport> local,
                                             std::unique_ptr<Transport> cross, int64_t min_bytes,
                                             int64_t trials)
    : flat_(flat),
      local_(std::move(local)),
      cross_(std::move(cross)),
      min_bytes_(min_bytes),
      trial_(trials > 0 ? new PathTrial(trials) : nullptr) {}

bool HierarchicalTransport::MeasuredPath(PathTrial::Path* path) const {
  if (!trial_ || !trial_->decided()) return false;
  *path = trial_->Next();
  return true;
}

Status HierarchicalTransport::Allreduce(const void* input, void* output, int64_t count,
                                        DataType dtype, ReduceOp op) {
  const int64_t element_bytes = DataTypeSize(dtype);
  // Every rank decides from the count alone, so all take the same path.
  if (min_bytes_ < 0 || count * element_bytes < min_bytes_ || count < local_->size()) {
    return flat_->Allreduce(input, output, count, dtype, op);
  }
  if (!trial_) return HierarchicalAllreduce(input, output, count, dtype, op);
  // Every rank counts the same eligible allreduces, so all agree at once
  // and then take the same path.
  if (trial_->NeedsAgreement()) TFRING_RETURN_IF_ERROR(AgreeOnPath());
  const bool flat = trial_->Next() == PathTrial::Path::kFlat;
  const auto started = std::chrono::steady_clock::now();
  TFRING_RETURN_IF_ERROR(flat ? flat_->Allreduce(input, output, count, dtype, op)
                              : HierarchicalAllreduce(input, output, count, dtype, op));
  trial_->Record(count * element_bytes,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return Status::OK();
}

Status HierarchicalTransport::AgreeOnPath() {
  int64_t measured[2];
  trial_->Measured(measured);
  int64_t summed[2];
  TFRING_RETURN_IF_ERROR(flat_->Allreduce(measured, summed, 2, DataType::kInt64, ReduceOp::kSum));
  trial_->Agree(summed);
  if (flat_->rank() == 0) {
    const int64_t ranks = flat_->size();
    TFRING_LOG(kInfo, "uncompressed allreduces between hosts take the "
                          << (trial_->Next() == PathTrial::Path::kFlat ? "flat" : "hierarchical")
                          << " path from now on: measured " << summed[0] / ranks
                          << " ns/MB flat, " << summed[1] / ranks
                          << " ns/MB hierarchical (mean over the ranks; "
                             "TFRING_HIERARCHICAL_ALLREDUCE=measured)");
  }
  return Status::OK();
}

Status HierarchicalTransport::HierarchicalAllreduce(const void* input, void* output,
                                                    int64_t count, DataType dtype, ReduceOp op) {
  return ThreeSteps(input, output, count, dtype, op, [&](void* slice, int64_t elements) {
    return cross_->Allreduce(slice, slice, elements, dtype, op);
  });
}

Status HierarchicalTransport::AllreduceWire(const void* input, void* output, int64_t count,
                                            DataType dtype, ReduceOp op,
                                            WireCompression compression) {
  if (compression == WireCompression::kNone || dtype != DataType::kFloat32 ||
      op != ReduceOp::kSum) {
    return Allreduce(input, output, count, dtype, op);
  }
  // Summed in float32 inside the host; encoded on the wire between hosts.
  return ThreeSteps(input, output, count, dtype, op, [&](void* slice, int64_t elements) {
    return cross_sum_.Run(cross_.get(), static_cast<float*>(slice), elements, compression);
  });
}

std::vector<int64_t> HierarchicalTransport::SliceCounts(int64_t count, int64_t element_bytes,
                                                        int local_size) {
  // Whole 64-byte lines per slice, so the slices' copies and transfers
  // start aligned wherever the buffer is.
  const int64_t line = std::max<int64_t>(1, 64 / element_bytes);
  const int64_t lines = (count + line - 1) / line;
  auto start = [&](int j) { return std::min(count, lines * j / local_size * line); };
  std::vector<int64_t> counts(local_size);
  for (int j = 0; j < local_size; ++j) counts[j] = start(j + 1) - start(j);
  return counts;
}

Status HierarchicalTransport::ThreeSteps(
    const void* input, void* output, int64_t count, DataType dtype, ReduceOp op,
    const std::function<Status(void* slice, int64_t elements)>& cross_step) {
  const int64_t element_bytes = DataTypeSize(dtype);
  const std::vector<int64_t> counts = SliceCounts(count, element_bytes, local_->size());
  // (1) Local rank j reduces slice j inside the host; the rest of `output`
  // is left to (3).
  TFRING_RETURN_IF_ERROR(local_->ReduceScatterAtOffsets(input, output, counts, dtype, op));
  // (2) Slice j across the hosts, among the local ranks j.
  const int me = local_->rank();
  int64_t first = 0;
  for (int j = 0; j < me; ++j) first += counts[j];
  TFRING_RETURN_IF_ERROR(
      cross_step(static_cast<char*>(output) + first * element_bytes, counts[me]));
  // (3) The host's ranks gather the slices.
  std::vector<int64_t> slice_bytes(counts.size());
  for (size_t j = 0; j < counts.size(); ++j) slice_bytes[j] = counts[j] * element_bytes;
  return local_->Allgatherv(nullptr, slice_bytes[me], output, slice_bytes);
}

}  // namespace tfring
