#include "cc/reduce_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cc/logging.h"

namespace tfring {
namespace {

// The element-wise loops are written to vectorise; GCC does so only from -O3
// or when asked (its -O2 cost model rejects loops that need an aliasing
// check or a scalar tail, which is all of these).
#if defined(__GNUC__) && !defined(__clang__)
#define TFRING_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define TFRING_VECTORIZE
#endif

// A 16-bit float stored as its bits, converted through float for arithmetic.
struct HalfTraits {
  static float ToFloat(uint16_t bits) { return HalfToFloat(bits); }
  static uint16_t FromFloat(float value) { return FloatToHalf(value); }
};
struct BFloat16Traits {
  static float ToFloat(uint16_t bits) { return BFloat16ToFloat(bits); }
  static uint16_t FromFloat(float value) { return FloatToBFloat16(value); }
};

template <typename T>
T Combine(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kProduct: return a * b;
    default: TFRING_CHECK(false, "unsupported reduction " << ReduceOpName(op));
  }
}

template <typename T>
TFRING_VECTORIZE void ReduceTyped(ReduceOp op, const void* in, void* inout, int64_t count) {
  const T* src = static_cast<const T*>(in);
  T* dst = static_cast<T*>(inout);
  // Separate loops per op so each one vectorizes.
  switch (op) {
    case ReduceOp::kSum:
      for (int64_t i = 0; i < count; ++i) dst[i] = dst[i] + src[i];
      return;
    case ReduceOp::kProduct:
      for (int64_t i = 0; i < count; ++i) dst[i] = dst[i] * src[i];
      return;
    default:
      for (int64_t i = 0; i < count; ++i) dst[i] = Combine(op, dst[i], src[i]);
  }
}

template <typename Traits>
TFRING_VECTORIZE void ReduceSixteenBit(ReduceOp op, const void* in, void* inout, int64_t count) {
  const uint16_t* src = static_cast<const uint16_t*>(in);
  uint16_t* dst = static_cast<uint16_t*>(inout);
  for (int64_t i = 0; i < count; ++i) {
    float result = Combine(op, Traits::ToFloat(dst[i]), Traits::ToFloat(src[i]));
    dst[i] = Traits::FromFloat(result);
  }
}

// result = a op b, element-wise; result overlaps neither.
template <typename T>
TFRING_VECTORIZE void CombineTyped(ReduceOp op, const T* __restrict a, const T* __restrict b,
                                   T* __restrict result, int64_t count) {
  switch (op) {
    case ReduceOp::kSum:
      for (int64_t i = 0; i < count; ++i) result[i] = a[i] + b[i];
      return;
    case ReduceOp::kProduct:
      for (int64_t i = 0; i < count; ++i) result[i] = a[i] * b[i];
      return;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < count; ++i) result[i] = b[i] < a[i] ? b[i] : a[i];
      return;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < count; ++i) result[i] = a[i] < b[i] ? b[i] : a[i];
      return;
    default: TFRING_CHECK(false, "unsupported reduction " << ReduceOpName(op));
  }
}

template <typename T>
void ReduceSourcesTyped(ReduceOp op, const void* const* sources, int num_sources, void* result,
                        int64_t count) {
  T* out = static_cast<T*>(result);
  if (num_sources == 1) {
    std::memcpy(out, sources[0], count * sizeof(T));
    return;
  }
  CombineTyped<T>(op, static_cast<const T*>(sources[0]), static_cast<const T*>(sources[1]), out,
                  count);
  for (int s = 2; s < num_sources; ++s) ReduceTyped<T>(op, sources[s], out, count);
}

// 16-bit floats: widened into a float accumulator block by block, rounded
// once at the end.
template <typename Traits>
TFRING_VECTORIZE void ReduceSourcesSixteenBit(ReduceOp op, const void* const* sources,
                                              int num_sources, void* result, int64_t count) {
  constexpr int64_t kBlock = 1024;
  float accumulator[kBlock];
  uint16_t* out = static_cast<uint16_t*>(result);
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    const uint16_t* first = static_cast<const uint16_t*>(sources[0]) + begin;
    for (int64_t i = 0; i < n; ++i) accumulator[i] = Traits::ToFloat(first[i]);
    for (int s = 1; s < num_sources; ++s) {
      const uint16_t* in = static_cast<const uint16_t*>(sources[s]) + begin;
      for (int64_t i = 0; i < n; ++i) {
        accumulator[i] = Combine(op, accumulator[i], Traits::ToFloat(in[i]));
      }
    }
    for (int64_t i = 0; i < n; ++i) out[begin + i] = Traits::FromFloat(accumulator[i]);
  }
}

template <typename T>
TFRING_VECTORIZE void ScaleTyped(const void* src, void* dst, int64_t count, double factor, int64_t divisor) {
  const T* in = static_cast<const T*>(src);
  T* out = static_cast<T*>(dst);
  if (std::is_floating_point<T>::value) {
    const T typed_factor = static_cast<T>(factor / static_cast<double>(divisor));
    for (int64_t i = 0; i < count; ++i) out[i] = in[i] * typed_factor;
    return;
  }
  if (factor != 1.0) {
    for (int64_t i = 0; i < count; ++i) {
      out[i] = static_cast<T>(std::trunc(static_cast<double>(in[i]) * factor));
    }
    in = out;
  }
  if (divisor != 1) {
    // In T's own arithmetic (promoted to int64 for the narrow types), which
    // truncates toward zero.
    const int64_t typed_divisor = divisor;
    for (int64_t i = 0; i < count; ++i) {
      out[i] = static_cast<T>(static_cast<int64_t>(in[i]) / typed_divisor);
    }
  } else if (in != out) {
    std::memcpy(out, in, count * sizeof(T));
  }
}

template <typename Traits>
TFRING_VECTORIZE void ScaleSixteenBit(const void* src, void* dst, int64_t count, double factor, int64_t divisor) {
  const uint16_t* in = static_cast<const uint16_t*>(src);
  uint16_t* out = static_cast<uint16_t*>(dst);
  const float typed_factor = static_cast<float>(factor / static_cast<double>(divisor));
  for (int64_t i = 0; i < count; ++i) {
    out[i] = Traits::FromFloat(Traits::ToFloat(in[i]) * typed_factor);
  }
}

}  // namespace

void ReduceInto(DataType dtype, ReduceOp op, const void* in, void* inout, int64_t count) {
  switch (dtype) {
    case DataType::kUInt8: return ReduceTyped<uint8_t>(op, in, inout, count);
    case DataType::kInt8: return ReduceTyped<int8_t>(op, in, inout, count);
    case DataType::kUInt16: return ReduceTyped<uint16_t>(op, in, inout, count);
    case DataType::kInt16: return ReduceTyped<int16_t>(op, in, inout, count);
    case DataType::kInt32: return ReduceTyped<int32_t>(op, in, inout, count);
    case DataType::kInt64: return ReduceTyped<int64_t>(op, in, inout, count);
    case DataType::kFloat32: return ReduceTyped<float>(op, in, inout, count);
    case DataType::kFloat64: return ReduceTyped<double>(op, in, inout, count);
    case DataType::kFloat16: return ReduceSixteenBit<HalfTraits>(op, in, inout, count);
    case DataType::kBFloat16: return ReduceSixteenBit<BFloat16Traits>(op, in, inout, count);
    case DataType::kBool: return ReduceTyped<uint8_t>(op, in, inout, count);
  }
}

void ReduceSources(DataType dtype, ReduceOp op, const void* const* sources, int num_sources,
                   void* result, int64_t count) {
  TFRING_CHECK(num_sources >= 1, "no sources to reduce");
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kBool:
      return ReduceSourcesTyped<uint8_t>(op, sources, num_sources, result, count);
    case DataType::kInt8: return ReduceSourcesTyped<int8_t>(op, sources, num_sources, result, count);
    case DataType::kUInt16:
      return ReduceSourcesTyped<uint16_t>(op, sources, num_sources, result, count);
    case DataType::kInt16:
      return ReduceSourcesTyped<int16_t>(op, sources, num_sources, result, count);
    case DataType::kInt32:
      return ReduceSourcesTyped<int32_t>(op, sources, num_sources, result, count);
    case DataType::kInt64:
      return ReduceSourcesTyped<int64_t>(op, sources, num_sources, result, count);
    case DataType::kFloat32:
      return ReduceSourcesTyped<float>(op, sources, num_sources, result, count);
    case DataType::kFloat64:
      return ReduceSourcesTyped<double>(op, sources, num_sources, result, count);
    case DataType::kFloat16:
      return ReduceSourcesSixteenBit<HalfTraits>(op, sources, num_sources, result, count);
    case DataType::kBFloat16:
      return ReduceSourcesSixteenBit<BFloat16Traits>(op, sources, num_sources, result, count);
  }
}

void ScaleCopy(DataType dtype, const void* src, void* dst, int64_t count, double factor,
               int64_t divisor) {
  TFRING_CHECK(divisor >= 1, "divisor " << divisor);
  if (factor == 1.0 && divisor == 1) {
    if (src != dst) std::memcpy(dst, src, count * DataTypeSize(dtype));
    return;
  }
  switch (dtype) {
    case DataType::kUInt8: return ScaleTyped<uint8_t>(src, dst, count, factor, divisor);
    case DataType::kInt8: return ScaleTyped<int8_t>(src, dst, count, factor, divisor);
    case DataType::kUInt16: return ScaleTyped<uint16_t>(src, dst, count, factor, divisor);
    case DataType::kInt16: return ScaleTyped<int16_t>(src, dst, count, factor, divisor);
    case DataType::kInt32: return ScaleTyped<int32_t>(src, dst, count, factor, divisor);
    case DataType::kInt64: return ScaleTyped<int64_t>(src, dst, count, factor, divisor);
    case DataType::kFloat32: return ScaleTyped<float>(src, dst, count, factor, divisor);
    case DataType::kFloat64: return ScaleTyped<double>(src, dst, count, factor, divisor);
    case DataType::kFloat16:
      return ScaleSixteenBit<HalfTraits>(src, dst, count, factor, divisor);
    case DataType::kBFloat16:
      return ScaleSixteenBit<BFloat16Traits>(src, dst, count, factor, divisor);
    case DataType::kBool: return ScaleTyped<uint8_t>(src, dst, count, factor, divisor);
  }
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  uint32_t exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  uint32_t result;
  if (exponent == 0x1f) {  // inf or nan
    result = sign | 0x7f800000 | (mantissa << 13);
  } else if (exponent == 0) {
    if (mantissa == 0) {
      result = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ff;
      result = sign | (exponent << 23) | (mantissa << 13);
    }
  } else {
    result = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &result, sizeof(value));
  return value;
}

uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs_bits = bits & 0x7fffffff;
  if (abs_bits >= 0x7f800000) {  // inf or nan
    return sign | 0x7c00 | (abs_bits > 0x7f800000 ? 0x200 : 0);
  }
  if (abs_bits >= 0x477ff000) return sign | 0x7c00;  // rounds to >= 65520: inf
  if (abs_bits < 0x38800000) {                        // below the smallest normal half
    if (abs_bits < 0x33000000) return sign;           // rounds to zero
    // Subnormal half: value = mantissa * 2^(exponent - 150) and one half
    // subnormal step is 2^-24, so the half's bits are mantissa >> (126 - exponent).
    const uint32_t exponent = abs_bits >> 23;
    const uint32_t mantissa = (abs_bits & 0x7fffff) | 0x800000;
    const int right = 126 - static_cast<int>(exponent);
    uint32_t half = mantissa >> right;
    const uint32_t remainder = mantissa & ((1u << right) - 1);
    const uint32_t halfway = 1u << (right - 1);
    if (remainder > halfway || (remainder == halfway && (half & 1))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  // Normal: rebias the exponent and round the mantissa to 10 bits.
  uint32_t half = ((abs_bits >> 23) - 127 + 15) << 10 | ((abs_bits >> 13) & 0x3ff);
  const uint32_t remainder = abs_bits & 0x1fff;
  if (remainder > 0x1000 || (remainder == 0x1000 && (half & 1))) ++half;
  return sign | static_cast<uint16_t>(half);
}

float BFloat16ToFloat(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

uint16_t FloatToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace tfring
