#include "cc/collective_executor.h"

#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cc/logging.h"
#include "cc/reduce_kernels.h"

namespace tfring {
namespace {

int64_t ByteSize(const Request& request) {
  return NumElements(request.shape) * DataTypeSize(request.dtype);
}

ReduceOp TransportOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

std::string Describe(const Request& request) {
  return std::string("tfring ") + CollectiveTypeName(request.type) + " of tensor '" +
         request.name + "'";
}

}  // namespace

CollectiveExecutor::CollectiveExecutor(Transport* transport, const Config& config)
    : transport_(transport), config_(config) {}

Status CollectiveExecutor::Prepare() {
  // The planner keeps every fused batch within the threshold, so one buffer
  // of that size serves the whole job and a batch never allocates: an
  // allocation failing on one rank in the middle of a round would leave the
  // others waiting in the collective.
  const int64_t bytes = FusionFootprint(config_.fusion_threshold);
  Status reserved;
  if (bytes > 0) {
    fusion_buffer_.reset(new (std::nothrow) uint8_t[bytes]);
    if (!fusion_buffer_) {
      reserved = Status::ResourceExhausted(
          "could not reserve the fusion buffer of " + std::to_string(bytes) +
          " bytes (TFRING_FUSION_THRESHOLD); lower TFRING_FUSION_THRESHOLD (e.g. 67108864 "
          "for 64 MiB) or give the process more memory");
    }
  }
  Status agreed;
  TFRING_RETURN_IF_ERROR(AgreeOnLocalFailure("tfring start-up", reserved, &agreed));
  return agreed;
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
  Status transport_failure;
  for (const Batch& batch : batches) {
    const Response& first = responses[batch.members[0]];
    Status status;
    if (first.is_error) {
      status = Status::FailedPrecondition(first.error_message);
    } else if (!transport_failure.ok()) {
      status = transport_failure;  // the ranks can no longer move data together
    } else {
      status = RunBatchCatching(batch, entries);
      if (status.code() == StatusCode::kAborted) transport_failure = status;
    }
    for (size_t index : batch.members) CompleteEntry(entries[index], status);
  }
  return transport_failure;
}

Status CollectiveExecutor::RunBatchCatching(const Batch& batch,
                                            std::vector<TensorEntry>& entries) {
  const Request& first = entries[batch.members[0]].request;
  try {
    return RunBatch(batch, entries);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(Describe(first) + ": out of memory on rank " +
                                     std::to_string(transport_->rank()) + ".");
  } catch (const std::exception& e) {
    return Status::Internal(Describe(first) + " failed on rank " +
                            std::to_string(transport_->rank()) + ": " + e.what());
  } catch (...) {
    return Status::Internal(Describe(first) + " failed on rank " +
                            std::to_string(transport_->rank()) + ": unknown exception");
  }
}

Status CollectiveExecutor::RunBatch(const Batch& batch, std::vector<TensorEntry>& entries) {
  TensorEntry& first = entries[batch.members[0]];
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

void CollectiveExecutor::FinishReduction(const Request& request, const void* src,
                                         void* dst) const {
  const int64_t divisor = request.reduce_op == ReduceOp::kAverage ? transport_->size() : 1;
  ScaleCopy(request.dtype, src, dst, NumElements(request.shape), request.postscale_factor,
            divisor);
}

Status CollectiveExecutor::RunFusedAllreduce(const std::vector<TensorEntry*>& members) {
  const Request& first = members[0]->request;
  const int64_t element_size = DataTypeSize(first.dtype);
  uint8_t* buffer = fusion_buffer_.get();

  // Pack: each member at an aligned offset; the padding is zeroed so that no
  // uninitialised byte enters the reduction.
  int64_t offset = 0;
  for (const TensorEntry* entry : members) {
    const Request& request = entry->request;
    const int64_t bytes = ByteSize(request);
    ScaleCopy(request.dtype, entry->buffers.input, buffer + offset, NumElements(request.shape),
              request.prescale_factor);
    std::memset(buffer + offset + bytes, 0, FusionFootprint(bytes) - bytes);
    offset += FusionFootprint(bytes);
  }
  TFRING_RETURN_IF_ERROR(transport_->Allreduce(buffer, buffer, offset / element_size,
                                               first.dtype, TransportOp(first.reduce_op)));
  offset = 0;
  for (TensorEntry* entry : members) {
    FinishReduction(entry->request, buffer + offset, entry->buffers.output);
    offset += FusionFootprint(ByteSize(entry->request));
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
  FinishReduction(request, entry.buffers.output, entry.buffers.output);
  return Status::OK();
}

Status CollectiveExecutor::AgreeOnLocalFailure(const std::string& what, const Status& local,
                                               Status* agreed) {
  // One bit per rank, inverted so that the AND tells every rank which ranks
  // cleared theirs.
  const int size = transport_->size();
  std::vector<uint64_t> ok_bits((size + 63) / 64, ~0ull);
  const int rank = transport_->rank();
  if (!local.ok()) ok_bits[rank / 64] &= ~(1ull << (rank % 64));
  TFRING_RETURN_IF_ERROR(transport_->BitwiseAndAllreduce(&ok_bits));
  std::vector<int> failed;
  for (int r = 0; r < size; ++r) {
    if (!((ok_bits[r / 64] >> (r % 64)) & 1)) failed.push_back(r);
  }
  if (failed.empty()) {
    *agreed = Status::OK();
  } else if (!local.ok()) {
    *agreed = Status(local.code(), what + " failed on " + RanksToString(failed) + " (this rank: " +
                                       local.message() + "). Every rank skipped it.");
  } else {
    *agreed = Status::FailedPrecondition(what + " failed on " + RanksToString(failed) +
                                         " (that rank's error says why). Every rank skipped it.");
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

  // Only this rank knows whether its output could be allocated; the ranks
  // agree on it before any data moves.
  void* output = nullptr;
  Status allocated;
  try {
    allocated = entry.buffers.allocate_output(output_shape, &output);
  } catch (const std::bad_alloc&) {
    allocated = Status::ResourceExhausted("out of memory allocating the output");
  } catch (const std::exception& e) {
    allocated = Status::Internal(std::string("allocating the output threw: ") + e.what());
  }
  if (!allocated.ok()) {
    // Whatever the allocator said, this is not a transport failure (kAborted
    // would stop the job).
    const StatusCode code = allocated.code() == StatusCode::kAborted ? StatusCode::kInternal
                                                                     : allocated.code();
    allocated = Status(code, "could not allocate the output of shape " +
                                 ShapeToString(output_shape) + ": " + allocated.message());
  }
  Status agreed;
  TFRING_RETURN_IF_ERROR(AgreeOnLocalFailure(Describe(request), allocated, &agreed));
  TFRING_RETURN_IF_ERROR(agreed);
  return transport_->Allgatherv(entry.buffers.input, shape[0] * row_bytes, output,
                                bytes_per_rank);
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
