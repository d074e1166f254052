#include "cc/shm_collectives.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "cc/reduce_kernels.h"
#include "cc/shared_heap_info.h"

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
// The direct path writes separate outputs with streaming stores from this
// size (measured: the held ResNet-50 set 18 ms instead of 23 ms; no gain
// from 256 KiB).
constexpr int64_t kDirectStreamFromBytes = 1 << 20;
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
  return ShmBarrier::Bytes(size) + 2 * static_cast<size_t>(size) * kExchangeAreaBytes +
         static_cast<size_t>(size) * (kSpanTableBytes + slot_bytes);
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

char* ShmCollectives::SpanTable(int rank) const {
  return segment_ + ShmBarrier::Bytes(size_) + 2 * static_cast<size_t>(size_) * kExchangeAreaBytes +
         static_cast<size_t>(rank) * kSpanTableBytes;
}

char* ShmCollectives::Slot(int rank) const {
  return SpanTable(size_) + static_cast<size_t>(rank) * slot_bytes_;
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
  if (!UsesHeaps()) return ChunkedAllreduce(spans, dtype, op);
  std::vector<ReduceSpan> staged;
  TFRING_RETURN_IF_ERROR(DirectAllreduce(spans, dtype, op, &staged));
  return staged.empty() ? Status::OK() : ChunkedAllreduce(staged, dtype, op);
}

Status ShmCollectives::ShareHeapOffsets(const std::vector<int64_t>& words, const char* what) {
  if (!words.empty()) {
    std::memcpy(SpanTable(rank_) + kCacheLine, words.data(), words.size() * sizeof(int64_t));
  }
  return DataBarrier(what);
}

int64_t ShmCollectives::PeerWord(int rank, size_t index) const {
  int64_t value;
  std::memcpy(&value, SpanTable(rank) + kCacheLine + index * sizeof(int64_t), sizeof(value));
  return value;
}

int64_t ShmCollectives::HeapOffset(const void* pointer, int64_t bytes) const {
  const HeapView& own = heaps_[rank_];
  const uintptr_t at = reinterpret_cast<uintptr_t>(pointer);
  const uintptr_t base = reinterpret_cast<uintptr_t>(own.data);
  if (at < base || at - base > own.capacity ||
      own.capacity - (at - base) < static_cast<uint64_t>(bytes)) {
    return -1;
  }
  return static_cast<int64_t>(at - base);
}

Status ShmCollectives::DirectAllreduce(const std::vector<ReduceSpan>& spans, DataType dtype,
                                       ReduceOp op, std::vector<ReduceSpan>* staged) {
  const int64_t element_bytes = DataTypeSize(dtype);
  auto big_enough = [&](const ReduceSpan& span) {
    return span.count * element_bytes >= static_cast<int64_t>(kSharedHeapSmallestBytes);
  };
  // Only spans of heap size can lie in the heaps; every rank sees the same
  // sizes, so every rank skips the table together.
  if (std::none_of(spans.begin(), spans.end(), big_enough)) {
    *staged = spans;
    return Status::OK();
  }
  // This rank's table: per span (as many as fit) the heap offsets of its
  // input and output (-1: not in the heap).
  constexpr size_t kEntryWords = 2;
  const size_t capacity = (kSpanTableBytes - kCacheLine) / (kEntryWords * sizeof(int64_t));
  const size_t entries = std::min(spans.size(), capacity);
  std::vector<int64_t> words(kEntryWords * entries, -1);
  for (size_t s = 0; s < entries; ++s) {
    const ReduceSpan& span = spans[s];
    if (!big_enough(span)) continue;
    const int64_t bytes = span.count * element_bytes;
    const int64_t input = HeapOffset(span.input, bytes);
    const int64_t output = HeapOffset(span.output, bytes);
    if (input < 0 || output < 0) continue;
    words[kEntryWords * s] = input;
    words[kEntryWords * s + 1] = output;
  }
  TFRING_RETURN_IF_ERROR(ShareHeapOffsets(words, "allreduce"));
  auto entry = [&](int q, size_t s, size_t word) { return PeerWord(q, kEntryWords * s + word); };
  std::vector<const char*> sources(size_);
  std::vector<char*> results(size_);
  bool any_direct = false;
  for (size_t s = 0; s < spans.size(); ++s) {
    const ReduceSpan& span = spans[s];
    bool direct = s < entries;
    for (int q = 0; q < size_ && direct; ++q) direct = entry(q, s, 0) >= 0 && entry(q, s, 1) >= 0;
    if (!direct) {
      staged->push_back(span);
      continue;
    }
    any_direct = true;
    direct_collectives_.fetch_add(1, std::memory_order_relaxed);
    const int64_t begin = SliceStart(rank_, span.count, element_bytes);
    const int64_t end = SliceStart(rank_ + 1, span.count, element_bytes);
    if (begin == end) continue;
    const int64_t at = begin * element_bytes;
    // Outputs that differ from their inputs are written with streaming
    // stores: their owner reads them later, after other work, and loading
    // their lines first would add a third to the traffic.
    const bool big = span.count * element_bytes >= kDirectStreamFromBytes;
    uint64_t streamed = 0;
    for (int q = 0; q < size_; ++q) {
      const int64_t input = entry(q, s, 0);
      const int64_t output = entry(q, s, 1);
      sources[q] = heaps_[q].data + input + at;
      results[q] = heaps_[q].data + output + at;
      if (big && input != output && q < 64) streamed |= uint64_t{1} << q;
    }
    ReduceSlice(sources, results, end - begin, dtype, op, span.factor, span.divisor, streamed);
  }
  if (!any_direct) return Status::OK();
  StreamFence();
  // The slot path's first barrier, when there is one, comes after this
  // rank's slices too.
  if (!staged->empty()) return Status::OK();
  return DataBarrier("allreduce");
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

Status ShmCollectives::Broadcast(void* buffer, int64_t bytes, int root) {
  if (root < 0 || root >= size_) {
    return Status::InvalidArgument("shared-memory broadcast: root " + std::to_string(root) +
                                   " of " + std::to_string(size_) + " ranks");
  }
  if (bytes <= 0) return Status::OK();
  char* data = static_cast<char*>(buffer);
  if (UsesHeaps() && bytes >= static_cast<int64_t>(kSharedHeapSmallestBytes)) {
    // Direct when the root's buffer lies in its heap: the others copy it
    // from there, then all meet so that it stays until they have.
    TFRING_RETURN_IF_ERROR(ShareHeapOffsets({HeapOffset(buffer, bytes)}, "broadcast"));
    const int64_t source = PeerWord(root, 0);
    if (source >= 0) {
      if (rank_ != root) std::memcpy(data, heaps_[root].data + source, bytes);
      direct_collectives_.fetch_add(1, std::memory_order_relaxed);
      return DataBarrier("broadcast");
    }
  }
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
  if (UsesHeaps() && largest >= static_cast<int64_t>(kSharedHeapSmallestBytes)) {
    // Direct when every rank's part lies in its heap: each copies the
    // others' parts from where they are, then all meet so that the parts
    // stay until everyone has.
    TFRING_RETURN_IF_ERROR(ShareHeapOffsets(
        {bytes_per_rank[rank_] > 0 ? HeapOffset(mine, bytes_per_rank[rank_]) : 0}, "allgather"));
    bool direct = true;
    for (int q = 0; q < size_; ++q) direct = direct && PeerWord(q, 0) >= 0;
    if (direct) {
      for (int q = 0; q < size_; ++q) {
        if (q == rank_ || bytes_per_rank[q] == 0) continue;
        std::memcpy(out + offsets[q], heaps_[q].data + PeerWord(q, 0), bytes_per_rank[q]);
      }
      direct_collectives_.fetch_add(1, std::memory_order_relaxed);
      return DataBarrier("allgather");
    }
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
    (*views)[q] = {other + kCacheLine, static_cast<size_t>(other_length)};
  }
  return Status::OK();
}

}  // namespace tfring
