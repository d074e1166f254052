// Run-time half of tfring's XLA support: the custom-call targets that an
// XLA-compiled program calls for each tfring allreduce and broadcast.
//
// Why XLA's FFI: its "api" headers are header-only and reach XLA through a
// C table of function pointers (XLA_FFI_Api), so the only symbol needed from
// TensorFlow is xla::ffi::GetXlaFfiApi(). Handlers are registered for the
// "Host" platform when the op library is loaded, before any program that
// names them is compiled.
//
// Why asynchronous handlers: the core matches tensors by name across ranks
// and may fuse several into one transfer, so a handler must not block the
// XLA thread that runs it until its own tensor is done; on a small thread
// pool (one intra-op thread per rank is common) a blocked thread could
// prevent this rank from ever submitting a tensor another rank is waiting
// for. Each handler validates, enqueues the XLA-owned input and output
// buffers and returns an ffi::Future that the core's callback completes.
// XLA keeps the buffers alive until the future is ready.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cc/api.h"
#include "tfring/ops/kernels/xla_custom_calls.h"
#include "xla/ffi/api/ffi.h"

namespace xla {
namespace ffi {
// Exported by libtensorflow_cc; declared here instead of including
// xla/ffi/ffi_api.h, which pulls in XLA's internal (non-"api") headers.
const XLA_FFI_Api* GetXlaFfiApi();
}  // namespace ffi
}  // namespace xla

namespace tfring {
namespace tf_ops {
namespace {

namespace ffi = ::xla::ffi;

ffi::Error ToFfiError(const ::tfring::Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return ffi::Error::Success();
    case StatusCode::kInvalidArgument:
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, status.message());
    case StatusCode::kFailedPrecondition:
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition, status.message());
    case StatusCode::kAborted:
      return ffi::Error(ffi::ErrorCode::kAborted, status.message());
    case StatusCode::kResourceExhausted:
      return ffi::Error(ffi::ErrorCode::kResourceExhausted, status.message());
    case StatusCode::kInternal:
      break;
  }
  return ffi::Error(ffi::ErrorCode::kInternal, status.message());
}

// A future that is already failed with `error`.
ffi::Future Failed(ffi::Error error) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(std::move(error));
  return future;
}

bool ToCoreDataType(ffi::DataType xla_dtype, ::tfring::DataType* dtype) {
  switch (xla_dtype) {
    case ffi::DataType::U8:
      *dtype = ::tfring::DataType::kUInt8;
      return true;
    case ffi::DataType::S8:
      *dtype = ::tfring::DataType::kInt8;
      return true;
    case ffi::DataType::U16:
      *dtype = ::tfring::DataType::kUInt16;
      return true;
    case ffi::DataType::S16:
      *dtype = ::tfring::DataType::kInt16;
      return true;
    case ffi::DataType::S32:
      *dtype = ::tfring::DataType::kInt32;
      return true;
    case ffi::DataType::S64:
      *dtype = ::tfring::DataType::kInt64;
      return true;
    case ffi::DataType::F16:
      *dtype = ::tfring::DataType::kFloat16;
      return true;
    case ffi::DataType::BF16:
      *dtype = ::tfring::DataType::kBFloat16;
      return true;
    case ffi::DataType::F32:
      *dtype = ::tfring::DataType::kFloat32;
      return true;
    case ffi::DataType::F64:
      *dtype = ::tfring::DataType::kFloat64;
      return true;
    case ffi::DataType::PRED:
      *dtype = ::tfring::DataType::kBool;
      return true;
    default:
      return false;
  }
}

// Fills the fields every collective shares and hands the buffers to the
// core. The future completes when the core's callback runs.
ffi::Future Submit(Request request, const char* type_name,
                   const ffi::AnyBuffer& input, ffi::AnyBuffer output) {
  const std::string what =
      std::string(type_name) + " of tensor '" + request.name + "'";
  if (!IsInitialized()) {
    // Same text as kernel_errors.h, which needs TensorFlow headers.
    return Failed(ffi::Error(
        ffi::ErrorCode::kFailedPrecondition,
        "tfring is not initialized: cannot run " + what +
            ". tfring operations need the runtime that tfring.init() starts "
            "(and tfring.shutdown() stops). Call tfring.init() once at the "
            "start of the program, before using any tfring operation."));
  }
  if (!ToCoreDataType(input.element_type(), &request.dtype)) {
    return Failed(ffi::Error::InvalidArgument(
        what + ": XLA passed an element type tfring does not support (FFI "
               "data type " +
        std::to_string(static_cast<int>(input.element_type())) + ")."));
  }
  const bool same_shape = request.type != CollectiveType::kReducescatter;
  if (output.element_type() != input.element_type() ||
      (same_shape && output.size_bytes() != input.size_bytes())) {
    return Failed(ffi::Error::Internal(
        what + ": XLA passed an output buffer that does not match the input "
               "(a bug in tfring's XLA lowering)."));
  }
  request.shape.clear();
  for (int64_t dim : input.dimensions()) request.shape.push_back(dim);

  TensorBuffers buffers;
  buffers.input = input.untyped_data();
  if (same_shape) {
    buffers.output = output.untyped_data();
  } else {
    // The core names the output shape it needs; XLA's was fixed at compile
    // time from the same rule, and a job restarted at another size would
    // not match it.
    std::vector<int64_t> compiled(output.dimensions().begin(),
                                  output.dimensions().end());
    void* data = output.untyped_data();
    buffers.allocate_output = [compiled, data, what](
                                  const std::vector<int64_t>& shape,
                                  void** out) -> ::tfring::Status {
      if (shape != compiled) {
        return ::tfring::Status::FailedPrecondition(
            what + ": this rank's block has shape " + ShapeToString(shape) +
            " but the XLA program was compiled for " + ShapeToString(compiled) +
            " (the job's size or this rank changed since it was compiled). "
            "Retrace the function after tfring.init().");
      }
      *out = data;
      return ::tfring::Status::OK();
    };
  }

  ffi::Promise promise;
  ffi::Future future(promise);
  ::tfring::Status status =
      Enqueue(std::move(request), std::move(buffers),
              [promise](const ::tfring::Status& result) mutable {
                if (result.ok()) {
                  promise.SetAvailable();
                } else {
                  promise.SetError(ToFfiError(result));
                }
              });
  if (!status.ok()) promise.SetError(ToFfiError(status));
  return future;
}

ffi::Future AllreduceImpl(ffi::AnyBuffer input,
                          ffi::Result<ffi::AnyBuffer> output,
                          std::string_view name, int32_t process_set_id,
                          int32_t reduce_op, float prescale_factor,
                          float postscale_factor, int32_t compression) {
  Request request;
  request.name = std::string(name);
  request.process_set_id = process_set_id;
  request.type = CollectiveType::kAllreduce;
  request.reduce_op = static_cast<ReduceOp>(reduce_op);
  // Checked when the function was compiled (xla_kernels.cc).
  request.compression = static_cast<WireCompression>(compression);
  // As in the TensorFlow kernel: float attributes widened to double, so a
  // rank running XLA and one running the graph kernel agree.
  request.prescale_factor = prescale_factor;
  request.postscale_factor = postscale_factor;
  return Submit(std::move(request), "allreduce", input, *output);
}

ffi::Future ReducescatterImpl(ffi::AnyBuffer input,
                              ffi::Result<ffi::AnyBuffer> output,
                              std::string_view name,
                              int32_t process_set_id, int32_t reduce_op,
                              float prescale_factor, float postscale_factor) {
  Request request;
  request.name = std::string(name);
  request.process_set_id = process_set_id;
  request.type = CollectiveType::kReducescatter;
  request.reduce_op = static_cast<ReduceOp>(reduce_op);
  request.prescale_factor = prescale_factor;
  request.postscale_factor = postscale_factor;
  return Submit(std::move(request), "reducescatter", input, *output);
}

ffi::Future BroadcastImpl(ffi::AnyBuffer input,
                          ffi::Result<ffi::AnyBuffer> output,
                          std::string_view name, int32_t process_set_id,
                          int32_t root_rank) {
  Request request;
  request.name = std::string(name);
  request.process_set_id = process_set_id;
  request.type = CollectiveType::kBroadcast;
  request.root_rank = root_rank;
  if (IsInitialized()) {
    const int32_t size = GetTopology().size;
    if (root_rank < 0 || root_rank >= size) {
      return Failed(ffi::Error::InvalidArgument(
          "broadcast of tensor '" + request.name + "': root_rank " +
          std::to_string(root_rank) + " is not a rank of this job (size " +
          std::to_string(size) + ", ranks 0.." + std::to_string(size - 1) +
          "). Pass the rank that holds the values to send."));
    }
  }
  return Submit(std::move(request), "broadcast", input, *output);
}

XLA_FFI_DEFINE_HANDLER(kAllreduceHandler, AllreduceImpl,
                       ffi::Ffi::Bind()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<std::string_view>(xla_abi::kNameAttr)
                           .Attr<int32_t>(xla_abi::kProcessSetIdAttr)
                           .Attr<int32_t>(xla_abi::kReduceOpAttr)
                           .Attr<float>(xla_abi::kPrescaleAttr)
                           .Attr<float>(xla_abi::kPostscaleAttr)
                           .Attr<int32_t>(xla_abi::kCompressionAttr));

XLA_FFI_DEFINE_HANDLER(kReducescatterHandler, ReducescatterImpl,
                       ffi::Ffi::Bind()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<std::string_view>(xla_abi::kNameAttr)
                           .Attr<int32_t>(xla_abi::kProcessSetIdAttr)
                           .Attr<int32_t>(xla_abi::kReduceOpAttr)
                           .Attr<float>(xla_abi::kPrescaleAttr)
                           .Attr<float>(xla_abi::kPostscaleAttr));

XLA_FFI_DEFINE_HANDLER(kBroadcastHandler, BroadcastImpl,
                       ffi::Ffi::Bind()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<std::string_view>(xla_abi::kNameAttr)
                           .Attr<int32_t>(xla_abi::kProcessSetIdAttr)
                           .Attr<int32_t>(xla_abi::kRootRankAttr));

XLA_FFI_REGISTER_HANDLER(::xla::ffi::GetXlaFfiApi(), xla_abi::kAllreduceTarget,
                         xla_abi::kPlatform, kAllreduceHandler);
XLA_FFI_REGISTER_HANDLER(::xla::ffi::GetXlaFfiApi(), xla_abi::kBroadcastTarget,
                         xla_abi::kPlatform, kBroadcastHandler);
XLA_FFI_REGISTER_HANDLER(::xla::ffi::GetXlaFfiApi(),
                         xla_abi::kReducescatterTarget, xla_abi::kPlatform,
                         kReducescatterHandler);

}  // namespace
}  // namespace tf_ops
}  // namespace tfring
