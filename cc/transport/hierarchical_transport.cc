#include "cc/transport/hierarchical_transport.h"

#include <utility>

namespace tfring {

HierarchicalTransport::HierarchicalTransport(Transport* flat, std::unique_ptr<Transport> local,
                                             std::unique_ptr<Transport> cross, int64_t min_bytes)
    : flat_(flat), local_(std::move(local)), cross_(std::move(cross)), min_bytes_(min_bytes) {}

Status HierarchicalTransport::Allreduce(const void* input, void* output, int64_t count,
                                        DataType dtype, ReduceOp op) {
  const int64_t element_bytes = DataTypeSize(dtype);
  const int local_size = local_->size();
  // Every rank decides from the count alone, so all take the same path.
  if (min_bytes_ < 0 || count * element_bytes < min_bytes_ || count < local_size) {
    return flat_->Allreduce(input, output, count, dtype, op);
  }
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
