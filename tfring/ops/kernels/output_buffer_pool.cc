#include "tfring/ops/kernels/output_buffer_pool.h"

#include <algorithm>
#include <cstdlib>

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

}  // namespace

OutputBufferPool* OutputBufferPool::Get() {
  static OutputBufferPool* pool =
      new OutputBufferPool(static_cast<size_t>(Config::Get().output_pool_bytes));
  return pool;
}

OutputBufferPool::OutputBufferPool(size_t max_free_bytes) : max_free_bytes_(max_free_bytes) {}

void* OutputBufferPool::AllocateRaw(size_t alignment, size_t num_bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_by_size_.find(num_bytes);
    if (it != free_by_size_.end()) {
      void* reused = it->second;
      free_by_size_.erase(it);
      free_bytes_ -= num_bytes;
      return reused;
    }
  }
  void* fresh = nullptr;
  const bool huge = num_bytes >= kHugePageBytes;
  const size_t aligned_to = huge ? kHugePageBytes : std::max(alignment, kAlignment);
  if (posix_memalign(&fresh, aligned_to, std::max<size_t>(num_bytes, 1)) != 0) return nullptr;
  if (huge) madvise(fresh, num_bytes, MADV_HUGEPAGE);
  std::lock_guard<std::mutex> lock(mutex_);
  size_of_[fresh] = num_bytes;
  return fresh;
}

void OutputBufferPool::DeallocateRaw(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = size_of_.find(ptr);
  const size_t num_bytes = it->second;
  if (free_bytes_ + num_bytes <= max_free_bytes_) {
    free_by_size_.emplace(num_bytes, ptr);
    free_bytes_ += num_bytes;
    return;
  }
  size_of_.erase(it);
  std::free(ptr);
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
