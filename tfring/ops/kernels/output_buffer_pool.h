// OutputBufferPool: a TensorFlow allocator for the outputs of collectives
// that keeps freed buffers for reuse.
//
// Why: a training step allocates the same large outputs every step. Fresh
// large allocations come straight from the kernel as untouched pages, and
// the first write into them (inside MPI) pays a page fault per 4 KiB page --
// measurably slower than the reduction itself for tens of MiB. Reusing a
// buffer of the same size from the previous step avoids that. Which freed
// buffers are kept, and for how long, is FreeBufferCache's policy: at most
// TFRING_OUTPUT_POOL_BYTES, least recently freed evicted first, and buffers
// not asked for again released after a while.
#ifndef TFRING_OPS_KERNELS_OUTPUT_BUFFER_POOL_H_
#define TFRING_OPS_KERNELS_OUTPUT_BUFFER_POOL_H_

#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tfring/ops/kernels/free_buffer_cache.h"

namespace tfring {
namespace tf_ops {

class OutputBufferPool : public tensorflow::Allocator {
 public:
  // The process-wide pool (never destroyed: tensors may outlive any scope).
  static OutputBufferPool* Get();

  std::string Name() override { return "tfring_output_pool"; }
  void* AllocateRaw(size_t alignment, size_t num_bytes) override;
  void DeallocateRaw(void* ptr) override;

 private:
  explicit OutputBufferPool(size_t max_free_bytes);

  // Frees what the cache hands back, after the lock is dropped.
  static void Release(const std::vector<FreeBufferCache::Buffer>& buffers);

  std::mutex mutex_;
  // The capacity of every live or cached buffer: a reused buffer may be
  // larger than the request it now serves.
  std::unordered_map<void*, size_t> capacity_of_;
  FreeBufferCache free_buffers_;
};

// Output `index` of `context` with `shape`: the input buffer when TensorFlow
// allows forwarding it (the reduction then runs in place), else a pooled
// buffer for large outputs, else TensorFlow's own allocation.
absl::Status ForwardOrAllocateOutput(tensorflow::OpKernelContext* context, int input_index,
                                     int output_index, const tensorflow::TensorShape& shape,
                                     tensorflow::Tensor** output);

// The same without forwarding (allgather: the output shape differs).
absl::Status AllocatePooledOutput(tensorflow::OpKernelContext* context, int output_index,
                                  const tensorflow::TensorShape& shape,
                                  tensorflow::Tensor** output);

}  // namespace tf_ops
}  // namespace tfring

#endif  // TFRING_OPS_KERNELS_OUTPUT_BUFFER_POOL_H_
