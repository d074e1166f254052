// CPU kernels of Tfring>Allreduce, Tfring>Allgather, Tfring>Broadcast,
// Tfring>Alltoall and Tfring>Reducescatter.
//
// Why asynchronous kernels: the communication happens on the core's single
// background thread, possibly fused with other tensors, after every rank has
// submitted the same tensor name. A kernel only validates, prepares the output
// buffer, describes the tensor to the core and returns; the core's callback
// finishes the op. TensorFlow's executor threads never block on the network.
//
// Every path through ComputeAsync ends in exactly one call of `done`: either
// here (an error before or from Enqueue) or in the core's callback (which the
// core calls exactly once after a successful Enqueue). The OpKernelContext
// stays valid until `done` runs, so the callbacks may capture it.
//
// Each kernel is registered once without a type constraint: it never touches
// element values itself, and the op definitions already restrict T to the
// types the core supports.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cc/api.h"
#include "tensorflow/core/framework/log_memory.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tfring/ops/kernels/dtype_conversion.h"
#include "tfring/ops/kernels/kernel_errors.h"
#include "tfring/ops/kernels/output_buffer_pool.h"
#include "tfring/ops/kernels/status_conversion.h"

namespace tfring {
namespace tf_ops {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// What the collectives share: the cross-rank tensor name, the process set,
// the request fields that describe the input, and the hand-off to the core.
class CollectiveKernel : public AsyncOpKernel {
 public:
  CollectiveKernel(OpKernelConstruction* context, CollectiveType type,
                   const char* type_name)
      : AsyncOpKernel(context), type_(type), type_name_(type_name) {
    std::string tensor_name;
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name));
    // Empty in graphs (and unnamed eager calls): the node name is unique in
    // the graph and identical on every rank running the same program.
    tensor_name_ = tensor_name.empty() ? name() : tensor_name;
    // The core checks that the set exists and holds this rank (the Python
    // wrappers already did, when the op was built).
    OP_REQUIRES_OK(context,
                   context->GetAttr("process_set_id", &process_set_id_));
    // Only ops that grouped calls create have these (allreduce).
    if (context->HasAttr("group_size")) {
      OP_REQUIRES_OK(context, context->GetAttr("group_key", &group_.key));
      OP_REQUIRES_OK(context, context->GetAttr("group_size", &group_.size));
    }
  }

 protected:
  // "allreduce of tensor 'x'", for error messages.
  std::string Describe() const {
    return std::string(type_name_) + " of tensor '" + tensor_name_ + "'";
  }

  // Whether a constant folder is evaluating this kernel while it optimizes
  // a function, instead of the program running it. The op is stateless (so
  // that TensorFlow does not chain collectives in program order, which would
  // prevent fusion), so constant folding may evaluate one whose input is a
  // constant: Grappler's folding (no function library) and the graph
  // optimizer's folding when a function is instantiated (its GraphRunner
  // runs the constant subgraph under the reserved constant-folding step id).
  // Running the collective then would submit it once at optimization time,
  // in whatever order this rank happens to optimize its functions, and
  // freeze its result into the graph (wrong after an elastic job changed
  // size). Failing makes both folders leave the node to run with the
  // program, every step.
  static bool EvaluatedByConstantFolding(OpKernelContext* context) {
    return context->function_library() == nullptr ||
           context->step_id() ==
               tensorflow::LogMemory::CONSTANT_FOLDING_STEP_ID;
  }

  // Whether this kernel may hand its tensor to the core now; when not, the
  // op has failed and `done` has run. A folder's evaluation fails without
  // a logged warning: the folder expects it and keeps the node.
  bool Runnable(OpKernelContext* context, const DoneCallback& done) const {
    if (EvaluatedByConstantFolding(context)) {
      context->SetStatus(absl::FailedPreconditionError(
          Describe() + " was evaluated outside a TensorFlow step (graph "
          "optimization); collectives only run when the program runs."));
      done();
      return false;
    }
    if (IsInitialized()) return true;
    context->CtxFailureWithWarning(__FILE__, __LINE__,
                                   NotInitializedError(Describe()));
    done();
    return false;
  }

  // Name, type, dtype and shape of `input`; the caller adds op-specific
  // fields.
  absl::Status DescribeInput(const Tensor& input, Request* request) const {
    request->name = tensor_name_;
    request->type = type_;
    request->process_set_id = process_set_id_;
    TF_RETURN_IF_ERROR(ToCoreDataType(input.dtype(), &request->dtype));
    request->shape.clear();
    for (int i = 0; i < input.dims(); ++i) {
      request->shape.push_back(input.dim_size(i));
    }
    return absl::OkStatus();
  }

  // Allreduce and broadcast: the output has the input's shape and reuses the
  // input's buffer when TensorFlow allows it (the core then works in place).
  void EnqueueWithOutputLikeInput(OpKernelContext* context, Request request,
                                  DoneCallback done) const {
    const Tensor& input = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(
        context, ForwardOrAllocateOutput(context, 0, 0, input.shape(), &output),
        done);
    TensorBuffers buffers;
    buffers.input = input.data();
    buffers.output = output->data();
    EnqueueOrFail(context, std::move(request), std::move(buffers),
                  std::move(done));
  }

  // An allocator for outputs whose shape only the core knows (allgather,
  // alltoall, reducescatter): it asks for them once the shapes are
  // negotiated, from the background thread.
  static OutputAllocator PooledOutputAllocator(OpKernelContext* context) {
    return [context](const std::vector<int64_t>& shape,
                     void** data) -> ::tfring::Status {
      TensorShape output_shape;
      absl::Status status = TensorShape::BuildTensorShape(shape, &output_shape);
      if (!status.ok()) return FromTfStatus(status);
      Tensor* output = nullptr;
      status = AllocatePooledOutput(context, 0, output_shape, &output);
      if (!status.ok()) return FromTfStatus(status);
      *data = output->data();
      return ::tfring::Status::OK();
    };
  }

  // Allgather and reducescatter: the output's shape depends on the other
  // ranks or this rank's position, so the core asks for it when known.
  void EnqueueWithOutputFromCore(OpKernelContext* context, Request request,
                                 DoneCallback done) const {
    TensorBuffers buffers;
    buffers.input = context->input(0).data();
    buffers.allocate_output = PooledOutputAllocator(context);
    EnqueueOrFail(context, std::move(request), std::move(buffers),
                  std::move(done));
  }

  // Hands the tensor to the core. On success the core calls back exactly
  // once; on failure the core does not, so `done` is called here.
  // `finish`, when set, runs after a successful collective (to write further
  // outputs) and may still fail the op.
  void EnqueueOrFail(OpKernelContext* context, Request request,
                     TensorBuffers buffers, DoneCallback done,
                     std::function<absl::Status()> finish = nullptr) const {
    ::tfring::Status status = Enqueue(
        std::move(request), std::move(buffers),
        [context, done, finish](const ::tfring::Status& result) {
          absl::Status outcome = ToTfStatus(result);
          if (outcome.ok() && finish) outcome = finish();
          context->SetStatus(outcome);
          done();
        },
        group_);
    if (!status.ok()) {
      context->SetStatus(ToTfStatus(status));
      done();
    }
  }

 private:
  const CollectiveType type_;
  const char* const type_name_;
  std::string tensor_name_;
  int32_t process_set_id_ = 0;
  SubmissionGroup group_;
};

// What allreduce and reducescatter share: the reduce op (checked by
// `check_op` when the kernel is built) and the scale factors.
class ReductionKernel : public CollectiveKernel {
 public:
  ReductionKernel(OpKernelConstruction* context, CollectiveType type,
                  const char* type_name,
                  absl::Status (*check_op)(int32_t reduce_op))
      : CollectiveKernel(context, type, type_name) {
    int32_t reduce_op = 0;
    OP_REQUIRES_OK(context, context->GetAttr("reduce_op", &reduce_op));
    OP_REQUIRES_OK(context, check_op(reduce_op));
    reduce_op_ = static_cast<ReduceOp>(reduce_op);
    OP_REQUIRES_OK(context,
                   context->GetAttr("prescale_factor", &prescale_factor_));
    OP_REQUIRES_OK(context,
                   context->GetAttr("postscale_factor", &postscale_factor_));
  }

 protected:
  // DescribeInput plus the op and the scale factors.
  absl::Status DescribeReduction(const Tensor& input, Request* request) const {
    TF_RETURN_IF_ERROR(DescribeInput(input, request));
    request->reduce_op = reduce_op_;
    request->prescale_factor = prescale_factor_;
    request->postscale_factor = postscale_factor_;
    return absl::OkStatus();
  }

 private:
  ReduceOp reduce_op_ = ReduceOp::kSum;
  float prescale_factor_ = 1.0f;
  float postscale_factor_ = 1.0f;
};

class AllreduceKernel : public ReductionKernel {
 public:
  explicit AllreduceKernel(OpKernelConstruction* context)
      : ReductionKernel(context, CollectiveType::kAllreduce, "allreduce",
                        CheckReduceOp) {
    int32_t compression = 0;
    OP_REQUIRES_OK(context, context->GetAttr("compression", &compression));
    OP_REQUIRES_OK(context, CheckWireCompression(compression));
    compression_ = static_cast<WireCompression>(compression);
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!Runnable(context, done)) return;
    Request request;
    OP_REQUIRES_OK_ASYNC(context,
                         DescribeReduction(context->input(0), &request), done);
    request.compression = compression_;
    EnqueueWithOutputLikeInput(context, std::move(request), std::move(done));
  }

 private:
  WireCompression compression_ = WireCompression::kNone;
};

class AllgatherKernel : public CollectiveKernel {
 public:
  explicit AllgatherKernel(OpKernelConstruction* context)
      : CollectiveKernel(context, CollectiveType::kAllgather, "allgather") {}

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!Runnable(context, done)) return;
    Request request;
    OP_REQUIRES_OK_ASYNC(context, DescribeInput(context->input(0), &request),
                         done);
    // The shape goes to the core unchanged: it gathers a scalar as one row
    // (the output has one element per rank) and rejects a mix of scalars and
    // vectors. Only the core knows every rank's first dimension.
    EnqueueWithOutputFromCore(context, std::move(request), std::move(done));
  }
};

class AlltoallKernel : public CollectiveKernel {
 public:
  explicit AlltoallKernel(OpKernelConstruction* context)
      : CollectiveKernel(context, CollectiveType::kAlltoall, "alltoall") {}

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!Runnable(context, done)) return;
    const Tensor& input = context->input(0);
    const Tensor& splits = context->input(1);
    Request request;
    OP_REQUIRES_OK_ASYNC(context, DescribeInput(input, &request), done);

    TensorBuffers buffers;
    buffers.input = input.data();
    // The core checks the splits on every rank (a bad entry on one rank
    // fails the op everywhere, naming it), so they go as they are.
    const auto split_values = splits.flat<int32_t>();
    for (int64_t i = 0; i < split_values.size(); ++i) {
      buffers.splits.push_back(split_values(i));
    }
    auto received = std::make_shared<std::vector<int64_t>>();
    buffers.received_splits = received.get();
    buffers.allocate_output = PooledOutputAllocator(context);
    auto write_received_splits = [context, received]() -> absl::Status {
      Tensor* output = nullptr;
      TF_RETURN_IF_ERROR(context->allocate_output(
          1, TensorShape({static_cast<int64_t>(received->size())}), &output));
      auto values = output->flat<int32_t>();
      for (size_t i = 0; i < received->size(); ++i) {
        values(i) = static_cast<int32_t>((*received)[i]);
      }
      return absl::OkStatus();
    };
    EnqueueOrFail(context, std::move(request), std::move(buffers),
                  std::move(done), std::move(write_received_splits));
  }
};

class ReducescatterKernel : public ReductionKernel {
 public:
  explicit ReducescatterKernel(OpKernelConstruction* context)
      : ReductionKernel(context, CollectiveType::kReducescatter,
                        "reducescatter", CheckReducescatterOp) {}

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!Runnable(context, done)) return;
    Request request;
    OP_REQUIRES_OK_ASYNC(context,
                         DescribeReduction(context->input(0), &request), done);
    // The core gives this rank its block of dimension 0.
    EnqueueWithOutputFromCore(context, std::move(request), std::move(done));
  }
};

class BroadcastKernel : public CollectiveKernel {
 public:
  explicit BroadcastKernel(OpKernelConstruction* context)
      : CollectiveKernel(context, CollectiveType::kBroadcast, "broadcast") {
    OP_REQUIRES_OK(context, context->GetAttr("root_rank", &root_rank_));
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!Runnable(context, done)) return;
    const int32_t size = GetTopology().size;
    // A rank of the job; whether it is in the process set is the core's
    // check (it knows the set's ranks and names them).
    OP_REQUIRES_ASYNC(
        context, root_rank_ >= 0 && root_rank_ < size,
        absl::InvalidArgumentError(
            Describe() + ": root_rank " + std::to_string(root_rank_) +
            " is not a rank of this job (size " + std::to_string(size) +
            ", ranks 0.." + std::to_string(size - 1) +
            "). Pass the rank that holds the values to send."),
        done);
    const Tensor& input = context->input(0);
    Request request;
    OP_REQUIRES_OK_ASYNC(context, DescribeInput(input, &request), done);
    request.root_rank = root_rank_;

    EnqueueWithOutputLikeInput(context, std::move(request), std::move(done));
  }

 private:
  int32_t root_rank_ = 0;
};

REGISTER_KERNEL_BUILDER(
    Name("Tfring>Allreduce").Device(tensorflow::DEVICE_CPU), AllreduceKernel);
REGISTER_KERNEL_BUILDER(
    Name("Tfring>Allgather").Device(tensorflow::DEVICE_CPU), AllgatherKernel);
REGISTER_KERNEL_BUILDER(
    Name("Tfring>Broadcast").Device(tensorflow::DEVICE_CPU), BroadcastKernel);
REGISTER_KERNEL_BUILDER(
    Name("Tfring>Alltoall").Device(tensorflow::DEVICE_CPU), AlltoallKernel);
REGISTER_KERNEL_BUILDER(
    Name("Tfring>Reducescatter").Device(tensorflow::DEVICE_CPU),
    ReducescatterKernel);

}  // namespace
}  // namespace tf_ops
}  // namespace tfring
