// The contract between the two halves of tfring's XLA support.
//
// Why a header of its own: under tf.function(jit_compile=True) (and Keras'
// jit-compiled train step) TensorFlow does not run the ordinary kernels of
// collective_kernels.cc. The whole function is compiled to one XLA program,
// and each tfring op must describe itself as XLA operations. Two files do
// that, in two very different worlds:
//
//   xla_kernels.cc       compile time: an XlaOpKernel per op emits an XLA
//                        custom call naming one of the targets below, with
//                        the attributes below as its backend config;
//   xla_custom_calls.cc  run time: the targets, XLA FFI handlers registered
//                        for the CPU ("Host") platform, hand the XLA-owned
//                        buffers to the core and complete asynchronously.
//
// They share nothing but these strings, which are the custom call's ABI.
#ifndef TFRING_OPS_KERNELS_XLA_CUSTOM_CALLS_H_
#define TFRING_OPS_KERNELS_XLA_CUSTOM_CALLS_H_

namespace tfring {
namespace tf_ops {
namespace xla_abi {

// Custom-call targets. One operand, one result of the same type, and of the
// same shape but for reducescatter's dimension 0 (this rank's block).
inline constexpr char kAllreduceTarget[] = "tfring_allreduce";
inline constexpr char kBroadcastTarget[] = "tfring_broadcast";
inline constexpr char kReducescatterTarget[] = "tfring_reducescatter";

// The platform the targets are registered for: XLA's name for the CPU.
inline constexpr char kPlatform[] = "Host";

// Attribute names (typed FFI attributes, printed as an MLIR dictionary).
inline constexpr char kNameAttr[] = "tensor_name";          // string
inline constexpr char kReduceOpAttr[] = "reduce_op";        // i32
inline constexpr char kPrescaleAttr[] = "prescale_factor";  // f32
inline constexpr char kPostscaleAttr[] = "postscale_factor";  // f32
inline constexpr char kCompressionAttr[] = "compression";  // i32, allreduce: WireCompression
inline constexpr char kRootRankAttr[] = "root_rank";        // i32
inline constexpr char kProcessSetIdAttr[] = "process_set_id";  // i32, every target

}  // namespace xla_abi
}  // namespace tf_ops
}  // namespace tfring

#endif  // TFRING_OPS_KERNELS_XLA_CUSTOM_CALLS_H_
