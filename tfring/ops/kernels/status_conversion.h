// Turns a core tfring::Status into the absl::Status TensorFlow expects.
//
// Why: the core is framework-neutral and reports errors as its own Status
// values; the op library is the one place they become tf.errors.* so Python
// users can catch FailedPreconditionError, AbortedError, ... by type. The
// mapping is one-to-one and keeps the core's message untouched.
#ifndef TFRING_OPS_KERNELS_STATUS_CONVERSION_H_
#define TFRING_OPS_KERNELS_STATUS_CONVERSION_H_

#include <string>

#include "absl/status/status.h"
#include "cc/api.h"

namespace tfring {
namespace tf_ops {

inline absl::Status ToTfStatus(const ::tfring::Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return absl::OkStatus();
    case StatusCode::kInvalidArgument:
      return absl::InvalidArgumentError(status.message());
    case StatusCode::kFailedPrecondition:
      return absl::FailedPreconditionError(status.message());
    case StatusCode::kAborted:
      return absl::AbortedError(status.message());
    case StatusCode::kInternal:
      return absl::InternalError(status.message());
    case StatusCode::kResourceExhausted:
      return absl::ResourceExhaustedError(status.message());
  }
  // A code added to the core but not here: keep the message, flag the gap.
  return absl::InternalError("tfring core returned unknown status code " +
                             std::to_string(static_cast<int>(status.code())) +
                             ": " + status.message());
}

// The reverse direction, for callbacks the core calls into the op library
// (the allgather output allocator). TF codes without a core equivalent
// become Internal with TF's message kept.
inline ::tfring::Status FromTfStatus(const absl::Status& status) {
  if (status.ok()) return ::tfring::Status::OK();
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return ::tfring::Status::InvalidArgument(message);
    case absl::StatusCode::kFailedPrecondition:
      return ::tfring::Status::FailedPrecondition(message);
    case absl::StatusCode::kAborted:
      return ::tfring::Status::Aborted(message);
    case absl::StatusCode::kResourceExhausted:
      return ::tfring::Status::ResourceExhausted(message);
    default:
      return ::tfring::Status::Internal(message);
  }
}

}  // namespace tf_ops
}  // namespace tfring

#endif  // TFRING_OPS_KERNELS_STATUS_CONVERSION_H_
