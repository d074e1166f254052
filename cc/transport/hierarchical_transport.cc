#include "cc/transport/hierarchical_transport.h"

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
  const int64_t element_bytes = DataTypeSize(dtype);
  const int local_size = local_->size();
  TFRING_RETURN_IF_ERROR(local_->Allreduce(input, output, count, dtype, op));
  // Slice j: elements [count * j / n, count * (j + 1) / n).
  std::vector<int64_t> slice_bytes(local_size);
  for (int j = 0; j < local_size; ++j) {
    slice_bytes[j] = (count * (j + 1) / local_size - count * j / local_size) * element_bytes;
  }
  const int me = local_->rank();
  char* mine = static_cast<char*>(output) + count * me / local_size * element_bytes;
  TFRING_RETURN_IF_ERROR(
      cross_->Allreduce(mine, mine, slice_bytes[me] / element_bytes, dtype, op));
  return local_->Allgatherv(nullptr, slice_bytes[me], output, slice_bytes);
}

Status HierarchicalTransport::AllreduceWire(const void* input, void* output, int64_t count,
                                            DataType dtype, ReduceOp op,
                                            WireCompression compression) {
  if (compression == WireCompression::kNone || dtype != DataType::kFloat32 ||
      op != ReduceOp::kSum) {
    return Allreduce(input, output, count, dtype, op);
  }
  // (1) in float32 inside the host; every rank of the host holds the sum.
  TFRING_RETURN_IF_ERROR(local_->Allreduce(input, output, count, dtype, op));
  // (2) slice j across the hosts, encoded on the wire, summed in float32.
  const int local_size = local_->size();
  const int me = local_->rank();
  std::vector<int64_t> slice_bytes(local_size);
  for (int j = 0; j < local_size; ++j) {
    slice_bytes[j] = (count * (j + 1) / local_size - count * j / local_size) * sizeof(float);
  }
  float* mine = static_cast<float*>(output) + count * me / local_size;
  TFRING_RETURN_IF_ERROR(cross_sum_.Run(cross_.get(), mine,
                                        slice_bytes[me] / static_cast<int64_t>(sizeof(float)),
                                        compression));
  // (3) the host's ranks gather the slices.
  return local_->Allgatherv(nullptr, slice_bytes[me], output, slice_bytes);
}

}  // namespace tfring
