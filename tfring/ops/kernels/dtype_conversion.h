// Maps TensorFlow's DataType enum onto the core's tfring::DataType.
//
// Why: the core must not include TensorFlow headers, so the op library is
// the only place that knows both enums. The ops' type attributes already
// restrict T to the types listed here; an unmapped type is reported as
// InvalidArgument rather than trusted.
#ifndef TFRING_OPS_KERNELS_DTYPE_CONVERSION_H_
#define TFRING_OPS_KERNELS_DTYPE_CONVERSION_H_

#include "absl/status/status.h"
#include "cc/api.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/framework/types.pb.h"

namespace tfring {
namespace tf_ops {

inline absl::Status ToCoreDataType(tensorflow::DataType tf_dtype,
                                   ::tfring::DataType* dtype) {
  switch (tf_dtype) {
    case tensorflow::DT_UINT8:
      *dtype = ::tfring::DataType::kUInt8;
      return absl::OkStatus();
    case tensorflow::DT_INT8:
      *dtype = ::tfring::DataType::kInt8;
      return absl::OkStatus();
    case tensorflow::DT_UINT16:
      *dtype = ::tfring::DataType::kUInt16;
      return absl::OkStatus();
    case tensorflow::DT_INT16:
      *dtype = ::tfring::DataType::kInt16;
      return absl::OkStatus();
    case tensorflow::DT_INT32:
      *dtype = ::tfring::DataType::kInt32;
      return absl::OkStatus();
    case tensorflow::DT_INT64:
      *dtype = ::tfring::DataType::kInt64;
      return absl::OkStatus();
    case tensorflow::DT_HALF:
      *dtype = ::tfring::DataType::kFloat16;
      return absl::OkStatus();
    case tensorflow::DT_BFLOAT16:
      *dtype = ::tfring::DataType::kBFloat16;
      return absl::OkStatus();
    case tensorflow::DT_FLOAT:
      *dtype = ::tfring::DataType::kFloat32;
      return absl::OkStatus();
    case tensorflow::DT_DOUBLE:
      *dtype = ::tfring::DataType::kFloat64;
      return absl::OkStatus();
    case tensorflow::DT_BOOL:
      *dtype = ::tfring::DataType::kBool;
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          "tfring does not support tensors of type " +
          tensorflow::DataTypeString(tf_dtype) +
          "; supported types are uint8, int8, uint16, int16, int32, int64, "
          "float16, bfloat16, float32, float64 and bool.");
  }
}

}  // namespace tf_ops
}  // namespace tfring

#endif  // TFRING_OPS_KERNELS_DTYPE_CONVERSION_H_
