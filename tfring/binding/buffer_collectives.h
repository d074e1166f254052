// Collectives on plain host buffers, completed through a handle the caller
// polls or waits on.
//
// Why: front ends other than TensorFlow (tfring.torch) reach the core
// through the pybind11 module, not through an op library compiled against
// their framework. They hand the core the addresses of contiguous CPU
// buffers, as the TensorFlow kernels do with their tensors, and get back a
// PendingCollective: the core's callback (on the background thread) records
// the outcome and wakes whoever waits; nothing here touches Python, so the
// data path stays free of the GIL. Outputs whose size only the core knows
// (allgather, alltoall, reducescatter) are allocated here, when the core
// asks for them, and handed to the front end afterwards without a copy.
#ifndef TFRING_TFRING_BINDING_BUFFER_COLLECTIVES_H_
#define TFRING_TFRING_BINDING_BUFFER_COLLECTIVES_H_

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cc/api.h"
#include "cc/common.h"
#include "cc/status.h"

namespace tfring {
namespace buffer_collectives {

// Asks the kernel to back [data, data + bytes) with transparent huge pages
// where it can (the whole 4 KiB pages inside the range only; a hint, never
// an error). For fresh output memory the core writes once: faulting it in
// 4 KiB at a time costs more than the collective itself (a 64 MiB allreduce
// into a new torch tensor: 48 ms against 8.5 ms in place, measured with
// benchmarks/torch_allreduce.py), 2 MiB at a time a few milliseconds. Call
// it before the memory is first touched.
inline void AdviseHugePages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kPage = 4096;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kPage - 1);
  if (data != nullptr && end > begin) {
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#else
  (void)data;
  (void)bytes;
#endif
}

// Memory the core writes an output into, owned by whoever holds it last (the
// handle, then the framework tensor that views it). Large ones on huge pages
// (AdviseHugePages).
class HostBuffer {
 public:
  // Cache-line aligned, so the core's reduction loops and the framework's
  // kernels see the alignment they get from their own allocators.
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kHugePage = size_t{2} << 20;

  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    const size_t alignment = bytes_ >= kHugePage ? kHugePage : kAlignment;
    const size_t rounded = (bytes_ + alignment - 1) / alignment * alignment;
    data_ = std::aligned_alloc(alignment, rounded);
    if (alignment == kHugePage) AdviseHugePages(data_, rounded);
  }
  ~HostBuffer() { std::free(data_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  // Null when the allocation failed (and for zero bytes).
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
  void* data_ = nullptr;
};

// One collective handed to the core: its outcome, and its output when the
// core allocated it. Shared by the core's callback and the front end.
class PendingCollective {
 public:
  // From the core's callback, exactly once.
  void Complete(const Status& status) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      status_ = status;
      done_ = true;
    }
    finished_.notify_all();
  }

  // Whether the outcome is known (Wait() would not block).
  bool Done() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  // Blocks until the core completes the collective; returns its outcome.
  Status Wait() const {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [this] { return done_; });
    return status_;
  }

  // The allocator the core calls (background thread) once the output's
  // shape is known.
  Status AllocateOutput(DataType dtype, const std::vector<int64_t>& shape,
                        void** data) {
    const int64_t elements = NumElements(shape);
    auto buffer = std::make_shared<HostBuffer>(
        static_cast<size_t>(elements * DataTypeSize(dtype)));
    if (buffer->bytes() > 0 && buffer->data() == nullptr) {
      return Status::ResourceExhausted(
          "could not allocate " + std::to_string(buffer->bytes()) +
          " bytes for an output of shape " + ShapeToString(shape) + ".");
    }
    output_shape_ = shape;
    output_ = std::move(buffer);
    *data = output_->data();
    return Status::OK();
  }

  // Valid after a successful Wait(): the output the core allocated (null
  // when the caller provided the output), its shape, and for alltoall the
  // rows received from each rank.
  const std::shared_ptr<HostBuffer>& output() const { return output_; }
  const std::vector<int64_t>& output_shape() const { return output_shape_; }
  const std::vector<int64_t>& received_splits() const {
    return received_splits_;
  }
  std::vector<int64_t>* mutable_received_splits() { return &received_splits_; }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable finished_;
  bool done_ = false;
  Status status_;
  // Written by the background thread before Complete(), read after Wait().
  std::shared_ptr<HostBuffer> output_;
  std::vector<int64_t> output_shape_;
  std::vector<int64_t> received_splits_;
};

// A collective on host buffers, as a front end describes it.
struct BufferCollective {
  Request request;
  // Addresses of contiguous host memory holding NumElements(request.shape)
  // elements of request.dtype. `output`: allreduce, broadcast and join only
  // (may equal `input`); the other collectives get theirs from the core.
  uintptr_t input = 0;
  uintptr_t output = 0;
  std::vector<int64_t> splits;  // alltoall only
  SubmissionGroup group;
};

// Whether the core writes into memory the caller provides (allreduce,
// broadcast, join) rather than memory it asks for once the shape is known.
inline bool HasCallerOutput(CollectiveType type) {
  return type == CollectiveType::kAllreduce ||
         type == CollectiveType::kBroadcast || type == CollectiveType::kJoin;
}

// Hands `collective` to the core. On success *pending completes later (the
// buffers must stay valid until then); on failure nothing was enqueued.
inline Status EnqueueBufferCollective(
    BufferCollective collective, std::shared_ptr<PendingCollective>* pending) {
  if (!IsInitialized()) {
    return Status::FailedPrecondition(
        "tfring is not initialized: cannot run " +
        std::string(CollectiveTypeName(collective.request.type)) +
        " of tensor '" + collective.request.name +
        "'. Call init() once at the start of the program, before any "
        "collective.");
  }
  auto handle = std::make_shared<PendingCollective>();
  TensorBuffers buffers;
  buffers.input = reinterpret_cast<const void*>(collective.input);
  if (HasCallerOutput(collective.request.type)) {
    buffers.output = reinterpret_cast<void*>(collective.output);
  } else {
    const DataType dtype = collective.request.dtype;
    PendingCollective* target = handle.get();  // outlives the callback
    buffers.allocate_output = [target, dtype](const std::vector<int64_t>& shape,
                                              void** data) {
      return target->AllocateOutput(dtype, shape, data);
    };
  }
  if (collective.request.type == CollectiveType::kAlltoall) {
    buffers.splits = std::move(collective.splits);
    buffers.received_splits = handle->mutable_received_splits();
  }
  // The callback owns a reference, so the handle lives until the core is
  // done with it even if the front end drops its own.
  Status status = Enqueue(
      std::move(collective.request), std::move(buffers),
      [handle](const Status& result) { handle->Complete(result); },
      collective.group);
  if (status.ok()) *pending = std::move(handle);
  return status;
}

}  // namespace buffer_collectives
}  // namespace tfring

#endif  // TFRING_TFRING_BINDING_BUFFER_COLLECTIVES_H_
