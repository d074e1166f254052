// Compile-time half of tfring's XLA support: how Tfring>Allreduce,
// Tfring>Reducescatter and Tfring>Broadcast are lowered when TensorFlow compiles a function with XLA
// (tf.function(jit_compile=True), Keras' model.compile(jit_compile=True),
// auto-clustering).
//
// Each op becomes one XLA custom call to a target of xla_custom_calls.cc,
// using the typed FFI calling convention: one operand, one result (of the
// same shape, but for reducescatter's dimension 0), and the op's attributes plus the cross-rank tensor name as
// typed attributes. The custom call is marked side-effecting so that XLA
// neither removes it nor merges two of them, which would change which
// tensors this rank submits to the core.
//
// Only the CPU compilation device gets working kernels: the targets are
// registered for XLA's CPU ("Host") platform (the GPU one gets kernels that
// fail with a clear message, see below). Tfring>Allgather and
// Tfring>Alltoall get none on purpose: its output's first dimension is only known once every rank has
// reported its own, and an XLA program needs every shape at compile time.
// Without a kernel, XLA auto-clustering leaves allgather outside the
// compiled cluster (where the ordinary kernel runs), and
// tf.function(jit_compile=True) is rejected by the Python wrapper with a
// message naming jit_compile=False (collective_ops.py).
//
// Registration order: TensorFlow turns XLA op registrations into kernels for
// the compilation devices once per process (XlaOpRegistry::
// RegisterCompilationKernels). If that already happened before this library
// was loaded (for example because a jit-compiled function ran before
// `import tfring`), the registrations below would never become kernels, so
// the library registers the missing kernels itself when it is loaded
// (EnsureJitKernels).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cc/api.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.h"
#include "tfring/ops/kernels/kernel_errors.h"
#include "tfring/ops/kernels/xla_custom_calls.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape.h"
#include "xla/xla_data.pb.h"

namespace tfring {
namespace tf_ops {
namespace {

using tensorflow::OpKernelConstruction;
using tensorflow::XlaOpKernel;
using tensorflow::XlaOpKernelContext;

// `value` as an MLIR string literal. Node names need no escaping, but a
// tensor_name attribute set by hand may hold any byte.
std::string MlirString(const std::string& value) {
  std::string out = "\"";
  for (unsigned char c : value) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
        (c >= '0' && c <= '9') || std::strchr("_./>-: ", c) != nullptr) {
      out += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "\\%02X", c);
      out += hex;
    }
  }
  return out + "\"";
}

// An f32 attribute written as its bit pattern, so the handler receives
// exactly the float the graph holds.
std::string MlirF32(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  char text[32];
  std::snprintf(text, sizeof(text), "0x%08X : f32", bits);
  return text;
}

std::string MlirI32(int32_t value) {
  return std::to_string(value) + " : i32";
}

class CollectiveXlaKernel : public XlaOpKernel {
 public:
  explicit CollectiveXlaKernel(OpKernelConstruction* context)
      : XlaOpKernel(context) {
    std::string tensor_name;
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name));
    // Same rule as the TensorFlow kernels: the node name unless set.
    tensor_name_ = tensor_name.empty() ? name() : tensor_name;
    OP_REQUIRES_OK(context,
                   context->GetAttr("process_set_id", &process_set_id_));
  }

  int32_t process_set_id() const { return process_set_id_; }

 protected:
  // Emits the custom call to `target` with `attributes` (MLIR dictionary
  // entries "key = value") plus the tensor name and the process set id. The
  // result has the input's
  // shape, with dimension 0 replaced by `output_rows` when that is >= 0.
  void EmitCustomCall(XlaOpKernelContext* context, const char* target,
                      const std::vector<std::string>& attributes,
                      int64_t output_rows = -1) {
    absl::StatusOr<xla::Shape> shape = context->InputXlaShape(0);
    OP_REQUIRES_OK(context, shape.status());
    OP_REQUIRES(
        context, shape->is_static(),
        absl::InvalidArgumentError(
            "tfring cannot compile " + type_string() + " of tensor '" +
            tensor_name_ +
            "' with XLA: its shape is dynamic. Give the tensor a static "
            "shape, or compile without XLA (tf.function(jit_compile=False) "
            "or model.compile(..., jit_compile=False))."));
    std::string config = "{" + std::string(xla_abi::kNameAttr) + " = " +
                         MlirString(tensor_name_) + ", " +
                         xla_abi::kProcessSetIdAttr + " = " +
                         MlirI32(process_set_id_);
    for (const std::string& attribute : attributes) config += ", " + attribute;
    config += "}";
    xla::Shape output_shape = *shape;
    if (output_rows >= 0) output_shape.set_dimensions(0, output_rows);
    xla::XlaOp input = context->Input(0);
    xla::XlaOp output = xla::CustomCall(
        context->builder(), target, {input}, output_shape, config,
        /*has_side_effect=*/true, /*output_operand_aliasing=*/{},
        /*literal=*/nullptr, xla::CustomCallSchedule::SCHEDULE_NONE,
        xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
    context->SetOutput(0, output);
  }

 private:
  std::string tensor_name_;
  int32_t process_set_id_ = 0;
};

class AllreduceXlaKernel : public CollectiveXlaKernel {
 public:
  explicit AllreduceXlaKernel(OpKernelConstruction* context)
      : CollectiveXlaKernel(context) {
    // Refused here, when the function is compiled, as the TensorFlow kernel
    // does; the core checks it again when the request arrives.
    OP_REQUIRES_OK(context, context->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(context, CheckReduceOp(reduce_op_));
    OP_REQUIRES_OK(context,
                   context->GetAttr("prescale_factor", &prescale_factor_));
    OP_REQUIRES_OK(context,
                   context->GetAttr("postscale_factor", &postscale_factor_));
    OP_REQUIRES_OK(context, context->GetAttr("compression", &compression_));
    OP_REQUIRES_OK(context, CheckWireCompression(compression_));
  }

  void Compile(XlaOpKernelContext* context) override {
    EmitCustomCall(
        context, xla_abi::kAllreduceTarget,
        {std::string(xla_abi::kReduceOpAttr) + " = " + MlirI32(reduce_op_),
         std::string(xla_abi::kPrescaleAttr) + " = " +
             MlirF32(prescale_factor_),
         std::string(xla_abi::kPostscaleAttr) + " = " +
             MlirF32(postscale_factor_),
         std::string(xla_abi::kCompressionAttr) + " = " +
             MlirI32(compression_)});
  }

 private:
  int32_t compression_ = 0;
  int32_t reduce_op_ = 0;
  float prescale_factor_ = 1.0f;
  float postscale_factor_ = 1.0f;
};

// Reducescatter's output keeps this rank's block of dimension 0, whose size
// depends only on the input's shape and this rank's position in the process
// set and the set's size: known when the function is compiled (after
// tfring.init() registered the set), so it lowers like allreduce.
class ReducescatterXlaKernel : public CollectiveXlaKernel {
 public:
  explicit ReducescatterXlaKernel(OpKernelConstruction* context)
      : CollectiveXlaKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(context, CheckReducescatterOp(reduce_op_));
    OP_REQUIRES_OK(context,
                   context->GetAttr("prescale_factor", &prescale_factor_));
    OP_REQUIRES_OK(context,
                   context->GetAttr("postscale_factor", &postscale_factor_));
  }

  void Compile(XlaOpKernelContext* context) override {
    OP_REQUIRES(context, IsInitialized(),
                NotInitializedError("reducescatter (while compiling with XLA)"));
    absl::StatusOr<xla::Shape> shape = context->InputXlaShape(0);
    OP_REQUIRES_OK(context, shape.status());
    OP_REQUIRES(context, !shape->dimensions().empty(),
                absl::InvalidArgumentError(
                    "tfring reducescatter needs a tensor with at least one "
                    "dimension (it divides dimension 0 between the ranks), "
                    "but got a scalar. Reshape it, e.g. tf.reshape(x, [1])."));
    // Position and size in the process set (the job for set 0).
    const int rank = GetTopology().rank;
    const std::map<int32_t, std::vector<int>> sets = ProcessSets();
    const auto found = sets.find(process_set_id());
    OP_REQUIRES(context, found != sets.end(),
                absl::InvalidArgumentError(
                    "tfring cannot compile reducescatter with XLA: process "
                    "set " + std::to_string(process_set_id()) +
                    " does not exist (never added, or removed). Pass a "
                    "registered tfring.ProcessSet."));
    const std::vector<int>& ranks = found->second;
    const auto me = std::find(ranks.begin(), ranks.end(), rank);
    OP_REQUIRES(context, me != ranks.end(),
                absl::InvalidArgumentError(
                    "tfring cannot compile reducescatter with XLA on rank " +
                    std::to_string(rank) + ": it is not in process set " +
                    std::to_string(process_set_id()) +
                    ". Run the set's collectives only on its ranks."));
    const int64_t set_size = static_cast<int64_t>(ranks.size());
    const int64_t position = me - ranks.begin();
    const int64_t rows = shape->dimensions(0);
    const int64_t output_rows =
        rows / set_size + (position < rows % set_size ? 1 : 0);
    EmitCustomCall(
        context, xla_abi::kReducescatterTarget,
        {std::string(xla_abi::kReduceOpAttr) + " = " + MlirI32(reduce_op_),
         std::string(xla_abi::kPrescaleAttr) + " = " +
             MlirF32(prescale_factor_),
         std::string(xla_abi::kPostscaleAttr) + " = " +
             MlirF32(postscale_factor_)},
        output_rows);
  }

 private:
  int32_t reduce_op_ = 0;
  float prescale_factor_ = 1.0f;
  float postscale_factor_ = 1.0f;
};

class BroadcastXlaKernel : public CollectiveXlaKernel {
 public:
  explicit BroadcastXlaKernel(OpKernelConstruction* context)
      : CollectiveXlaKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("root_rank", &root_rank_));
  }

  void Compile(XlaOpKernelContext* context) override {
    EmitCustomCall(
        context, xla_abi::kBroadcastTarget,
        {std::string(xla_abi::kRootRankAttr) + " = " + MlirI32(root_rank_)});
  }

 private:
  int32_t root_rank_ = 0;
};

// On the GPU compilation device (Keras compiles with XLA by default when a
// GPU is present) the collectives would need device buffers copied to the
// host around the custom call; this build has no GPU support, so they fail
// to compile with a message naming the fix instead of TensorFlow's generic
// "no registered OpKernel for XLA_GPU_JIT". XLA auto-clustering never picks
// these: the tfring kernels are CPU kernels, so the nodes sit on the CPU.
class UnsupportedOnGpuXlaKernel : public XlaOpKernel {
 public:
  explicit UnsupportedOnGpuXlaKernel(OpKernelConstruction* context)
      : XlaOpKernel(context) {}

  void Compile(XlaOpKernelContext* context) override {
    context->CtxFailure(absl::UnimplementedError(
        "tfring cannot compile " + type_string() + " (node '" + name() +
        "') with XLA for a GPU: tfring's XLA support runs the collectives as "
        "custom calls on XLA's CPU platform only. Keras compiles with XLA by "
        "default when a GPU is present (jit_compile='auto'). Compile this "
        "function without XLA: model.compile(..., jit_compile=False) or "
        "tf.function(..., jit_compile=False)."));
  }
};

REGISTER_XLA_OP(Name("Tfring>Allreduce").Device(tensorflow::DEVICE_CPU_XLA_JIT),
                AllreduceXlaKernel);
REGISTER_XLA_OP(Name("Tfring>Broadcast").Device(tensorflow::DEVICE_CPU_XLA_JIT),
                BroadcastXlaKernel);
REGISTER_XLA_OP(
    Name("Tfring>Reducescatter").Device(tensorflow::DEVICE_CPU_XLA_JIT),
    ReducescatterXlaKernel);
REGISTER_XLA_OP(Name("Tfring>Allreduce").Device(tensorflow::DEVICE_GPU_XLA_JIT),
                UnsupportedOnGpuXlaKernel);
REGISTER_XLA_OP(
    Name("Tfring>Reducescatter").Device(tensorflow::DEVICE_GPU_XLA_JIT),
    UnsupportedOnGpuXlaKernel);
REGISTER_XLA_OP(Name("Tfring>Broadcast").Device(tensorflow::DEVICE_GPU_XLA_JIT),
                UnsupportedOnGpuXlaKernel);

// Whether TensorFlow's kernel registry holds a kernel of `op` for the
// compilation device `device`.
bool HasJitKernel(const char* op, const char* device) {
  const tensorflow::KernelList kernels =
      tensorflow::GetRegisteredKernelsForOp(op);
  for (const tensorflow::KernelDef& kernel : kernels.kernel()) {
    if (kernel.device_type() == device) return true;
  }
  return false;
}

template <typename Kernel>
tensorflow::OpKernel* CreateKernel(OpKernelConstruction* context) {
  return new Kernel(context);
}

// Registers the compilation kernels RegisterCompilationKernels() would have
// made from the REGISTER_XLA_OPs above, if it ran before this library was
// loaded. It runs once per process and then covers TensorFlow's own
// Identity on every compilation device it knows. Registering them when it
// has not run yet would make it register them a second time later, and
// TensorFlow rejects a node that matches two kernels.
struct EnsureJitKernels {
  EnsureJitKernels() {
    const char* cpu = tensorflow::DEVICE_CPU_XLA_JIT;
    const char* gpu = tensorflow::DEVICE_GPU_XLA_JIT;
    if (HasJitKernel("Identity", cpu)) {
      Register("Tfring>Allreduce", cpu, &CreateKernel<AllreduceXlaKernel>);
      Register("Tfring>Broadcast", cpu, &CreateKernel<BroadcastXlaKernel>);
      Register("Tfring>Reducescatter", cpu,
               &CreateKernel<ReducescatterXlaKernel>);
    }
    if (HasJitKernel("Identity", gpu)) {
      Register("Tfring>Allreduce", gpu,
               &CreateKernel<UnsupportedOnGpuXlaKernel>);
      Register("Tfring>Broadcast", gpu,
               &CreateKernel<UnsupportedOnGpuXlaKernel>);
      Register("Tfring>Reducescatter", gpu,
               &CreateKernel<UnsupportedOnGpuXlaKernel>);
    }
  }

  static void Register(const char* op, const char* device,
                       tensorflow::OpKernel* (*create)(OpKernelConstruction*)) {
    if (HasJitKernel(op, device)) return;
    // Leaked on purpose, like every static kernel registration.
    new tensorflow::kernel_factory::OpKernelRegistrar(
        tensorflow::KernelDefBuilder(op).Device(device).Build(), "XlaJitOp",
        create);
  }
};

// Constructed after the registrations above (same translation unit, later
// definition), when the library is loaded.
const EnsureJitKernels ensure_jit_kernels;

}  // namespace
}  // namespace tf_ops
}  // namespace tfring
