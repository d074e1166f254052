// Errors the op library raises itself, before anything reaches the core.
//
// Why one place: every tfring kernel refuses to run before tfring.init() (or
// after tfring.shutdown()), and users should see the same message, naming the
// fix, whichever op they hit first.
#ifndef TFRING_OPS_KERNELS_KERNEL_ERRORS_H_
#define TFRING_OPS_KERNELS_KERNEL_ERRORS_H_

#include <string>

#include "absl/status/status.h"

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

}  // namespace tf_ops
}  // namespace tfring

#endif  // TFRING_OPS_KERNELS_KERNEL_ERRORS_H_
