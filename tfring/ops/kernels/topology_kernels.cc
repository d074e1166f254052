// Kernels of Tfring>Size, Tfring>Rank, Tfring>LocalSize, Tfring>LocalRank.
//
// Why kernels for four integers: graphs (tf.function, tf.compat.v1) need the
// topology as tensors evaluated when the graph runs, not values captured when
// it was traced. The ops are stateful so they are never constant-folded, and
// they fail with a clear error if tfring is not initialised at run time.
#include <cstdint>
#include <string>

#include "cc/api.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tfring/ops/kernels/kernel_errors.h"

namespace tfring {
namespace tf_ops {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// One kernel class for the four ops: each reads one field of the topology.
template <int Topology::*kField>
class TopologyKernel : public OpKernel {
 public:
  explicit TopologyKernel(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    OP_REQUIRES(context, IsInitialized(),
                NotInitializedError(type_string() + " (node '" + name() +
                                    "')"));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({}), &output));
    output->scalar<int32_t>()() = static_cast<int32_t>(GetTopology().*kField);
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfring>Size").Device(tensorflow::DEVICE_CPU),
                        TopologyKernel<&Topology::size>);
REGISTER_KERNEL_BUILDER(Name("Tfring>Rank").Device(tensorflow::DEVICE_CPU),
                        TopologyKernel<&Topology::rank>);
REGISTER_KERNEL_BUILDER(
    Name("Tfring>LocalSize").Device(tensorflow::DEVICE_CPU),
    TopologyKernel<&Topology::local_size>);
REGISTER_KERNEL_BUILDER(
    Name("Tfring>LocalRank").Device(tensorflow::DEVICE_CPU),
    TopologyKernel<&Topology::local_rank>);

}  // namespace
}  // namespace tf_ops
}  // namespace tfring
