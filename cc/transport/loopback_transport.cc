#include "cc/transport/loopback_transport.h"

#include <cstring>

#include "cc/reduce_kernels.h"

namespace tfring {

LoopbackWorld::LoopbackWorld(int size) : size_(size), slots_(size) {}

std::vector<std::string> LoopbackWorld::Exchange(int rank, std::string bytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Wait until the previous exchange has been read by everyone.
  changed_.wait(lock, [&] { return departed_ == 0; });
  const uint64_t my_generation = generation_;
  slots_[rank] = std::move(bytes);
  if (++arrived_ == size_) {
    published_ = slots_;
    arrived_ = 0;
    departed_ = size_;
    ++generation_;
    changed_.notify_all();
  } else {
    changed_.wait(lock, [&] { return generation_ != my_generation; });
  }
  std::vector<std::string> result = published_;
  if (--departed_ == 0) changed_.notify_all();
  return result;
}

LoopbackTransport::LoopbackTransport(std::shared_ptr<LoopbackWorld> world, int rank)
    : world_(std::move(world)), rank_(rank) {}

Status LoopbackTransport::BitwiseAndAllreduce(std::vector<uint64_t>* words) {
  std::string mine(reinterpret_cast<const char*>(words->data()), words->size() * 8);
  for (const std::string& theirs : world_->Exchange(rank_, mine)) {
    if (theirs.size() != mine.size()) {
      return Status::Internal("loopback: bit vectors of different lengths");
    }
    const uint64_t* other = reinterpret_cast<const uint64_t*>(theirs.data());
    for (size_t i = 0; i < words->size(); ++i) (*words)[i] &= other[i];
  }
  return Status::OK();
}

Status LoopbackTransport::GatherToRoot(const std::string& local,
                                       std::vector<std::string>* gathered) {
  std::vector<std::string> all = world_->Exchange(rank_, local);
  if (rank_ == 0) *gathered = std::move(all);
  return Status::OK();
}

Status LoopbackTransport::BroadcastFromRoot(std::string* bytes) {
  *bytes = world_->Exchange(rank_, *bytes)[0];
  return Status::OK();
}

Status LoopbackTransport::Allreduce(const void* input, void* output, int64_t count,
                                    DataType dtype, ReduceOp op) {
  const int64_t bytes = count * DataTypeSize(dtype);
  std::vector<std::string> all =
      world_->Exchange(rank_, std::string(static_cast<const char*>(input), bytes));
  for (const std::string& theirs : all) {
    // What MPI reports as a truncation error: the ranks' calls do not match.
    if (static_cast<int64_t>(theirs.size()) != bytes) {
      return Status::Aborted("loopback: allreduce sizes disagree between ranks");
    }
  }
  // Reduce in rank order on every rank so all ranks get identical bits.
  std::memcpy(output, all[0].data(), bytes);
  for (size_t r = 1; r < all.size(); ++r) ReduceInto(dtype, op, all[r].data(), output, count);
  return Status::OK();
}

Status LoopbackTransport::AllgatherInt64s(const std::vector<int64_t>& local,
                                          std::vector<int64_t>* all) {
  const std::string mine(reinterpret_cast<const char*>(local.data()), local.size() * 8);
  all->clear();
  for (const std::string& theirs : world_->Exchange(rank_, mine)) {
    if (theirs.size() != mine.size()) {
      return Status::Aborted("loopback: run-time shape exchanges of different lengths");
    }
    const int64_t* words = reinterpret_cast<const int64_t*>(theirs.data());
    all->insert(all->end(), words, words + local.size());
  }
  return Status::OK();
}

Status LoopbackTransport::Allgatherv(const void* input, int64_t input_bytes, void* output,
                                     const std::vector<int64_t>& bytes_per_rank) {
  int64_t my_offset = 0;
  for (int r = 0; r < rank_; ++r) my_offset += bytes_per_rank[r];
  const char* mine = input != nullptr ? static_cast<const char*>(input)
                                      : static_cast<const char*>(output) + my_offset;
  std::vector<std::string> all = world_->Exchange(rank_, std::string(mine, input_bytes));
  char* cursor = static_cast<char*>(output);
  for (size_t r = 0; r < all.size(); ++r) {
    if (static_cast<int64_t>(all[r].size()) != bytes_per_rank[r]) {
      return Status::Aborted("loopback: allgather sizes disagree");
    }
    std::memcpy(cursor, all[r].data(), all[r].size());
    cursor += all[r].size();
  }
  return Status::OK();
}

Status LoopbackTransport::Alltoallv(const void* input, const std::vector<int64_t>& send_bytes,
                                    void* output, const std::vector<int64_t>& recv_bytes) {
  // Every rank publishes its whole input with its send sizes in front; each
  // then picks the block addressed to it.
  int64_t total = 0;
  for (int64_t bytes : send_bytes) total += bytes;
  std::string mine(reinterpret_cast<const char*>(send_bytes.data()), send_bytes.size() * 8);
  mine.append(static_cast<const char*>(input), total);
  std::vector<std::string> all = world_->Exchange(rank_, std::move(mine));
  char* cursor = static_cast<char*>(output);
  for (size_t r = 0; r < all.size(); ++r) {
    const int64_t* their_sizes = reinterpret_cast<const int64_t*>(all[r].data());
    int64_t offset = 0;
    for (int j = 0; j < rank_; ++j) offset += their_sizes[j];
    if (their_sizes[rank_] != recv_bytes[r]) {
      return Status::Aborted("loopback: alltoall sizes disagree");
    }
    std::memcpy(cursor, all[r].data() + all.size() * 8 + offset, recv_bytes[r]);
    cursor += recv_bytes[r];
  }
  return Status::OK();
}

Status LoopbackTransport::ReduceScatter(const void* input, void* output,
                                        const std::vector<int64_t>& counts, DataType dtype,
                                        ReduceOp op) {
  int64_t total = 0, my_offset = 0;
  for (int r = 0; r < static_cast<int>(counts.size()); ++r) {
    if (r < rank_) my_offset += counts[r];
    total += counts[r];
  }
  std::vector<uint8_t> reduced(total * DataTypeSize(dtype));
  TFRING_RETURN_IF_ERROR(Allreduce(input, reduced.data(), total, dtype, op));
  std::memcpy(output, reduced.data() + my_offset * DataTypeSize(dtype),
              counts[rank_] * DataTypeSize(dtype));
  return Status::OK();
}

Status LoopbackTransport::ReduceScatterAtOffsets(const void* input, void* output,
                                                 const std::vector<int64_t>& counts,
                                                 DataType dtype, ReduceOp op) {
  if (static_cast<int>(counts.size()) != size()) {
    return Status::InvalidArgument("loopback: reduce-scatter counts for another world size");
  }
  const int64_t element_bytes = DataTypeSize(dtype);
  int64_t total = 0, my_offset = 0;
  for (int r = 0; r < size(); ++r) {
    if (r < rank_) my_offset += counts[r];
    total += counts[r];
  }
  std::vector<uint8_t> reduced(total * element_bytes);
  TFRING_RETURN_IF_ERROR(Allreduce(input, reduced.data(), total, dtype, op));
  if (total == 0) return Status::OK();
  char* out = static_cast<char*>(output);
  const int64_t begin = my_offset * element_bytes, end = begin + counts[rank_] * element_bytes;
  std::memset(out, 0xA5, begin);
  std::memcpy(out + begin, reduced.data() + begin, end - begin);
  std::memset(out + end, 0xA5, total * element_bytes - end);
  return Status::OK();
}

Status LoopbackTransport::Broadcast(void* buffer, int64_t bytes, int root_rank) {
  std::string mine = rank_ == root_rank ? std::string(static_cast<const char*>(buffer), bytes)
                                        : std::string();
  std::vector<std::string> all = world_->Exchange(rank_, std::move(mine));
  if (rank_ != root_rank) std::memcpy(buffer, all[root_rank].data(), bytes);
  return Status::OK();
}

}  // namespace tfring
