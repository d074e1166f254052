// Encodings of float32 data for the links between hosts (WireCompression).
//
// Why: across hosts the network, not arithmetic, bounds an allreduce. Sending
// 16 bits per value halves the bytes; the receiver widens each value back to
// float32 before adding, so accumulation keeps float32's range and precision.
//
// bf16: the upper 16 bits of the float32, rounded to nearest even (NaN stays
// NaN). Same range as float32, 8 bits of mantissa.
// fp16: blocks of kFp16BlockValues values; each block carries an int16 power
// of two that scales its largest magnitude just below 2^15, so no finite
// value overflows float16's 65504 and small blocks keep 11 bits of mantissa.
// Infinities and NaN pass through as themselves.
#ifndef TFRING_CC_TRANSPORT_WIRE_CODEC_H_
#define TFRING_CC_TRANSPORT_WIRE_CODEC_H_

#include <cstdint>

#include "cc/common.h"

namespace tfring {

constexpr int64_t kFp16BlockValues = 256;

// Bytes EncodeWire writes for `count` values (kNone: float32 as is).
int64_t EncodedBytes(int64_t count, WireCompression compression);
// Writes `count` values from `values` to `encoded` (EncodedBytes of them).
void EncodeWire(const float* values, int64_t count, WireCompression compression, void* encoded);
// values[i] = decoded value i.
void DecodeWire(const void* encoded, int64_t count, WireCompression compression, float* values);
// sums[i] += decoded value i, in float32.
void AccumulateWire(const void* encoded, int64_t count, WireCompression compression,
                    float* sums);

// (One value each way: FloatToHalf, FloatToBFloat16 and their inverses in
// reduce_kernels.h, rounding to nearest even.)
// The power of two EncodeWire(kFp16) multiplies a block whose largest finite
// magnitude is `largest` by (0 for a block of zeros or no finite values).
int16_t Fp16BlockExponent(float largest);

}  // namespace tfring

#endif  // TFRING_CC_TRANSPORT_WIRE_CODEC_H_
