#include "cc/shm/shm_collectives.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "cc/reduce_kernels.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tfring {
namespace {

constexpr size_t kCacheLine = 64;
// The reduction walks a slice in blocks this big, so every rank's block and
// the result stay in the first-level cache while they are combined.
constexpr size_t kReduceBlockBytes = 16 * 1024;
// Chunks of large operations stay this small even in big slots: a chunk
// and the peers' slices of it then stay in the second-level cache between
// the copy in, the reduction and the copy out (measured: 64 MiB at 2 ranks
// takes about half as long with 512 KiB chunks as with 16 MiB ones).
constexpr size_t kLargestChunkBytes = 512 * 1024;
constexpr int64_t kStreamFromBytes = 16 << 20;
// Marks an exchange message that did not fit.
constexpr uint64_t kOverflow = std::numeric_limits<uint64_t>::max();

// Copies into memory this rank alone reads later (its output) without
// loading the destination's lines first (non-temporal stores): for a large
// output that read is a third of the memory traffic of the copy.
void StreamCopy(char* dst, const char* src, size_t bytes) {
#if defined(__SSE2__)
  if (bytes < 4096) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const size_t head = (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16;
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Orders the streamed stores before whatever tells another thread the
// output is ready.
void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

bool IsSupportedOp(ReduceOp op) {
  return op == ReduceOp::kSum || op == ReduceOp::kMin || op == ReduceOp::kMax ||
         op == ReduceOp::kProduct;
}

}  // namespace

size_t ShmCollectives::SegmentBytes(int size, size_t slot_bytes) {
  if (size < 1) return 0;
  const size_t ranks = static_cast<size_t>(size);
  size_t slots = 0, total = 0;
  // Slot(r) and ExchangeArea(r) point this far in at most, so a segment
  // whose size fits a size_t keeps every pointer inside the mapping.
  if (__builtin_mul_overflow(ranks, slot_bytes, &slots) ||
      __builtin_add_overflow(slots, ShmBarrier::Bytes(size) + 2 * ranks * kExchangeAreaBytes,
                             &total)) {
    return 0;
  }
  return total;
}

Status ShmCollectives::Attach(void* segment, size_t segment_bytes, int rank, int size,
                              size_t slot_bytes, std::vector<int> job_ranks,
                              std::chrono::nanoseconds timeout,
                              std::unique_ptr<ShmCollectives>* collectives) {
  if (size < 1 || rank < 0 || rank >= size || static_cast<int>(job_ranks.size()) != size) {
    return Status::InvalidArgument("shared-memory collectives: rank " + std::to_string(rank) +
                                   " of " + std::to_string(size) + " ranks (" +
                                   std::to_string(job_ranks.size()) + " job ranks named)");
  }
  if (slot_bytes == 0 || slot_bytes % (2 * kCacheLine) != 0) {
    return Status::InvalidArgument("shared-memory collectives: slots of " +
                                   std::to_string(slot_bytes) +
                                   " bytes; they must be a positive multiple of 128");
  }
  if (segment == nullptr || reinterpret_cast<uintptr_t>(segment) % kCacheLine != 0) {
    return Status::InvalidArgument("shared-memory collectives: segment not 64-byte aligned");
  }
  const size_t needed = SegmentBytes(size, slot_bytes);
  if (needed == 0) {
    return Status::InvalidArgument(
        "shared-memory collectives: " + std::to_string(size) + " ranks with slots of " +
        std::to_string(slot_bytes) + " bytes need more bytes than a size_t holds");
  }
  if (segment_bytes < needed) {
    return Status::InvalidArgument(
        "shared-memory collectives: a segment of " + std::to_string(segment_bytes) +
        " bytes is too small for " + std::to_string(size) + " ranks with slots of " +
        std::to_string(slot_bytes) + " bytes (" + std::to_string(needed) + " needed)");
  }
  collectives->reset(new ShmCollectives(static_cast<char*>(segment), rank, size, slot_bytes,
                                        std::move(job_ranks), timeout));
  return Status::OK();
}

ShmCollectives::ShmCollectives(char* segment, int rank, int size, size_t slot_bytes,
                               std::vector<int> job_ranks, std::chrono::nanoseconds timeout)
    : segment_(segment), rank_(rank), size_(size), slot_bytes_(slot_bytes), timeout_(timeout),
      barrier_(segment, rank, size, std::move(job_ranks)), block_(kReduceBlockBytes) {}

char* ShmCollectives::ExchangeArea(uint64_t call, int rank) const {
  const size_t set = static_cast<size_t>(call % 2);
  return segment_ + ShmBarrier::Bytes(size_) + (set * size_ + rank) * kExchangeAreaBytes;
}

char* ShmCollectives::Slot(int rank) const {
  return segment_ + ShmBarrier::Bytes(size_) + 2 * static_cast<size_t>(size_) * kExchangeAreaBytes +
         static_cast<size_t>(rank) * slot_bytes_;
}

int64_t ShmCollectives::ChunkBytes() const {
  return static_cast<int64_t>(std::min(slot_bytes_ / 2, kLargestChunkBytes));
}

int64_t ShmCollectives::SliceStart(int r, int64_t count, int64_t element_bytes) const {
  // Whole cache lines per slice, so no two ranks write one line.
  const int64_t line_elements = std::max<int64_t>(1, kCacheLine / element_bytes);
  const int64_t lines = (count + line_elements - 1) / line_elements;
  return std::min(count, lines * r / size_ * line_elements);
}

void ShmCollectives::ReduceSlice(const std::vector<const char*>& sources,
                                 const std::vector<char*>& results, int64_t count,
                                 DataType dtype, ReduceOp op, double factor, int64_t divisor,
                                 uint64_t streamed) {
  const int64_t element_bytes = DataTypeSize(dtype);
  const int64_t block_elements = static_cast<int64_t>(kReduceBlockBytes) / element_bytes;
  const bool scale = factor != 1.0 || divisor != 1;
  std::vector<const void*> block_sources(sources.size());
  for (int64_t block = 0; block < count; block += block_elements) {
    const int64_t elements = std::min(block_elements, count - block);
    const int64_t offset = block * element_bytes;
    for (size_t q = 0; q < sources.size(); ++q) block_sources[q] = sources[q] + offset;
    ReduceSources(dtype, op, block_sources.data(), static_cast<int>(block_sources.size()),
                  block_.data(), elements);
    if (scale) ScaleCopy(dtype, block_.data(), block_.data(), elements, factor, divisor);
    for (size_t i = 0; i < results.size(); ++i) {
      if (i < 64 && (streamed >> i & 1) != 0) {
        StreamCopy(results[i] + offset, block_.data(), elements * element_bytes);
      } else {
        std::memcpy(results[i] + offset, block_.data(), elements * element_bytes);
      }
    }
  }
}

Status ShmCollectives::Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                                 ReduceOp op) {
  ReduceSpan span;
  span.input = input;
  span.output = output;
  span.count = count;
  return AllreduceSpans({span}, dtype, op);
}

Status ShmCollectives::AllreduceSpans(const std::vector<ReduceSpan>& spans, DataType dtype,
                                      ReduceOp op) {
  if (!IsSupportedOp(op)) {
    return Status::InvalidArgument(std::string("shared-memory allreduce: unsupported op ") +
                                   ReduceOpName(op) + " (Sum, Min, Max or Product)");
  }
  int64_t total = 0;
  for (const ReduceSpan& span : spans) {
    if (span.count < 0 || span.divisor < 1 ||
        (span.count > 0 && (span.input == nullptr || span.output == nullptr))) {
      return Status::InvalidArgument(
          "shared-memory allreduce: a tensor of " + std::to_string(span.count) +
          " elements with a null buffer, a negative count or a divisor below 1 (" +
          std::to_string(span.divisor) + ")");
    }
    total += span.count;
  }
  if (total == 0) return Status::OK();
  return ChunkedAllreduce(spans, dtype, op);
}

namespace {

// The spans of a multi-tensor allreduce laid end to end: element v of the
// whole is element v - start of the span that holds it.
class Concatenation {
 public:
  explicit Concatenation(const std::vector<ReduceSpan>& spans) : spans_(spans) {
    int64_t start = 0;
    for (const ReduceSpan& span : spans_) {
      starts_.push_back(start);
      start += span.count;
    }
    total_ = start;
  }

  int64_t total() const { return total_; }

  // Calls visit(span, first element in the span, elements) for each part of
  // the whole's elements [begin, end), in order.
  template <typename Visit>
  void ForEachPart(int64_t begin, int64_t end, Visit&& visit) const {
    if (begin >= end) return;
    // The last span starting at or before `begin` that holds elements.
    size_t s = std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1;
    for (int64_t at = begin; at < end; ++s) {
      const int64_t from = at - starts_[s];
      if (from >= spans_[s].count) continue;  // an empty span
      const int64_t n = std::min(spans_[s].count - from, end - at);
      visit(spans_[s], from, n);
      at += n;
    }
  }

 private:
  const std::vector<ReduceSpan>& spans_;
  std::vector<int64_t> starts_;
  int64_t total_ = 0;
};

}  // namespace

Status ShmCollectives::ChunkedAllreduce(const std::vector<ReduceSpan>& spans, DataType dtype,
                                        ReduceOp op) {
  const Concatenation whole(spans);
  const int64_t count = whole.total();
  const int64_t element_bytes = DataTypeSize(dtype);
  const int64_t chunk_bytes = ChunkBytes();
  const int64_t chunk_elements = chunk_bytes / element_bytes;
  const int64_t chunks = (count + chunk_elements - 1) / chunk_elements;
  // A separate output is written with streaming stores when the operation
  // is too big to stay in cache anyway.
  const bool big = count * element_bytes >= kStreamFromBytes;
  auto stream = [&](const ReduceSpan& span) { return big && span.input != span.output; };
  auto chunk_area = [&](int q, int64_t chunk) { return Slot(q) + (chunk % 2) * chunk_bytes; };
  // Chunk `chunk`'s slice `q` in elements of the whole: [first, second).
  auto slice = [&](int64_t chunk, int q) {
    const int64_t first = chunk * chunk_elements;
    const int64_t n = std::min(chunk_elements, count - first);
    return std::make_pair(first + SliceStart(q, n, element_bytes),
                          first + SliceStart(q + 1, n, element_bytes));
  };
  // Visits the parts of chunk `chunk`'s slice `q` with the byte offset of
  // each in the chunk's area.
  auto for_each_part = [&](int64_t chunk, int q, auto&& visit) {
    const auto [begin, end] = slice(chunk, q);
    int64_t area_offset = (begin - chunk * chunk_elements) * element_bytes;
    whole.ForEachPart(begin, end, [&](const ReduceSpan& span, int64_t from, int64_t n) {
      visit(span, from * element_bytes, area_offset, n);
      area_offset += n * element_bytes;
    });
  };
  auto copy_in = [&](int64_t chunk) {
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      for_each_part(chunk, q, [&](const ReduceSpan& span, int64_t at, int64_t area, int64_t n) {
        std::memcpy(chunk_area(rank_, chunk) + area, static_cast<const char*>(span.input) + at,
                    n * element_bytes);
      });
    }
  };
  std::vector<const char*> sources(size_);
  std::vector<char*> results(size_);
  auto reduce = [&](int64_t chunk) {
    for_each_part(chunk, rank_, [&](const ReduceSpan& span, int64_t at, int64_t area, int64_t n) {
      results[0] = static_cast<char*>(span.output) + at;
      for (int q = 0, next = 1; q < size_; ++q) {
        sources[q] = q == rank_ ? static_cast<const char*>(span.input) + at : chunk_area(q, chunk) + area;
        if (q != rank_) results[next++] = chunk_area(q, chunk) + area;
      }
      ReduceSlice(sources, results, n, dtype, op, span.factor, span.divisor,
                  stream(span) ? 1 : 0);
    });
  };
  auto copy_out = [&](int64_t chunk) {
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      for_each_part(chunk, q, [&](const ReduceSpan& span, int64_t at, int64_t area, int64_t n) {
        char* to = static_cast<char*>(span.output) + at;
        const char* from = chunk_area(rank_, chunk) + area;
        if (stream(span)) {
          StreamCopy(to, from, n * element_bytes);
        } else {
          std::memcpy(to, from, n * element_bytes);
        }
      });
    }
  };
  for (int64_t chunk = 0; chunk <= chunks; ++chunk) {
    if (chunk < chunks) copy_in(chunk);
    TFRING_RETURN_IF_ERROR(DataBarrier("allreduce"));
    if (chunk < chunks) reduce(chunk);
    if (chunk > 0) copy_out(chunk - 1);
  }
  if (big) StreamFence();
  return Status::OK();
}

Status ShmCollectives::ReduceScatter(const void* input, void* output,
                                     const std::vector<int64_t>& counts, DataType dtype,
                                     ReduceOp op) {
  if (!IsSupportedOp(op)) {
    return Status::InvalidArgument(std::string("shared-memory reduce-scatter: unsupported op ") +
                                   ReduceOpName(op) + " (Sum, Min, Max or Product)");
  }
  if (static_cast<int>(counts.size()) != size_) {
    return Status::InvalidArgument("shared-memory reduce-scatter: " +
                                   std::to_string(counts.size()) + " counts for " +
                                   std::to_string(size_) + " ranks");
  }
  std::vector<int64_t> starts(size_);
  int64_t total = 0;
  for (int q = 0; q < size_; ++q) {
    if (counts[q] < 0) {
      return Status::InvalidArgument("shared-memory reduce-scatter: a count of " +
                                     std::to_string(counts[q]) + " for rank " +
                                     std::to_string(q));
    }
    starts[q] = total;
    total += counts[q];
  }
  if (total == 0) return Status::OK();
  if (input == nullptr || output == nullptr) {
    return Status::InvalidArgument("shared-memory reduce-scatter: a null buffer for " +
                                   std::to_string(total) + " elements");
  }
  const int64_t element_bytes = DataTypeSize(dtype);
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  const int64_t mine = starts[rank_] * element_bytes;
  if (size_ == 1) {
    if (in != out) std::memcpy(out, in, counts[0] * element_bytes);
    return Status::OK();
  }
  // One piece per other rank in a chunk area, whole cache lines where they
  // hold one.
  const int64_t line_elements = std::max<int64_t>(1, kCacheLine / element_bytes);
  int64_t piece = ChunkBytes() / element_bytes / (size_ - 1);
  if (piece >= line_elements) piece = piece / line_elements * line_elements;
  if (piece > 0) return PiecewiseReduceScatter(in, out, counts, starts, piece, dtype, op);
  // Slots too small for an element per rank (a few hundred bytes among many
  // ranks; ShmTransport's are never that small): the whole allreduce into
  // scratch, then this rank's slice. Every rank decides alike.
  std::vector<char> whole(total * element_bytes);
  TFRING_RETURN_IF_ERROR(Allreduce(input, whole.data(), total, dtype, op));
  std::memcpy(out + mine, whole.data() + mine, counts[rank_] * element_bytes);
  return Status::OK();
}

Status ShmCollectives::PiecewiseReduceScatter(const char* input, char* output,
                                              const std::vector<int64_t>& counts,
                                              const std::vector<int64_t>& starts, int64_t piece,
                                              DataType dtype, ReduceOp op) {
  const int64_t element_bytes = DataTypeSize(dtype);
  const int64_t piece_bytes = piece * element_bytes;
  const int64_t chunk_bytes = ChunkBytes();
  const int64_t longest = *std::max_element(counts.begin(), counts.end());
  const int64_t rounds = (longest + piece - 1) / piece;
  // This rank's output is read by no other: streamed when too big for the
  // cache anyway (as Allreduce does).
  const bool stream = counts[rank_] * element_bytes >= kStreamFromBytes && input != output;
  // Where rank `from` puts round `round`'s piece of rank `to`'s slice: its
  // slot's chunk area round % 2, the pieces of the other ranks in rank order.
  auto piece_area = [&](int from, int to, int64_t round) {
    const int index = to < from ? to : to - 1;
    return Slot(from) + (round % 2) * chunk_bytes + index * piece_bytes;
  };
  // Round `round`'s piece of rank q's slice: its first element in the whole
  // and its length (0 once the slice is done).
  auto piece_of = [&](int q, int64_t round) {
    const int64_t from = round * piece;
    return std::make_pair(starts[q] + from,
                          std::max<int64_t>(0, std::min(piece, counts[q] - from)));
  };
  std::vector<const char*> sources(size_);
  std::vector<char*> result(1);
  for (int64_t round = 0; round < rounds; ++round) {
    for (int q = 0; q < size_; ++q) {
      const auto [first, n] = piece_of(q, round);
      if (q == rank_ || n == 0) continue;
      std::memcpy(piece_area(rank_, q, round), input + first * element_bytes, n * element_bytes);
    }
    // Round r's areas are written again in round r + 2, after the next
    // barrier, which every rank reaches only once done reading them.
    TFRING_RETURN_IF_ERROR(DataBarrier("reduce-scatter"));
    const auto [first, n] = piece_of(rank_, round);
    if (n == 0) continue;
    for (int q = 0; q < size_; ++q) {
      sources[q] = q == rank_ ? input + first * element_bytes : piece_area(q, rank_, round);
    }
    result[0] = output + first * element_bytes;
    ReduceSlice(sources, result, n, dtype, op, 1.0, 1, stream ? 1 : 0);
  }
  if (stream) StreamFence();
  // The next operation writes the slots only once every rank has read them.
  return DataBarrier("reduce-scatter");
}

Status ShmCollectives::Broadcast(void* buffer, int64_t bytes, int root) {
  if (root < 0 || root >= size_) {
    return Status::InvalidArgument("shared-memory broadcast: root " + std::to_string(root) +
                                   " of " + std::to_string(size_) + " ranks");
  }
  if (bytes <= 0) return Status::OK();
  char* data = static_cast<char*>(buffer);
  const int64_t chunk_bytes = ChunkBytes();
  // The root writes chunk c into chunk area c % 2 of its slot; the others
  // copy it out after the barrier. Writing chunk c + 2 into the same area
  // comes after the next barrier, which the readers of chunk c reach only
  // when done.
  for (int64_t offset = 0, chunk = 0; offset < bytes; offset += chunk_bytes, ++chunk) {
    const int64_t n = std::min(chunk_bytes, bytes - offset);
    char* area = Slot(root) + (chunk % 2) * chunk_bytes;
    if (rank_ == root) std::memcpy(area, data + offset, n);
    TFRING_RETURN_IF_ERROR(DataBarrier("broadcast"));
    if (rank_ != root) std::memcpy(data + offset, area, n);
  }
  // Nobody reads the root's slot once this returns.
  return DataBarrier("broadcast");
}

Status ShmCollectives::Allgatherv(const void* input, void* output,
                                  const std::vector<int64_t>& bytes_per_rank) {
  if (static_cast<int>(bytes_per_rank.size()) != size_) {
    return Status::InvalidArgument("shared-memory allgather: " +
                                   std::to_string(bytes_per_rank.size()) + " sizes for " +
                                   std::to_string(size_) + " ranks");
  }
  std::vector<int64_t> offsets(size_, 0);
  int64_t largest = 0;
  for (int q = 0; q < size_; ++q) {
    if (q > 0) offsets[q] = offsets[q - 1] + bytes_per_rank[q - 1];
    largest = std::max(largest, bytes_per_rank[q]);
  }
  if (largest == 0) return Status::OK();
  char* out = static_cast<char*>(output);
  const char* mine = input == nullptr ? out + offsets[rank_] : static_cast<const char*>(input);
  if (input != nullptr && bytes_per_rank[rank_] > 0) {
    std::memmove(out + offsets[rank_], mine, bytes_per_rank[rank_]);
    mine = out + offsets[rank_];
  }
  const int64_t chunk_bytes = ChunkBytes();
  // Round j: every rank puts bytes [j * chunk, (j + 1) * chunk) of its part
  // into chunk area j % 2 of its slot; after the barrier each copies the
  // others'.
  for (int64_t offset = 0, round = 0; offset < largest; offset += chunk_bytes, ++round) {
    const int64_t own = std::max<int64_t>(0, std::min(chunk_bytes, bytes_per_rank[rank_] - offset));
    if (own > 0) std::memcpy(Slot(rank_) + (round % 2) * chunk_bytes, mine + offset, own);
    TFRING_RETURN_IF_ERROR(DataBarrier("allgather"));
    for (int q = 0; q < size_; ++q) {
      const int64_t n = std::max<int64_t>(0, std::min(chunk_bytes, bytes_per_rank[q] - offset));
      if (q == rank_ || n == 0) continue;
      std::memcpy(out + offsets[q] + offset, Slot(q) + (round % 2) * chunk_bytes, n);
    }
  }
  return DataBarrier("allgather");
}

Status ShmCollectives::Exchange(const void* data, size_t bytes,
                                std::vector<std::pair<const char*, size_t>>* views, bool* fits) {
  const uint64_t call = exchanges_++;
  char* area = ExchangeArea(call, rank_);
  const uint64_t length = bytes <= kExchangeCapacity ? bytes : kOverflow;
  std::memcpy(area, &length, sizeof(length));
  if (length != kOverflow && bytes > 0) std::memcpy(area + kCacheLine, data, bytes);
  TFRING_RETURN_IF_ERROR(barrier_.WaitCallingPeers("negotiation step"));
  views->assign(size_, {nullptr, 0});
  *fits = true;
  for (int q = 0; q < size_; ++q) {
    const char* other = ExchangeArea(call, q);
    uint64_t other_length;
    std::memcpy(&other_length, other, sizeof(other_length));
    if (other_length == kOverflow) {
      *fits = false;
      continue;
    }
    // The peer wrote at most kExchangeCapacity bytes; anything else is a
    // torn or stale word, and reading that far would leave its area.
    if (other_length > kExchangeCapacity) {
      views->assign(size_, {nullptr, 0});
      *fits = false;
      return Status::Aborted(
          "tfring: " + barrier_.Describe({q}) + "'s message in the shared-memory exchange " +
          "claims " + std::to_string(other_length) + " bytes, more than the " +
          std::to_string(kExchangeCapacity) + " its area holds (a torn or stale write to the "
          "segment, which only this job's processes can write: a rank that overwrote memory "
          "or a crashed one). The ranks can no longer agree; restart the job.");
    }
    (*views)[q] = {other + kCacheLine, static_cast<size_t>(other_length)};
  }
  return Status::OK();
}

}  // namespace tfring
