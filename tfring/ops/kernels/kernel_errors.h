// Errors the op library raises itself, before anything reaches the core.
//
// Why one place: every tfring kernel refuses to run before tfring.init() (or
// after tfring.shutdown()), and users should see the same message, naming the
// fix, whichever op they hit first; the TensorFlow and XLA kernels check the
// reduce op and the wire compression the same way.
#ifndef TFRING_OPS_KERNELS_KERNEL_ERRORS_H_
#define TFRING_OPS_KERNELS_KERNEL_ERRORS_H_

#include <string>

#include "absl/status/status.h"
#include "cc/common.h"

namespace tfring {
namespace tf_ops {

// `what` says what was attempted, e.g. "allreduce of tensor 'loss'".
inline absl::Status NotInitializedError(const std::string& what) {
  return absl::FailedPreconditionError(
      "tfring is not initialized: cannot run " + what +
      ". tfring operations need the runtime that tfring.init() starts (and "
      "tfring.shutdown() stops). Call tfring.init() once at the start of "
      "the program, before using any tfring operation.");
}

// OK for the reduce ops the core implements; otherwise the error both the
// TensorFlow and the XLA kernel raise when the op is built.
inline absl::Status CheckReduceOp(int32_t reduce_op) {
  if (IsImplementedReduceOp(reduce_op)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "allreduce: reduce_op " + std::to_string(reduce_op) +
      " is not supported. Use tfring.Average (0), tfring.Sum (1), "
      "tfring.Min (3), tfring.Max (4) or tfring.Product (5).");
}

// Reducescatter implements Sum and Average only.
inline absl::Status CheckReducescatterOp(int32_t reduce_op) {
  if (reduce_op == static_cast<int32_t>(ReduceOp::kSum) ||
      reduce_op == static_cast<int32_t>(ReduceOp::kAverage)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      "reducescatter: reduce_op " + std::to_string(reduce_op) +
      " is not supported. Use tfring.Average (0) or tfring.Sum (1).");
}

// The wire compressions of tfring.Compression (an allreduce's attribute).
inline absl::Status CheckWireCompression(int32_t compression) {
  if (compression >= 0 &&
      compression <= static_cast<int32_t>(WireCompression::kFp16)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      "tfring allreduce: compression attr " + std::to_string(compression) +
      " is not a wire compression; expected 0 (none), 1 (bf16) or 2 (fp16). "
      "Pass a tfring.Compression member instead of a number.");
}

}  // namespace tf_ops
}  // namespace tfring

#endif  // TFRING_OPS_KERNELS_KERNEL_ERRORS_H_
