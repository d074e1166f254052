// Vocabulary shared by every layer: data types, reduction ops, collective
// kinds, and the description of one tensor handed to the core.
//
// Why one file: these enums cross the C++/Python boundary through pybind11
// (tfring._core), so Python never keeps a hand-copied list of their values.
// ReduceOp values match horovod.tensorflow's constants so scripts that pass
// them around as integers keep working.
#ifndef TFRING_CC_COMMON_H_
#define TFRING_CC_COMMON_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

// Marks the symbols libtfring_core.so exports (it is built with
// -fvisibility=hidden): the API plus the helpers the front ends use.
#define TFRING_EXPORT __attribute__((visibility("default")))

namespace tfring {

enum class DataType : int32_t {
  kUInt8 = 0,
  kInt8 = 1,
  kUInt16 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat16 = 6,
  kBFloat16 = 7,
  kFloat32 = 8,
  kFloat64 = 9,
  kBool = 10,
};

enum class ReduceOp : int32_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,  // Reserved for Horovod compatibility; not implemented.
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};

enum class CollectiveType : int32_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  // A rank out of data: until every rank has joined, it takes part in the
  // others' allreduces with zeros. Completes with the last rank to join.
  kJoin = 5,
};

// How an allreduce's data is encoded where it crosses hosts. The ranks of a
// host always reduce in full precision; only the cross-host exchange is
// encoded, and arrivals are summed in float32. Applies to float32 Sum and
// Average only (ResolveWireCompression); anything else moves uncompressed.
enum class WireCompression : int32_t {
  kNone = 0,
  kBf16 = 1,  // bfloat16, round to nearest even
  kFp16 = 2,  // float16 with a power-of-two scale per block (cannot overflow)
};

// "none", "bf16", "fp16" (the values TFRING_WIRE_COMPRESSION takes).
TFRING_EXPORT const char* WireCompressionName(WireCompression compression);

// The name under which every rank submits its join.
inline constexpr char kJoinTensorName[] = "tfring.join";

// Bytes per element of `dtype`.
TFRING_EXPORT int64_t DataTypeSize(DataType dtype);
// "float32", "int64", ... as users know them from TensorFlow.
TFRING_EXPORT const char* DataTypeName(DataType dtype);
// "Sum", "Average", ...
TFRING_EXPORT const char* ReduceOpName(ReduceOp op);
// "allreduce", "allgather", "broadcast", "alltoall", "reducescatter".
TFRING_EXPORT const char* CollectiveTypeName(CollectiveType type);
// Whether `op` (a ReduceOp value as an integer, as front ends receive it) is
// one the core implements: Average, Sum, Min, Max, Product.
TFRING_EXPORT bool IsImplementedReduceOp(int32_t op);
// Whether a reduction of `dtype` is supported by the core (allreduce,
// reducescatter).
TFRING_EXPORT bool IsReducible(DataType dtype);
// "[2, 3]" for printing shapes in error messages.
TFRING_EXPORT std::string ShapeToString(const std::vector<int64_t>& shape);
TFRING_EXPORT int64_t NumElements(const std::vector<int64_t>& shape);
// Whether the collective reduces values (and so takes an op and scale factors).
TFRING_EXPORT bool IsReduction(CollectiveType type);
// Whether the output's first dimension depends on the other ranks' inputs,
// which the core exchanges when the collective runs (allgather, alltoall).
TFRING_EXPORT bool HasRunTimeShape(CollectiveType type);
// "rank 2" or "ranks 0, 3", for messages that name ranks.
std::string RanksToString(const std::vector<int>& ranks);

// Everything the ranks must agree on about one named tensor before any data
// moves. Built by the framework binding, negotiated by the controller.
struct Request {
  std::string name;
  CollectiveType type = CollectiveType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp reduce_op = ReduceOp::kSum;  // allreduce and reducescatter
  int32_t root_rank = 0;                // broadcast only
  double prescale_factor = 1.0;         // allreduce and reducescatter
  double postscale_factor = 1.0;        // allreduce and reducescatter
  int32_t rank = 0;                     // the submitting rank (filled by core)
  // The process set the collective runs in (0: every rank of the job). Ranks
  // in error messages and root_rank are the job's ranks, not the set's.
  int32_t process_set_id = 0;
  // Allreduce only: the encoding across hosts (resolved at Enqueue with the
  // job's TFRING_WIRE_COMPRESSION; kNone where it does not apply).
  WireCompression compression = WireCompression::kNone;
};

// The compression `request` travels with: `requested` (the front end's
// choice), else the job's `job_default`, for float32 Sum/Average allreduces;
// kNone for every other collective, dtype and op.
TFRING_EXPORT WireCompression ResolveWireCompression(const Request& request,
                                                     WireCompression requested,
                                                     WireCompression job_default);

// One tensor of a multi-tensor allreduce (Transport::AllreduceSpans):
// `count` elements reduced from `input` into `output` (the same buffer, or
// buffers that overlap no other span's), the result then multiplied by
// factor / divisor as ScaleCopy does (reduce_kernels.h).
struct ReduceSpan {
  const void* input = nullptr;
  void* output = nullptr;
  int64_t count = 0;
  double factor = 1.0;
  int64_t divisor = 1;
};

// A request and the moment the framework handed it to the core: the stall
// check and the timeline's readiness marks count from there.
struct SubmittedRequest {
  Request request;
  std::chrono::steady_clock::time_point submitted;
};

}  // namespace tfring

#endif  // TFRING_CC_COMMON_H_
