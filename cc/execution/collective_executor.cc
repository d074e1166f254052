#include "cc/execution/collective_executor.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <utility>

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

// Asks the framework for an output of `shape`. Whatever it reports is a
// per-tensor failure of this rank, never a transport failure.
Status AllocateOutput(TensorEntry& entry, const std::vector<int64_t>& shape) {
  Status allocated;
  try {
    allocated = entry.buffers.allocate_output(shape, &entry.buffers.output);
  } catch (const std::bad_alloc&) {
    allocated = Status::ResourceExhausted("out of memory allocating the output");
  } catch (const std::exception& e) {
    allocated = Status::Internal(std::string("allocating the output threw: ") + e.what());
  }
  if (allocated.ok()) return allocated;
  const StatusCode code =
      allocated.code() == StatusCode::kAborted ? StatusCode::kInternal : allocated.code();
  return Status(code, "could not allocate the output of shape " + ShapeToString(shape) + ": " +
                          allocated.message());
}

// A transport failure, in the words every tensor it fails gets (the batch
// that met it, and every later one alike), so a user sees "tfring stopped"
// whichever op it was.
Status JobStopped(const Status& failure) {
  return Status::Aborted("tfring stopped: a collective failed (" + failure.message() + ")");
}

}  // namespace

CollectiveExecutor::CollectiveExecutor(Transport* transport, const Config& config,
                                       std::vector<int> world_ranks)
    : transport_(transport),
      config_(config),
      world_ranks_(std::move(world_ranks)),
      fusion_threshold_(config.fusion_threshold),
      direct_threshold_(config.direct_threshold) {}

void CollectiveExecutor::SetThresholds(int64_t fusion_threshold, int64_t direct_threshold) {
  fusion_threshold_ = std::min(fusion_threshold, config_.fusion_threshold);
  direct_threshold_ = direct_threshold;
}

std::vector<int> CollectiveExecutor::WorldRanks(const std::vector<int>& ranks) const {
  std::vector<int> world;
  for (int rank : ranks) world.push_back(world_ranks_[rank]);
  return world;
}

Status CollectiveExecutor::Prepare() {
  // The planner keeps every fused batch within the threshold, so one buffer
  // of that size serves the whole job and a batch never allocates: an
  // allocation failing on one rank in the middle of a round would leave the
  // others waiting in the collective.
  const int64_t bytes = FusionFootprint(config_.fusion_threshold);
  Status reserved;
  if (bytes > 0) {
    fusion_buffer_.reset(new (std::nothrow) uint8_t[bytes], std::default_delete<uint8_t[]>());
    if (!fusion_buffer_) {
      reserved = Status::ResourceExhausted(
          "could not reserve the fusion buffer of " + std::to_string(bytes) +
          " bytes (TFRING_FUSION_THRESHOLD); lower TFRING_FUSION_THRESHOLD (e.g. 67108864 "
          "for 64 MiB) or give the process more memory");
    }
  }
  std::vector<Status> agreed;
  TFRING_RETURN_IF_ERROR(AgreeOnLocalFailures({"tfring start-up"}, {reserved}, &agreed));
  return agreed[0];
}

Status CollectiveExecutor::Execute(const ResponseList& responses, TensorQueue* queue,
                                   const RoundTrace* trace) {
  // Take every entry first: names are released before any callback runs.
  std::vector<TensorEntry> entries;
  std::vector<Status> outcome;
  std::vector<size_t> response_of_entry;
  entries.reserve(responses.size());
  stand_in_buffers_.clear();
  for (size_t r = 0; r < responses.size(); ++r) {
    const Response& response = responses[r];
    TensorEntry entry;
    if (!queue->TryTake(response.name(), &entry)) {
      // This rank has joined and never submitted the tensor: it takes part
      // with zeros in an allreduce, and skips anything else.
      if (response.is_error) continue;
      entry = JoinedStandIn(response);
    }
    entry.contributors = response.contributors > 0 ? response.contributors : transport_->size();
    if (response.request.type == CollectiveType::kJoin) {
      entry.request.root_rank = response.request.root_rank;  // the last rank to join
    }
    entries.push_back(std::move(entry));
    response_of_entry.push_back(r);
    outcome.push_back(response.is_error ? Status::FailedPrecondition(response.error_message)
                                        : Status::OK());
  }
  auto fail_all = [&](const Status& status) {
    for (size_t i = 0; i < entries.size(); ++i) {
      CompleteEntry(entries[i], outcome[i].ok() ? status : outcome[i]);
    }
    return status;
  };
  Status transport_failure = PrepareOutputs(entries, &outcome);
  if (!transport_failure.ok()) return fail_all(JobStopped(transport_failure));

  std::vector<FusionCandidate> candidates;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!outcome[i].ok()) {
      CompleteEntry(entries[i], outcome[i]);
      if (trace != nullptr) {
        TraceBatch(*trace, {i}, entries, response_of_entry, false, 0, BatchPhases(), outcome[i]);
      }
      continue;
    }
    const Request& request = entries[i].request;
    const int64_t bytes = request.type == CollectiveType::kAllgather
                              ? NumElements(layouts_[i].output_shape) * DataTypeSize(request.dtype)
                              : ByteSize(request);
    candidates.push_back(FusionCandidate{i, &request, bytes});
  }
  std::vector<int64_t> candidate_bytes(entries.size(), 0);
  for (const FusionCandidate& candidate : candidates) {
    candidate_bytes[candidate.index] = candidate.bytes;
  }
  // A fusion threshold of 0 turns fusion off on every path.
  const bool allreduce_spans = transport_->ReducesSpans() && fusion_threshold_ > 0;
  for (const Batch& batch :
       PlanBatches(candidates, fusion_threshold_, direct_threshold_, allreduce_spans)) {
    BatchPhases phases;
    if (trace != nullptr) {
      phases.Mark(OpPhase::kQueue);
      phases_ = &phases;
    }
    int64_t batch_bytes = 0;
    for (size_t index : batch.members) batch_bytes += candidate_bytes[index];
    Status status = transport_failure;  // once failed, the ranks cannot move data together
    if (status.ok()) {
      status = RunBatchCatching(batch, entries);
      if (status.code() == StatusCode::kAborted) {
        status = JobStopped(status);
        transport_failure = status;
      }
      if (status.ok()) bytes_moved_ += batch_bytes;
    }
    for (size_t index : batch.members) CompleteEntry(entries[index], status);
    phases_ = nullptr;
    if (trace != nullptr) {
      phases.Mark(OpPhase::kCallback);
      // Several tensors in one spans call count as fused: one collective.
      const bool fused = batch.fused || (batch.spans && batch.members.size() > 1);
      TraceBatch(*trace, batch.members, entries, response_of_entry, fused, batch_bytes,
                 phases, status);
    }
  }
  return transport_failure;
}

void CollectiveExecutor::TraceBatch(const RoundTrace& trace, const std::vector<size_t>& members,
                                    const std::vector<TensorEntry>& entries,
                                    const std::vector<size_t>& response_of_entry, bool fused,
                                    int64_t batch_bytes, const BatchPhases& phases,
                                    const Status& status) const {
  const int64_t batch = (*trace.next_batch)++;
  for (size_t index : members) {
    const TensorEntry& entry = entries[index];
    TensorTrace record;
    record.request = entry.request;
    record.bytes = entry.request.shape.empty() || entry.request.shape[0] >= 0
                       ? ByteSize(entry.request)
                       : 0;
    const size_t response = response_of_entry[index];
    if (response < trace.ready.size()) record.ready = trace.ready[response];
    record.agreed = trace.agreed;
    record.cycle = trace.cycle;
    record.batch = batch;
    record.batch_tensors = static_cast<int>(members.size());
    record.batch_bytes = batch_bytes;
    record.fused = fused;
    record.phases = phases;
    if (!status.ok()) record.error = status.message();
    trace.timeline->RecordTensor(std::move(record));
  }
}

Status CollectiveExecutor::PrepareOutputs(std::vector<TensorEntry>& entries,
                                          std::vector<Status>* outcome) {
  const int size = transport_->size();
  const int rank = transport_->rank();
  layouts_.assign(entries.size(), RowLayout());
  scaled_inputs_.clear();
  scaled_inputs_.resize(entries.size());

  // The run-time shapes of the whole round, in one exchange.
  std::vector<int64_t> local_words;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!(*outcome)[i].ok()) continue;
    const std::vector<int64_t> words = ShapeWords(entries[i].request, entries[i].buffers, size);
    local_words.insert(local_words.end(), words.begin(), words.end());
  }
  std::vector<int64_t> all_words;
  if (!local_words.empty()) {
    TFRING_RETURN_IF_ERROR(transport_->AllgatherInt64s(local_words, &all_words));
  }

  std::vector<size_t> allocated;  // tensors whose output this rank allocated
  std::vector<std::string> whats;
  std::vector<Status> allocations;
  int64_t word_offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    TensorEntry& entry = entries[i];
    const Request& request = entry.request;
    if (!(*outcome)[i].ok() || (!HasRunTimeShape(request.type) &&
                                request.type != CollectiveType::kReducescatter)) {
      continue;
    }
    std::vector<const int64_t*> words_by_rank(size);
    for (int r = 0; r < size; ++r) {
      words_by_rank[r] = all_words.data() + r * local_words.size() + word_offset;
    }
    word_offset += ShapeWordCount(request.type, size);
    Status built = BuildRowLayout(request, words_by_rank, rank, world_ranks_, &layouts_[i]);
    if (!built.ok()) {
      (*outcome)[i] = built;  // the same verdict on every rank
      continue;
    }
    if (entry.buffers.received_splits != nullptr) {
      *entry.buffers.received_splits = layouts_[i].recv_rows;
    }
    Status status = AllocateOutput(entry, layouts_[i].output_shape);
    if (status.ok() && request.type == CollectiveType::kReducescatter &&
        request.prescale_factor != 1.0 &&
        !FitsFusionBuffer(ByteSize(request), fusion_threshold_, direct_threshold_)) {
      // A direct reducescatter scales its input into scratch memory first.
      scaled_inputs_[i].reset(new (std::nothrow) uint8_t[ByteSize(request)]);
      if (!scaled_inputs_[i]) {
        status = Status::ResourceExhausted("could not allocate " +
                                           std::to_string(ByteSize(request)) +
                                           " bytes to apply the prescale factor");
      }
    }
    allocated.push_back(i);
    whats.push_back(Describe(request));
    allocations.push_back(status);
  }
  if (allocated.empty()) return Status::OK();
  // Only this rank knows whether its outputs could be allocated; the ranks
  // agree on it before any data moves.
  std::vector<Status> agreed;
  TFRING_RETURN_IF_ERROR(AgreeOnLocalFailures(whats, allocations, &agreed));
  for (size_t k = 0; k < allocated.size(); ++k) (*outcome)[allocated[k]] = agreed[k];
  return Status::OK();
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
  const size_t first = batch.members[0];
  TensorEntry& entry = entries[first];
  switch (entry.request.type) {
    case CollectiveType::kAllreduce:
      if (!batch.fused && !batch.spans) return RunDirectAllreduce(entry);
      {
        std::vector<TensorEntry*> members;
        for (size_t index : batch.members) members.push_back(&entries[index]);
        return batch.spans ? RunSpansAllreduce(members) : RunFusedAllreduce(members);
      }
    case CollectiveType::kAllgather:
      return batch.fused ? RunFusedAllgather(batch.members, entries)
                         : RunDirectAllgather(first, entry);
    case CollectiveType::kReducescatter:
      return batch.fused ? RunFusedReducescatter(batch.members, entries)
                         : RunDirectReducescatter(first, entry);
    case CollectiveType::kAlltoall: return RunAlltoall(first, entry);
    case CollectiveType::kBroadcast: return RunBroadcast(entry);
    case CollectiveType::kJoin:
      // Every rank has joined; nothing moves.
      if (entry.buffers.output != nullptr) {
        *static_cast<int32_t*>(entry.buffers.output) = entry.request.root_rank;
      }
      return Status::OK();
  }
  return Status::Internal("unknown collective type");
}

int64_t CollectiveExecutor::Divisor(const TensorEntry& entry) {
  return entry.request.reduce_op == ReduceOp::kAverage ? entry.contributors : 1;
}

void CollectiveExecutor::FinishReduction(const TensorEntry& entry, const void* src, void* dst,
                                         int64_t count) const {
  ScaleCopy(entry.request.dtype, src, dst, count, entry.request.postscale_factor, Divisor(entry));
}

TensorEntry CollectiveExecutor::JoinedStandIn(const Response& response) {
  TensorEntry entry;
  entry.request = response.request;
  const int64_t bytes = ByteSize(entry.request);
  stand_in_buffers_.emplace_back(bytes, 0);  // zeros in
  entry.buffers.input = stand_in_buffers_.back().data();
  stand_in_buffers_.emplace_back(bytes, 0);  // discarded out
  entry.buffers.output = stand_in_buffers_.back().data();
  entry.done = [](const Status&) {};
  return entry;
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
  MarkPhase(OpPhase::kCopyIn);
  TFRING_RETURN_IF_ERROR(transport_->AllreduceWire(buffer, buffer, offset / element_size,
                                                   first.dtype, TransportOp(first.reduce_op),
                                                   first.compression));
  MarkPhase(OpPhase::kCommunicate);
  offset = 0;
  for (TensorEntry* entry : members) {
    FinishReduction(*entry, buffer + offset, entry->buffers.output,
                    NumElements(entry->request.shape));
    offset += FusionFootprint(ByteSize(entry->request));
  }
  MarkPhase(OpPhase::kCopyOut);
  return Status::OK();
}

Status CollectiveExecutor::RunSpansAllreduce(const std::vector<TensorEntry*>& members) {
  const Request& first = members[0]->request;
  std::vector<ReduceSpan> spans;
  spans.reserve(members.size());
  bool prescaled = false;
  for (TensorEntry* entry : members) {
    const Request& request = entry->request;
    ReduceSpan span;
    span.input = entry->buffers.input;
    span.output = entry->buffers.output;
    span.count = NumElements(request.shape);
    span.factor = request.postscale_factor;
    span.divisor = Divisor(*entry);
    if (request.prescale_factor != 1.0) {
      ScaleCopy(request.dtype, span.input, span.output, span.count, request.prescale_factor);
      span.input = span.output;
      prescaled = true;
    }
    spans.push_back(span);
  }
  if (prescaled) MarkPhase(OpPhase::kCopyIn);
  TFRING_RETURN_IF_ERROR(
      transport_->AllreduceSpans(spans, first.dtype, TransportOp(first.reduce_op)));
  MarkPhase(OpPhase::kCommunicate);
  return Status::OK();
}

Status CollectiveExecutor::RunDirectAllreduce(TensorEntry& entry) {
  const Request& request = entry.request;
  const int64_t count = NumElements(request.shape);
  const void* input = entry.buffers.input;
  if (request.prescale_factor != 1.0) {
    ScaleCopy(request.dtype, input, entry.buffers.output, count, request.prescale_factor);
    input = entry.buffers.output;
    MarkPhase(OpPhase::kCopyIn);
  }
  TFRING_RETURN_IF_ERROR(transport_->AllreduceWire(input, entry.buffers.output, count,
                                                   request.dtype, TransportOp(request.reduce_op),
                                                   request.compression));
  MarkPhase(OpPhase::kCommunicate);
  FinishReduction(entry, entry.buffers.output, entry.buffers.output, count);
  MarkPhase(OpPhase::kCopyOut);
  return Status::OK();
}

Status CollectiveExecutor::AgreeOnLocalFailures(const std::vector<std::string>& whats,
                                                const std::vector<Status>& local,
                                                std::vector<Status>* agreed) {
  // One bit per (tensor, rank), inverted so that the AND tells every rank
  // which ranks cleared theirs.
  const int size = transport_->size();
  const int rank = transport_->rank();
  const int64_t bits = static_cast<int64_t>(local.size()) * size;
  std::vector<uint64_t> ok_bits((bits + 63) / 64, ~0ull);
  for (size_t i = 0; i < local.size(); ++i) {
    const int64_t bit = static_cast<int64_t>(i) * size + rank;
    if (!local[i].ok()) ok_bits[bit / 64] &= ~(1ull << (bit % 64));
  }
  TFRING_RETURN_IF_ERROR(transport_->BitwiseAndAllreduce(&ok_bits));
  agreed->assign(local.size(), Status::OK());
  for (size_t i = 0; i < local.size(); ++i) {
    std::vector<int> failed;
    for (int r = 0; r < size; ++r) {
      const int64_t bit = static_cast<int64_t>(i) * size + r;
      if (!((ok_bits[bit / 64] >> (bit % 64)) & 1)) failed.push_back(r);
    }
    if (failed.empty()) continue;
    if (!local[i].ok()) {
      (*agreed)[i] = Status(local[i].code(), whats[i] + " failed on " +
                                                 RanksToString(WorldRanks(failed)) +
                                                 " (this rank: " + local[i].message() +
                                                 "). Every rank skipped it.");
    } else {
      (*agreed)[i] = Status::FailedPrecondition(
          whats[i] + " failed on " + RanksToString(WorldRanks(failed)) +
          " (that rank's error says why). Every rank skipped it.");
    }
  }
  return Status::OK();
}

Status CollectiveExecutor::RunDirectAllgather(size_t index, TensorEntry& entry) {
  const RowLayout& layout = layouts_[index];
  std::vector<int64_t> bytes_per_rank;
  for (int64_t rows : layout.recv_rows) bytes_per_rank.push_back(rows * layout.row_bytes);
  TFRING_RETURN_IF_ERROR(transport_->Allgatherv(entry.buffers.input,
                                                bytes_per_rank[transport_->rank()],
                                                entry.buffers.output, bytes_per_rank));
  MarkPhase(OpPhase::kCommunicate);
  return Status::OK();
}

Status CollectiveExecutor::RunFusedAllgather(const std::vector<size_t>& members,
                                             std::vector<TensorEntry>& entries) {
  // Rank-major: rank r's block holds its rows of every member, in member
  // order. Each rank packs its own block in place, one Allgatherv fills in
  // the others, and every member's output is assembled block by block.
  const int size = transport_->size();
  const int rank = transport_->rank();
  std::vector<int64_t> bytes_per_rank(size, 0);
  for (size_t index : members) {
    const RowLayout& layout = layouts_[index];
    for (int r = 0; r < size; ++r) bytes_per_rank[r] += layout.recv_rows[r] * layout.row_bytes;
  }
  uint8_t* buffer = fusion_buffer_.get();
  uint8_t* cursor = buffer;
  for (int r = 0; r < rank; ++r) cursor += bytes_per_rank[r];
  for (size_t index : members) {
    const int64_t bytes = layouts_[index].recv_rows[rank] * layouts_[index].row_bytes;
    if (bytes > 0) std::memcpy(cursor, entries[index].buffers.input, bytes);
    cursor += bytes;
  }
  MarkPhase(OpPhase::kCopyIn);
  TFRING_RETURN_IF_ERROR(
      transport_->Allgatherv(nullptr, bytes_per_rank[rank], buffer, bytes_per_rank));
  MarkPhase(OpPhase::kCommunicate);
  std::vector<int64_t> written(members.size(), 0);  // bytes of each output filled so far
  cursor = buffer;
  for (int r = 0; r < size; ++r) {
    for (size_t m = 0; m < members.size(); ++m) {
      const RowLayout& layout = layouts_[members[m]];
      const int64_t bytes = layout.recv_rows[r] * layout.row_bytes;
      uint8_t* output = static_cast<uint8_t*>(entries[members[m]].buffers.output);
      if (bytes > 0) std::memcpy(output + written[m], cursor, bytes);
      written[m] += bytes;
      cursor += bytes;
    }
  }
  MarkPhase(OpPhase::kCopyOut);
  return Status::OK();
}

Status CollectiveExecutor::RunDirectReducescatter(size_t index, TensorEntry& entry) {
  const Request& request = entry.request;
  const RowLayout& layout = layouts_[index];
  const int64_t element_size = DataTypeSize(request.dtype);
  std::vector<int64_t> counts;
  for (int64_t rows : layout.recv_rows) counts.push_back(rows * layout.row_bytes / element_size);
  const void* input = entry.buffers.input;
  if (scaled_inputs_[index]) {
    ScaleCopy(request.dtype, input, scaled_inputs_[index].get(), NumElements(request.shape),
              request.prescale_factor);
    input = scaled_inputs_[index].get();
    MarkPhase(OpPhase::kCopyIn);
  }
  TFRING_RETURN_IF_ERROR(transport_->ReduceScatter(input, entry.buffers.output, counts,
                                                   request.dtype,
                                                   TransportOp(request.reduce_op)));
  MarkPhase(OpPhase::kCommunicate);
  const int64_t count = counts[transport_->rank()];
  FinishReduction(entry, entry.buffers.output, entry.buffers.output, count);
  MarkPhase(OpPhase::kCopyOut);
  return Status::OK();
}

Status CollectiveExecutor::RunFusedReducescatter(const std::vector<size_t>& members,
                                                 std::vector<TensorEntry>& entries) {
  // Rank-major: region r holds, for every member in order, the rows rank r
  // keeps. One in-place reduce-scatter leaves this rank's region, reduced,
  // at the start of the buffer.
  const int size = transport_->size();
  const Request& first = entries[members[0]].request;
  const int64_t element_size = DataTypeSize(first.dtype);
  uint8_t* buffer = fusion_buffer_.get();
  uint8_t* cursor = buffer;
  std::vector<int64_t> counts(size, 0);
  std::vector<int64_t> row_offset(members.size(), 0);  // rows of each member packed so far
  for (int r = 0; r < size; ++r) {
    for (size_t m = 0; m < members.size(); ++m) {
      const TensorEntry& entry = entries[members[m]];
      const RowLayout& layout = layouts_[members[m]];
      const int64_t count = layout.recv_rows[r] * layout.row_bytes / element_size;
      const uint8_t* input = static_cast<const uint8_t*>(entry.buffers.input);
      ScaleCopy(first.dtype, input + row_offset[m] * layout.row_bytes, cursor, count,
                entry.request.prescale_factor);
      row_offset[m] += layout.recv_rows[r];
      cursor += count * element_size;
      counts[r] += count;
    }
  }
  MarkPhase(OpPhase::kCopyIn);
  TFRING_RETURN_IF_ERROR(transport_->ReduceScatter(buffer, buffer, counts, first.dtype,
                                                   TransportOp(first.reduce_op)));
  MarkPhase(OpPhase::kCommunicate);
  cursor = buffer;
  for (size_t index : members) {
    const RowLayout& layout = layouts_[index];
    const int64_t count = layout.recv_rows[transport_->rank()] * layout.row_bytes / element_size;
    FinishReduction(entries[index], cursor, entries[index].buffers.output, count);
    cursor += count * element_size;
  }
  MarkPhase(OpPhase::kCopyOut);
  return Status::OK();
}

Status CollectiveExecutor::RunAlltoall(size_t index, TensorEntry& entry) {
  const RowLayout& layout = layouts_[index];
  std::vector<int64_t> send_bytes, recv_bytes;
  for (int64_t rows : layout.send_rows) send_bytes.push_back(rows * layout.row_bytes);
  for (int64_t rows : layout.recv_rows) recv_bytes.push_back(rows * layout.row_bytes);
  TFRING_RETURN_IF_ERROR(
      transport_->Alltoallv(entry.buffers.input, send_bytes, entry.buffers.output, recv_bytes));
  MarkPhase(OpPhase::kCommunicate);
  return Status::OK();
}

Status CollectiveExecutor::RunBroadcast(TensorEntry& entry) {
  const Request& request = entry.request;
  const int64_t bytes = ByteSize(request);
  // root_rank is a job rank; the transport counts the set's ranks.
  const auto root = std::find(world_ranks_.begin(), world_ranks_.end(), request.root_rank);
  if (root == world_ranks_.end()) {
    return Status::InvalidArgument(Describe(request) + ": root_rank " +
                                   std::to_string(request.root_rank) +
                                   " is not in the process set");
  }
  const int root_rank = static_cast<int>(root - world_ranks_.begin());
  if (transport_->rank() == root_rank && entry.buffers.output != entry.buffers.input) {
    std::memcpy(entry.buffers.output, entry.buffers.input, bytes);
    MarkPhase(OpPhase::kCopyIn);
  }
  TFRING_RETURN_IF_ERROR(transport_->Broadcast(entry.buffers.output, bytes, root_rank));
  MarkPhase(OpPhase::kCommunicate);
  return Status::OK();
}

}  // namespace tfring
