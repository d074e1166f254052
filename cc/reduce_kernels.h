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

// result[i] = sources[0][i] op sources[1][i] op ... op sources[n-1][i],
// folded in that order (so the same sources give the same bits everywhere).
// float16 and bfloat16 accumulate in float and are rounded once. `result`
// must not overlap a source; num_sources >= 1.
void ReduceSources(DataType dtype, ReduceOp op, const void* const* sources, int num_sources,
                   void* result, int64_t count);

// dst[i] = src[i] * factor / divisor (src may equal dst); divisor >= 1.
// Floating types multiply once by factor / divisor in their own precision
// (16-bit floats through float). Integers are exact where they can be:
// multiplied by `factor` in double precision and truncated toward zero only
// when factor != 1, then divided by `divisor` in integer arithmetic
// (truncating toward zero), so an int64 Average keeps all 64 bits. With
// factor 1 and divisor 1 it is a plain copy.
void ScaleCopy(DataType dtype, const void* src, void* dst, int64_t count, double factor,
               int64_t divisor = 1);

// IEEE half and bfloat16 conversions (round to nearest even).
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);
float BFloat16ToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);

}  // namespace tfring

#endif  // TFRING_CC_REDUCE_KERNELS_H_
