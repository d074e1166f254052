// Element-wise arithmetic on raw buffers of any supported dtype: reduction of
// one buffer into another, and scaling (pre/post scale factors, Average).
//
// Why here and not in the transport: MPI has no float16 or bfloat16 types, so
// the MPI transport registers custom reduction ops that call ReduceInto; the
// loopback transport reduces with it directly; fusion copies scale with it.
#ifndef TFRING_CC_REDUCE_KERNELS_H_
#define TFRING_CC_REDUCE_KERNELS_H_

#include <cstdint>

#include "cc/common.h"

namespace tfring {

// inout[i] = op(inout[i], in[i]) for i < count. op: Sum, Min, Max, Product.
void ReduceInto(DataType dtype, ReduceOp op, const void* in, void* inout, int64_t count);

// dst[i] = src[i] * factor (src may equal dst). Integers are scaled in double
// precision and truncated toward zero. A factor of exactly 1 is a plain copy.
void ScaleCopy(DataType dtype, const void* src, void* dst, int64_t count, double factor);

// IEEE half and bfloat16 conversions (round to nearest even).
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);
float BFloat16ToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);

}  // namespace tfring

#endif  // TFRING_CC_REDUCE_KERNELS_H_
