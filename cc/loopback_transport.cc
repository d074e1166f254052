#include "cc/loopback_transport.h"

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

Status LoopbackTransport::AllgatherInt64(int64_t local, std::vector<int64_t>* all) {
  std::string mine(reinterpret_cast<const char*>(&local), sizeof(local));
  all->clear();
  for (const std::string& theirs : world_->Exchange(rank_, mine)) {
    int64_t value;
    std::memcpy(&value, theirs.data(), sizeof(value));
    all->push_back(value);
  }
  return Status::OK();
}

Status LoopbackTransport::Allgatherv(const void* input, int64_t input_bytes, void* output,
                                     const std::vector<int64_t>& bytes_per_rank) {
  std::vector<std::string> all =
      world_->Exchange(rank_, std::string(static_cast<const char*>(input), input_bytes));
  char* cursor = static_cast<char*>(output);
  for (size_t r = 0; r < all.size(); ++r) {
    if (static_cast<int64_t>(all[r].size()) != bytes_per_rank[r]) {
      return Status::Internal("loopback: allgather sizes disagree");
    }
    std::memcpy(cursor, all[r].data(), all[r].size());
    cursor += all[r].size();
  }
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
