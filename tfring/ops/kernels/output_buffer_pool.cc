#include "tfring/ops/kernels/output_buffer_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include <sys/mman.h>

#include "cc/config.h"

namespace tfring {
namespace tf_ops {
namespace {

// Below this size a fresh allocation is cheap (and likely served from the
// malloc heap rather than new pages), so pooling would only hold memory.
constexpr size_t kMinPooledBytes = 256 * 1024;
constexpr size_t kAlignment = 64;
// Buffers this large are aligned to, and backed by, 2 MiB transparent huge
// pages where the kernel offers them on request (madvise mode, the common
// default): fewer TLB misses while MPI streams through them, as NumPy does for
// its own large arrays.
constexpr size_t kHugePageBytes = 2 * 1024 * 1024;
// Bounds of the cache's idle limit, in allocations plus frees. The upper one
// never cuts a steady loop that fits in the byte bound: such a loop has at
// most max_free_bytes / kMinPooledBytes buffers and reuses each within about
// twice that many calls.
constexpr uint64_t kMinIdleCalls = 64;

uint64_t MaxIdleCalls(size_t max_free_bytes) {
  return std::max<uint64_t>(kMinIdleCalls, 2 * (max_free_bytes / kMinPooledBytes));
}

}  // namespace

OutputBufferPool* OutputBufferPool::Get() {
  static OutputBufferPool* pool =
      new OutputBufferPool(static_cast<size_t>(Config::Get().output_pool_bytes));
  return pool;
}

OutputBufferPool::OutputBufferPool(size_t max_free_bytes)
    : free_buffers_(max_free_bytes, kMinIdleCalls, MaxIdleCalls(max_free_bytes)) {}

void OutputBufferPool::Release(const std::vector<FreeBufferCache::Buffer>& buffers) {
  for (const FreeBufferCache::Buffer& buffer : buffers) std::free(buffer.ptr);
}

void* OutputBufferPool::AllocateRaw(size_t alignment, size_t num_bytes) {
  // Cached buffers are at least kAlignment-aligned, which covers TensorFlow's
  // 64-byte requests; a stricter request gets a fresh buffer.
  if (alignment <= kAlignment) {
    std::vector<FreeBufferCache::Buffer> released;
    FreeBufferCache::Buffer reused;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reused = free_buffers_.Take(num_bytes, &released);
      for (const FreeBufferCache::Buffer& buffer : released) capacity_of_.erase(buffer.ptr);
    }
    Release(released);
    if (reused.ptr != nullptr) return reused.ptr;
  }
  void* fresh = nullptr;
  const bool huge = num_bytes >= kHugePageBytes;
  const size_t aligned_to = huge ? kHugePageBytes : std::max(alignment, kAlignment);
  if (posix_memalign(&fresh, aligned_to, std::max<size_t>(num_bytes, 1)) != 0) return nullptr;
  if (huge) madvise(fresh, num_bytes, MADV_HUGEPAGE);
  std::lock_guard<std::mutex> lock(mutex_);
  capacity_of_[fresh] = num_bytes;
  return fresh;
}

void OutputBufferPool::DeallocateRaw(void* ptr) {
  std::vector<FreeBufferCache::Buffer> released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_buffers_.Put({ptr, capacity_of_.at(ptr)}, &released);
    for (const FreeBufferCache::Buffer& buffer : released) capacity_of_.erase(buffer.ptr);
  }
  Release(released);
}

absl::Status AllocatePooledOutput(tensorflow::OpKernelContext* context, int output_index,
                                  const tensorflow::TensorShape& shape,
                                  tensorflow::Tensor** output) {
  const tensorflow::DataType dtype = context->expected_output_dtype(output_index);
  const size_t num_bytes = shape.num_elements() * tensorflow::DataTypeSize(dtype);
  if (num_bytes < kMinPooledBytes || Config::Get().output_pool_bytes == 0) {
    return context->allocate_output(output_index, shape, output);
  }
  tensorflow::Tensor pooled(OutputBufferPool::Get(), dtype, shape);
  if (!pooled.IsInitialized()) {
    return absl::ResourceExhaustedError("tfring: could not allocate " +
                                        std::to_string(num_bytes) + " bytes for an output");
  }
  context->set_output(output_index, std::move(pooled));
  *output = context->mutable_output(output_index);
  return absl::OkStatus();
}

absl::Status ForwardOrAllocateOutput(tensorflow::OpKernelContext* context, int input_index,
                                     int output_index, const tensorflow::TensorShape& shape,
                                     tensorflow::Tensor** output) {
  if (context->forward_input_to_output_with_shape(input_index, output_index, shape, output)) {
    return absl::OkStatus();
  }
  return AllocatePooledOutput(context, output_index, shape, output);
}

}  // namespace tf_ops
}  // namespace tfring
