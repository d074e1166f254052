// Kernels of Tfring>Size, Tfring>Rank, Tfring>LocalSize, Tfring>LocalRank,
// Tfring>ProcessSetIncluded and Tfring>ProcessSetRank.
//
// Why kernels for a few integers: graphs (tf.function, tf.compat.v1) need
// the topology as tensors evaluated when the graph runs, not values captured
// when it was traced. The ops are stateful so they are never constant-folded,
// and they fail with a clear error if tfring is not initialised at run time
// (or, for the process set ops, if the set does not exist).
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

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

// "0, 2, 3".
std::string JoinRanks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return text;
}

// What the process set ops ask of a set: its size, whether this rank is
// in it, this rank's position in it.
enum class SetQuery { kSize, kIncluded, kRank };

template <SetQuery kQuery>
class ProcessSetKernel : public OpKernel {
 public:
  explicit ProcessSetKernel(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context,
                   context->GetAttr("process_set_id", &process_set_id_));
  }

  void Compute(OpKernelContext* context) override {
    OP_REQUIRES(context, IsInitialized(),
                NotInitializedError(type_string() + " (node '" + name() +
                                    "')"));
    const std::map<int32_t, std::vector<int>> sets = ProcessSets();
    const auto found = sets.find(process_set_id_);
    OP_REQUIRES(
        context, found != sets.end(),
        absl::InvalidArgumentError(
            type_string() + " (node '" + name() + "'): process set " +
            std::to_string(process_set_id_) +
            " does not exist (never added, or removed). Pass the "
            "process_set_id of a registered tfring.ProcessSet."));
    const std::vector<int>& ranks = found->second;
    const int rank = GetTopology().rank;
    const auto position = std::find(ranks.begin(), ranks.end(), rank);
    int32_t value = 0;
    switch (kQuery) {
      case SetQuery::kSize:
        value = static_cast<int32_t>(ranks.size());
        break;
      case SetQuery::kIncluded:
        value = position != ranks.end() ? 1 : 0;
        break;
      case SetQuery::kRank:
        OP_REQUIRES(
            context, position != ranks.end(),
            absl::InvalidArgumentError(
                type_string() + " (node '" + name() + "'): rank " +
                std::to_string(rank) + " is not in process set " +
                std::to_string(process_set_id_) + " (ranks " +
                JoinRanks(ranks) +
                "), so it has no position in it. Run this only on the "
                "set's ranks."));
        value = static_cast<int32_t>(position - ranks.begin());
        break;
    }
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({}), &output));
    output->scalar<int32_t>()() = value;
  }

 private:
  int32_t process_set_id_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("Tfring>Size").Device(tensorflow::DEVICE_CPU),
                        ProcessSetKernel<SetQuery::kSize>);
REGISTER_KERNEL_BUILDER(
    Name("Tfring>ProcessSetIncluded").Device(tensorflow::DEVICE_CPU),
    ProcessSetKernel<SetQuery::kIncluded>);
REGISTER_KERNEL_BUILDER(
    Name("Tfring>ProcessSetRank").Device(tensorflow::DEVICE_CPU),
    ProcessSetKernel<SetQuery::kRank>);
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
