#include "cc/common.h"

#include <sstream>

namespace tfring {

int64_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kUInt16:
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kUInt16: return "uint16";
    case DataType::kInt16: return "int16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kAdasum: return "Adasum";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kProduct: return "Product";
  }
  return "unknown";
}

const char* WireCompressionName(WireCompression compression) {
  switch (compression) {
    case WireCompression::kNone: return "none";
    case WireCompression::kBf16: return "bf16";
    case WireCompression::kFp16: return "fp16";
  }
  return "unknown";
}

WireCompression ResolveWireCompression(const Request& request, WireCompression requested,
                                       WireCompression job_default) {
  const bool applies = request.type == CollectiveType::kAllreduce &&
                       request.dtype == DataType::kFloat32 &&
                       (request.reduce_op == ReduceOp::kSum ||
                        request.reduce_op == ReduceOp::kAverage);
  if (!applies) return WireCompression::kNone;
  return requested != WireCompression::kNone ? requested : job_default;
}

const char* CollectiveTypeName(CollectiveType type) {
  switch (type) {
    case CollectiveType::kAllreduce: return "allreduce";
    case CollectiveType::kAllgather: return "allgather";
    case CollectiveType::kBroadcast: return "broadcast";
    case CollectiveType::kAlltoall: return "alltoall";
    case CollectiveType::kReducescatter: return "reducescatter";
    case CollectiveType::kJoin: return "join";
  }
  return "unknown";
}

bool IsReduction(CollectiveType type) {
  return type == CollectiveType::kAllreduce || type == CollectiveType::kReducescatter;
}

bool HasRunTimeShape(CollectiveType type) {
  return type == CollectiveType::kAllgather || type == CollectiveType::kAlltoall;
}

bool IsImplementedReduceOp(int32_t op) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kProduct:
      return true;
    default:  // Adasum, or not a ReduceOp value at all
      return false;
  }
}

bool IsReducible(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
      return true;
    default:
      return false;
  }
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out << ", ";
    out << shape[i];
  }
  out << "]";
  return out.str();
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

std::string RanksToString(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    text += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  }
  return text;
}

}  // namespace tfring
