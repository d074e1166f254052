// Op definitions (names, attributes, shape functions) of the tfring ops.
//
// Why a separate file: an op's interface is what graphs, SavedModels and the
// Python wrappers depend on; the kernels behind it may change (CPU now, GPU
// later) without touching this file.
//
// The collectives are deliberately NOT stateful. tf.function adds automatic
// control dependencies between stateful ops in program order, which would
// serialise every allreduce of a training step and defeat tensor fusion.
// Consequences, identical on every rank and therefore safe for cross-rank
// matching: a collective whose result is unused is pruned, and two
// identical collectives on the same input may be merged. Constant folding
// would evaluate a collective of a constant while optimizing the graph; the
// kernels refuse that evaluation (collective_kernels.cc), so the folders
// keep the node and it runs with the program. The topology ops (Size, Rank,
// ...) are stateful so they are never folded into a graph before
// tfring.init().
#include "absl/status/status.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfring {
namespace tf_ops {
namespace {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// Allgather concatenates along the first dimension, whose size on the other
// ranks is only known at run time. A scalar gathers to a vector of one
// element per rank.
absl::Status AllgatherShape(InferenceContext* c) {
  ShapeHandle input = c->input(0);
  if (!c->RankKnown(input)) {
    c->set_output(0, c->UnknownShape());
    return absl::OkStatus();
  }
  if (c->Rank(input) == 0) {
    c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
    return absl::OkStatus();
  }
  ShapeHandle output;
  TF_RETURN_IF_ERROR(c->ReplaceDim(input, 0, c->UnknownDim(), &output));
  c->set_output(0, output);
  return absl::OkStatus();
}

// Alltoall and reducescatter divide the first dimension between the ranks:
// its size in the output is only known at run time. received_splits has one
// entry per rank.
absl::Status FirstDimensionUnknown(InferenceContext* c) {
  ShapeHandle input = c->input(0);
  if (!c->RankKnown(input) || c->Rank(input) == 0) {
    // A scalar is refused when the op runs, on every rank, with the fix.
    c->set_output(0, c->UnknownShape());
  } else {
    ShapeHandle output;
    TF_RETURN_IF_ERROR(c->ReplaceDim(input, 0, c->UnknownDim(), &output));
    c->set_output(0, output);
  }
  for (int i = 1; i < c->num_outputs(); ++i) {
    c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfring>Allreduce")
    .Input("tensor: T")
    .Output("output: T")
    .Attr("T: {uint8, int8, int32, int64, half, bfloat16, float, double}")
    // A tfring ReduceOp value: Average=0, Sum=1, Min=3, Max=4, Product=5.
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    // Cross-rank identity of the tensor; empty means the node name.
    .Attr("tensor_name: string = ''")
    // The process set the collective runs in (0: every rank of the job);
    // only its ranks run it. root_rank stays a rank of the job.
    .Attr("process_set_id: int = 0")
    // One grouped call's members share a key (local to this process) and
    // know how many they are: the core wakes its thread once for them all.
    .Attr("group_key: int = 0")
    .Attr("group_size: int = 1")
    // A tfring WireCompression value (none=0, bf16=1, fp16=2): how a float32
    // Sum/Average crosses hosts; 0 leaves it to TFRING_WIRE_COMPRESSION.
    .Attr("compression: int = 0")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("Tfring>Allgather")
    .Input("tensor: T")
    .Output("output: T")
    .Attr(
        "T: {uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, "
        "double, bool}")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .SetShapeFn(AllgatherShape);

REGISTER_OP("Tfring>Broadcast")
    .Input("tensor: T")
    .Output("output: T")
    .Attr(
        "T: {uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, "
        "double, bool}")
    .Attr("root_rank: int")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("Tfring>Alltoall")
    .Input("tensor: T")
    // Rows of dimension 0 sent to each rank, in rank order; empty splits
    // dimension 0 evenly.
    .Input("splits: int32")
    .Output("output: T")
    // Rows received from each rank, in rank order.
    .Output("received_splits: int32")
    .Attr(
        "T: {uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, "
        "double, bool}")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .SetShapeFn(FirstDimensionUnknown);

REGISTER_OP("Tfring>Reducescatter")
    .Input("tensor: T")
    .Output("output: T")
    .Attr("T: {uint8, int8, int32, int64, half, bfloat16, float, double}")
    // A tfring ReduceOp value: Average=0 or Sum=1.
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .SetShapeFn(FirstDimensionUnknown);

// Called by a rank out of data; completes when every rank has called it,
// with the rank that called it last. Stateful: it has no input and must run
// exactly where the program calls it.
REGISTER_OP("Tfring>Join")
    .Output("last_joined_rank: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

#define TFRING_REGISTER_TOPOLOGY_OP(op_name, output_name) \
  REGISTER_OP(op_name)                                    \
      .Output(output_name ": int32")                      \
      .SetIsStateful()                                    \
      .SetShapeFn(tensorflow::shape_inference::ScalarShape)

// Size counts the ranks of a process set (0: the job, as Horovod's size_op).
TFRING_REGISTER_TOPOLOGY_OP("Tfring>Size", "size").Attr("process_set_id: int = 0");
TFRING_REGISTER_TOPOLOGY_OP("Tfring>Rank", "rank");
TFRING_REGISTER_TOPOLOGY_OP("Tfring>LocalSize", "local_size");
TFRING_REGISTER_TOPOLOGY_OP("Tfring>LocalRank", "local_rank");
// 1 if this rank is in the process set, else 0.
TFRING_REGISTER_TOPOLOGY_OP("Tfring>ProcessSetIncluded", "included")
    .Attr("process_set_id: int = 0");
// This rank's position in the process set (its index among the set's
// sorted job ranks); fails on a rank outside the set.
TFRING_REGISTER_TOPOLOGY_OP("Tfring>ProcessSetRank", "rank")
    .Attr("process_set_id: int = 0");

#undef TFRING_REGISTER_TOPOLOGY_OP

}  // namespace tf_ops
}  // namespace tfring
