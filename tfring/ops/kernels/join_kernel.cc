// CPU kernel of Tfring>Join.
//
// Why a kernel of its own: join is not a collective on a tensor but a
// rank's declaration that it is out of data. The core then lets the other
// ranks' allreduces complete with this rank contributing zeros, and
// completes the join when every rank has joined. Like the collectives, the
// kernel is asynchronous: TensorFlow's threads never wait for other ranks.
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "cc/api.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tfring/ops/kernels/kernel_errors.h"
#include "tfring/ops/kernels/status_conversion.h"

namespace tfring {
namespace tf_ops {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

class JoinKernel : public AsyncOpKernel {
 public:
  explicit JoinKernel(OpKernelConstruction* context) : AsyncOpKernel(context) {}

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    OP_REQUIRES_ASYNC(context, IsInitialized(), NotInitializedError("join"),
                      done);
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(
        context, context->allocate_output(0, TensorShape({}), &output), done);
    Request request;
    request.name = kJoinTensorName;
    request.type = CollectiveType::kJoin;
    request.dtype = DataType::kInt32;
    TensorBuffers buffers;
    buffers.input = output->data();
    buffers.output = output->data();
    ::tfring::Status status = Enqueue(
        std::move(request), std::move(buffers),
        [context, done](const ::tfring::Status& result) {
          context->SetStatus(ToTfStatus(result));
          done();
        });
    if (!status.ok()) {
      context->SetStatus(ToTfStatus(status));
      done();
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfring>Join").Device(tensorflow::DEVICE_CPU),
                        JoinKernel);

}  // namespace
}  // namespace tf_ops
}  // namespace tfring
