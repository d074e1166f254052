#include "cc/transport/shm_transport.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <sstream>
#include <utility>

#include "cc/logging.h"

namespace tfring {
namespace {

constexpr size_t kSmallestSlot = 128 * 1024;
constexpr size_t kSlotGranularity = 4096;

// What makes two ranks able to share a segment: the same host name and the
// same /dev/shm (containers or network namespaces on one machine may differ
// in either).
std::string HostIdentity() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  struct stat shm_directory;
  const unsigned long long device =
      stat("/dev/shm", &shm_directory) == 0 ? static_cast<unsigned long long>(shm_directory.st_dev)
                                            : 0ull;
  return std::string(name) + "|" + std::to_string(device);
}

std::string FreshSegmentName() {
  std::random_device random;
  std::ostringstream name;
  name << "/tfring-" << getpid() << "-" << std::hex << random() << random();
  return name.str();
}

// TFRING_SHM_BYTES rounded up to whole pages, at least kSmallestSlot. The
// configuration keeps the setting within kLargestShmBytes; a value beyond
// it (a Config built by hand) is clamped there rather than rounded past the
// end of size_t.
size_t SlotBytes(const Config& config) {
  const size_t wanted = static_cast<size_t>(
      std::min<int64_t>(std::max<int64_t>(config.shm_bytes, 0), kLargestShmBytes));
  const size_t rounded = (wanted + kSlotGranularity - 1) / kSlotGranularity * kSlotGranularity;
  return std::max(kSmallestSlot, rounded);
}

}  // namespace

Status ShmTransport::Connect(Transport* inner, std::unique_ptr<Transport> owned,
                             const Config& config, const std::vector<int>& job_ranks,
                             std::unique_ptr<Transport>* transport) {
  *transport = std::move(owned);  // the answer unless every step below succeeds
  const int size = inner->size();
  const int rank = inner->rank();
  if (config.shm == 0 || size < 2) return Status::OK();

  std::vector<std::string> identities;
  TFRING_RETURN_IF_ERROR(inner->GatherToRoot(HostIdentity(), &identities));
  // Rank 0 decides and, if the ranks share a host, creates the segment:
  // "+<name>" to go ahead, "-<why not>" otherwise.
  const size_t slot_bytes = SlotBytes(config);
  const size_t segment_bytes = ShmCollectives::SegmentBytes(size, slot_bytes);
  if (segment_bytes == 0) {
    // Every rank computes the same from the job's configuration, so every
    // rank leaves here and none waits in the gather below.
    if (rank == 0) {
      TFRING_LOG(kWarning, "shared memory is not used, the ranks on this host talk through MPI: "
                           "a segment for " << size << " ranks with slots of " << slot_bytes
                               << " bytes is larger than this machine can address. Lower "
                                  "TFRING_SHM_BYTES.");
    }
    return Status::OK();
  }
  std::unique_ptr<ShmSegment> segment;
  std::string verdict;
  if (rank == 0) {
    const bool one_host = std::all_of(identities.begin(), identities.end(),
                                      [&](const std::string& id) { return id == identities[0]; });
    if (!one_host) {
      verdict = "-the ranks span several hosts";
    } else {
      const std::string name = FreshSegmentName();
      const Status created = ShmSegment::Create(name, segment_bytes, &segment);
      verdict = created.ok() ? "+" + name : "-" + created.message();
    }
  }
  TFRING_RETURN_IF_ERROR(inner->BroadcastFromRoot(&verdict));
  if (verdict.empty() || verdict[0] != '+') {
    if (rank == 0 && verdict != "-the ranks span several hosts") {
      TFRING_LOG(kWarning, "shared memory is not used, the ranks on this host talk through MPI "
                           "(slower): "
                               << verdict.substr(1)
                               << ". Give /dev/shm more room (docker run --shm-size=1g), or "
                                  "lower TFRING_SHM_BYTES (now "
                               << slot_bytes
                               << " per rank), or set TFRING_SHM=0 to silence this warning.");
    }
    return Status::OK();
  }
  Status opened;
  if (rank != 0) opened = ShmSegment::Open(verdict.substr(1), segment_bytes, &segment);
  std::unique_ptr<ShmCollectives> shm;
  if (opened.ok()) {
    opened = ShmCollectives::Attach(
        segment->data(), segment->size(), rank, size, slot_bytes, job_ranks,
        std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::duration<double>(config.shm_timeout_s)),
        &shm);
  }
  if (!opened.ok()) {
    TFRING_LOG(kWarning, "shared memory is not used, the ranks on this host talk through MPI: "
                             << opened.message());
  }
  std::vector<uint64_t> all_opened{opened.ok() ? ~0ull : 0ull};
  TFRING_RETURN_IF_ERROR(inner->BitwiseAndAllreduce(&all_opened));
  // Every rank has mapped the segment (or given up): its name can go.
  if (rank == 0) segment->Unlink();
  if (all_opened[0] == 0) return Status::OK();
  transport->reset(new ShmTransport(inner, std::move(*transport), std::move(segment),
                                    std::move(shm)));
  return Status::OK();
}

Status ShmTransport::ExchangeWords(const void* data, size_t bytes,
                                   std::vector<const char*>* messages) {
  std::vector<std::pair<const char*, size_t>> views;
  bool fits = false;
  TFRING_RETURN_IF_ERROR(shm_->Exchange(data, bytes, &views, &fits));
  messages->clear();
  for (const auto& [message, length] : views) {
    if (length != bytes) {
      return Status::Aborted("tfring: the ranks exchanged negotiation words of different "
                             "lengths (" + std::to_string(length) + " and " +
                             std::to_string(bytes) +
                             " bytes); the ranks no longer make matching calls");
    }
    messages->push_back(message);
  }
  return Status::OK();
}

Status ShmTransport::BitwiseAndAllreduce(std::vector<uint64_t>* words) {
  const size_t bytes = words->size() * sizeof(uint64_t);
  if (bytes > ShmCollectives::kExchangeCapacity) return inner_->BitwiseAndAllreduce(words);
  std::vector<const char*> messages;
  TFRING_RETURN_IF_ERROR(ExchangeWords(words->data(), bytes, &messages));
  for (const char* data : messages) {
    for (size_t i = 0; i < words->size(); ++i) {
      uint64_t word;
      std::memcpy(&word, data + i * sizeof(uint64_t), sizeof(word));
      (*words)[i] &= word;
    }
  }
  return Status::OK();
}

Status ShmTransport::GatherToRoot(const std::string& local, std::vector<std::string>* gathered) {
  std::vector<std::pair<const char*, size_t>> views;
  bool fits = false;
  TFRING_RETURN_IF_ERROR(shm_->Exchange(local.data(), local.size(), &views, &fits));
  if (!fits) return inner_->GatherToRoot(local, gathered);
  if (rank() != 0) return Status::OK();
  gathered->clear();
  for (const auto& [data, length] : views) gathered->emplace_back(data, length);
  return Status::OK();
}

Status ShmTransport::BroadcastFromRoot(std::string* bytes) {
  std::vector<std::pair<const char*, size_t>> views;
  bool fits = false;
  const bool root = rank() == 0;
  TFRING_RETURN_IF_ERROR(
      shm_->Exchange(root ? bytes->data() : nullptr, root ? bytes->size() : 0, &views, &fits));
  if (!fits) return inner_->BroadcastFromRoot(bytes);
  if (!root) bytes->assign(views[0].first, views[0].second);
  return Status::OK();
}

Status ShmTransport::AllgatherInt64s(const std::vector<int64_t>& local,
                                     std::vector<int64_t>* all) {
  const size_t bytes = local.size() * sizeof(int64_t);
  if (bytes > ShmCollectives::kExchangeCapacity) return inner_->AllgatherInt64s(local, all);
  std::vector<const char*> messages;
  TFRING_RETURN_IF_ERROR(ExchangeWords(local.data(), bytes, &messages));
  all->resize(local.size() * messages.size());
  for (size_t q = 0; q < messages.size(); ++q) {
    if (bytes > 0) std::memcpy(all->data() + q * local.size(), messages[q], bytes);
  }
  return Status::OK();
}

Status ShmTransport::Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                               ReduceOp op) {
  return shm_->Allreduce(input, output, count, dtype, op);
}

Status ShmTransport::AllreduceSpans(const std::vector<ReduceSpan>& spans, DataType dtype,
                                    ReduceOp op) {
  return shm_->AllreduceSpans(spans, dtype, op);
}

Status ShmTransport::Allgatherv(const void* input, int64_t input_bytes, void* output,
                                const std::vector<int64_t>& bytes_per_rank) {
  (void)input_bytes;  // bytes_per_rank[rank()] says the same
  return shm_->Allgatherv(input, output, bytes_per_rank);
}

Status ShmTransport::Broadcast(void* buffer, int64_t bytes, int root_rank) {
  return shm_->Broadcast(buffer, bytes, root_rank);
}

Status ShmTransport::Alltoallv(const void* input, const std::vector<int64_t>& send_bytes,
                               void* output, const std::vector<int64_t>& recv_bytes) {
  return inner_->Alltoallv(input, send_bytes, output, recv_bytes);
}

Status ShmTransport::ReduceScatter(const void* input, void* output,
                                   const std::vector<int64_t>& counts, DataType dtype,
                                   ReduceOp op) {
  return inner_->ReduceScatter(input, output, counts, dtype, op);
}

Status ShmTransport::ReduceScatterAtOffsets(const void* input, void* output,
                                            const std::vector<int64_t>& counts, DataType dtype,
                                            ReduceOp op) {
  return shm_->ReduceScatter(input, output, counts, dtype, op);
}

bool ShmTransport::WatchRoundCalls(std::function<void()> on_call) {
  StopWatchingRoundCalls();
  stop_watching_ = false;
  watcher_ = std::thread([this, on_call = std::move(on_call)] {
    uint32_t seen = shm_->RoundCalls();
    while (!stop_watching_.load()) {
      // The limit only bounds how long a stop request can go unnoticed if
      // its wake-up is missed.
      shm_->WaitForRoundCall(seen, std::chrono::milliseconds(100));
      const uint32_t now = shm_->RoundCalls();
      if (now != seen && !stop_watching_.load()) on_call();
      seen = now;
    }
  });
  return true;
}

void ShmTransport::StopWatchingRoundCalls() {
  if (!watcher_.joinable()) return;
  stop_watching_ = true;
  shm_->CallRound();  // wakes this watcher (and, harmlessly, the peers')
  watcher_.join();
}

}  // namespace tfring
