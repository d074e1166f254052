#include "cc/transport/wire_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cc/reduce_kernels.h"

namespace tfring {
namespace {

constexpr double kLargestFloat = std::numeric_limits<float>::max();

int64_t BlockCount(int64_t count) { return (count + kFp16BlockValues - 1) / kFp16BlockValues; }

// Calls emit(i, value) for every decoded value, in order.
template <typename Emit>
void ForEachDecoded(const void* encoded, int64_t count, WireCompression compression, Emit emit) {
  if (compression == WireCompression::kNone) {
    const float* values = static_cast<const float*>(encoded);
    for (int64_t i = 0; i < count; ++i) emit(i, values[i]);
    return;
  }
  if (compression == WireCompression::kBf16) {
    const uint16_t* halves = static_cast<const uint16_t*>(encoded);
    for (int64_t i = 0; i < count; ++i) emit(i, BFloat16ToFloat(halves[i]));
    return;
  }
  // fp16: the blocks' exponents, then the values.
  const int64_t blocks = BlockCount(count);
  const int16_t* exponents = static_cast<const int16_t*>(encoded);
  const uint16_t* halves = reinterpret_cast<const uint16_t*>(exponents + blocks);
  for (int64_t block = 0; block < blocks; ++block) {
    const double unscale = std::ldexp(1.0, -exponents[block]);
    const int64_t end = std::min(count, (block + 1) * kFp16BlockValues);
    for (int64_t i = block * kFp16BlockValues; i < end; ++i) {
      const double value = static_cast<double>(HalfToFloat(halves[i])) * unscale;
      // A finite half stays finite: the rounding of float32's largest values
      // up to the next power of two must not turn them into infinities.
      emit(i, !std::isfinite(value) ? static_cast<float>(value)
                                    : static_cast<float>(std::max(-kLargestFloat,
                                                                  std::min(kLargestFloat, value))));
    }
  }
}

}  // namespace

int16_t Fp16BlockExponent(float largest) {
  if (!(largest > 0) || !std::isfinite(largest)) return 0;
  int power = 0;
  std::frexp(largest, &power);  // largest < 2^power
  return static_cast<int16_t>(15 - power);  // largest * 2^(15 - power) < 2^15
}

int64_t EncodedBytes(int64_t count, WireCompression compression) {
  switch (compression) {
    case WireCompression::kNone: return count * 4;
    case WireCompression::kBf16: return count * 2;
    case WireCompression::kFp16: return BlockCount(count) * 2 + count * 2;
  }
  return count * 4;
}

void EncodeWire(const float* values, int64_t count, WireCompression compression, void* encoded) {
  if (compression == WireCompression::kNone) {
    std::memcpy(encoded, values, count * sizeof(float));
    return;
  }
  if (compression == WireCompression::kBf16) {
    uint16_t* halves = static_cast<uint16_t*>(encoded);
    for (int64_t i = 0; i < count; ++i) halves[i] = FloatToBFloat16(values[i]);
    return;
  }
  const int64_t blocks = BlockCount(count);
  int16_t* exponents = static_cast<int16_t*>(encoded);
  uint16_t* halves = reinterpret_cast<uint16_t*>(exponents + blocks);
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t begin = block * kFp16BlockValues;
    const int64_t end = std::min(count, begin + kFp16BlockValues);
    float largest = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      const float magnitude = std::fabs(values[i]);
      if (std::isfinite(magnitude) && magnitude > largest) largest = magnitude;
    }
    exponents[block] = Fp16BlockExponent(largest);
    const double scale = std::ldexp(1.0, exponents[block]);
    for (int64_t i = begin; i < end; ++i) {
      halves[i] = FloatToHalf(static_cast<float>(static_cast<double>(values[i]) * scale));
    }
  }
}

void DecodeWire(const void* encoded, int64_t count, WireCompression compression, float* values) {
  ForEachDecoded(encoded, count, compression, [values](int64_t i, float v) { values[i] = v; });
}

void AccumulateWire(const void* encoded, int64_t count, WireCompression compression,
                    float* sums) {
  ForEachDecoded(encoded, count, compression, [sums](int64_t i, float v) { sums[i] += v; });
}

}  // namespace tfring
