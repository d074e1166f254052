// Status: the result of every fallible call inside the core.
//
// Why: the core never throws. Errors travel as values from the transport and
// the controller up to the framework bindings, which turn them into the
// framework's own error types (tf.errors.* in the op library, Python
// exceptions in the pybind11 module). The codes are few and map one-to-one to
// what users see.
#ifndef TFRING_CC_STATUS_H_
#define TFRING_CC_STATUS_H_

#include <string>
#include <utility>

namespace tfring {

enum class StatusCode : int {
  kOk = 0,
  // The caller passed something the core cannot accept (bad dtype, bad root).
  kInvalidArgument = 1,
  // Ranks disagree about a tensor (shape, dtype, op, root, scale factors), or
  // the core is not in a state to accept the call (not initialised).
  kFailedPrecondition = 2,
  // The job cannot continue: a rank shut down, the transport failed, a stall
  // exceeded the shutdown time. Pending and later operations fail with it.
  kAborted = 3,
  // A broken invariant that is not the user's fault.
  kInternal = 4,
  // Memory for a tensor (an output, a buffer) could not be allocated.
  kResourceExhausted = 5,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status FailedPrecondition(std::string message) {
    return Status(StatusCode::kFailedPrecondition, std::move(message));
  }
  static Status Aborted(std::string message) {
    return Status(StatusCode::kAborted, std::move(message));
  }
  static Status Internal(std::string message) {
    return Status(StatusCode::kInternal, std::move(message));
  }
  static Status ResourceExhausted(std::string message) {
    return Status(StatusCode::kResourceExhausted, std::move(message));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Returns early from the enclosing function when `expr` is not OK.
#define TFRING_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::tfring::Status _tfring_status = (expr);   \
    if (!_tfring_status.ok()) return _tfring_status; \
  } while (0)

}  // namespace tfring

#endif  // TFRING_CC_STATUS_H_
