#include "cc/collective_executor.h"

#include <cstring>

#include "cc/logging.h"
#include "cc/reduce_kernels.h"

namespace tfring {
namespace {

constexpr int64_t kFusionAlignment = 64;

int64_t AlignUp(int64_t bytes) {
  return (bytes + kFusionAlignment - 1) / kFusionAlignment * kFusionAlignment;
}

int64_t ByteSize(const Request& request) {
  return NumElements(request.shape) * DataTypeSize(request.dtype);
}

ReduceOp TransportOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

}  // namespace

CollectiveExecutor::CollectiveExecutor(Transport* transport, const Config& config)
    : transport_(transport), config_(config) {}

double CollectiveExecutor::PostscaleOf(const Request& request) const {
  double factor = request.postscale_factor;
  if (request.reduce_op == ReduceOp::kAverage) factor /= transport_->size();
  return factor;
}

uint8_t* CollectiveExecutor::FusionBuffer(int64_t bytes) {
  if (bytes > fusion_buffer_bytes_) {
    fusion_buffer_.reset(new uint8_t[bytes]);
    fusion_buffer_bytes_ = bytes;
  }
  return fusion_buffer_.get();
}

Status CollectiveExecutor::Execute(const ResponseList& responses, TensorQueue* queue) {
  // Take every entry first: names are released before any callback runs.
  std::vector<TensorEntry> entries;
  std::vector<int64_t> byte_sizes;
  entries.reserve(responses.size());
  for (const Response& response : responses) {
    entries.push_back(queue->Take(response.name()));
    byte_sizes.push_back(ByteSize(entries.back().request));
  }
  const std::vector<Batch> batches =
      PlanBatches(responses, byte_sizes, config_.fusion_threshold, config_.direct_threshold);
  Status failure;
  for (const Batch& batch : batches) {
    Status status = failure.ok() ? RunBatch(batch, responses, entries) : failure;
    for (size_t index : batch.members) {
      const Response& response = responses[index];
      const Status result =
          response.is_error ? Status::FailedPrecondition(response.error_message) : status;
      entries[index].done(result);
    }
    if (!status.ok()) failure = status;
  }
  return failure;
}

Status CollectiveExecutor::RunBatch(const Batch& batch, const ResponseList& responses,
                                    std::vector<TensorEntry>& entries) {
  TensorEntry& first = entries[batch.members[0]];
  if (responses[batch.members[0]].is_error) return Status::OK();
  if (batch.fused) {
    std::vector<TensorEntry*> members;
    for (size_t index : batch.members) members.push_back(&entries[index]);
    return RunFusedAllreduce(members);
  }
  switch (first.request.type) {
    case CollectiveType::kAllreduce: return RunDirectAllreduce(first);
    case CollectiveType::kAllgather: return RunAllgather(first);
    case CollectiveType::kBroadcast: return RunBroadcast(first);
  }
  return Status::Internal("unknown collective type");
}

Status CollectiveExecutor::RunFusedAllreduce(const std::vector<TensorEntry*>& members) {
  const Request& first = members[0]->request;
  const int64_t element_size = DataTypeSize(first.dtype);
  int64_t total_bytes = 0;
  for (const TensorEntry* entry : members) total_bytes += AlignUp(ByteSize(entry->request));
  uint8_t* buffer = FusionBuffer(total_bytes);

  int64_t offset = 0;
  for (const TensorEntry* entry : members) {
    const Request& request = entry->request;
    ScaleCopy(request.dtype, entry->buffers.input, buffer + offset,
              NumElements(request.shape), request.prescale_factor);
    offset += AlignUp(ByteSize(request));
  }
  // Alignment padding is reduced too; its contents do not matter.
  TFRING_RETURN_IF_ERROR(transport_->Allreduce(buffer, buffer, total_bytes / element_size,
                                               first.dtype, TransportOp(first.reduce_op)));
  offset = 0;
  for (TensorEntry* entry : members) {
    const Request& request = entry->request;
    ScaleCopy(request.dtype, buffer + offset, entry->buffers.output, NumElements(request.shape),
              PostscaleOf(request));
    offset += AlignUp(ByteSize(request));
  }
  return Status::OK();
}

Status CollectiveExecutor::RunDirectAllreduce(TensorEntry& entry) {
  const Request& request = entry.request;
  const int64_t count = NumElements(request.shape);
  const void* input = entry.buffers.input;
  if (request.prescale_factor != 1.0) {
    ScaleCopy(request.dtype, input, entry.buffers.output, count, request.prescale_factor);
    input = entry.buffers.output;
  }
  TFRING_RETURN_IF_ERROR(transport_->Allreduce(input, entry.buffers.output, count, request.dtype,
                                               TransportOp(request.reduce_op)));
  const double postscale = PostscaleOf(request);
  if (postscale != 1.0) {
    ScaleCopy(request.dtype, entry.buffers.output, entry.buffers.output, count, postscale);
  }
  return Status::OK();
}

Status CollectiveExecutor::RunAllgather(TensorEntry& entry) {
  const Request& request = entry.request;
  // A scalar is gathered as a vector of one element per rank.
  std::vector<int64_t> shape = request.shape.empty() ? std::vector<int64_t>{1} : request.shape;
  const int64_t row_bytes =
      NumElements(std::vector<int64_t>(shape.begin() + 1, shape.end())) *
      DataTypeSize(request.dtype);

  std::vector<int64_t> rows_per_rank;
  TFRING_RETURN_IF_ERROR(transport_->AllgatherInt64(shape[0], &rows_per_rank));
  std::vector<int64_t> bytes_per_rank;
  int64_t total_rows = 0;
  for (int64_t rows : rows_per_rank) {
    bytes_per_rank.push_back(rows * row_bytes);
    total_rows += rows;
  }
  std::vector<int64_t> output_shape = shape;
  output_shape[0] = total_rows;
  void* output = nullptr;
  Status allocated = entry.buffers.allocate_output(output_shape, &output);
  // Even when allocation fails this rank must take part, or the others hang:
  // contribute and receive into scratch memory, then report the failure.
  std::unique_ptr<uint8_t[]> scratch;
  if (!allocated.ok()) {
    scratch.reset(new uint8_t[total_rows * row_bytes + 1]);
    output = scratch.get();
  }
  TFRING_RETURN_IF_ERROR(transport_->Allgatherv(entry.buffers.input, shape[0] * row_bytes, output,
                                                bytes_per_rank));
  return allocated;
}

Status CollectiveExecutor::RunBroadcast(TensorEntry& entry) {
  const Request& request = entry.request;
  const int64_t bytes = ByteSize(request);
  if (transport_->rank() == request.root_rank && entry.buffers.output != entry.buffers.input) {
    std::memcpy(entry.buffers.output, entry.buffers.input, bytes);
  }
  return transport_->Broadcast(entry.buffers.output, bytes, request.root_rank);
}

}  // namespace tfring
