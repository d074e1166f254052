// Scenarios for the wire codec (cc/transport/wire_codec.h) and the
// compressed cross-host sum (cross_host_sum.h, hierarchical_transport.h),
// and the measured choice between the flat and hierarchical paths
// (path_trial.h).
// Usage: wire_compression_test <scenario|all|list> <world size>; ranks are
// threads over loopback worlds (tests/test_wire_compression_core.py).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cc/reduce_kernels.h"
#include "cc/transport/cross_host_sum.h"
#include "cc/transport/hierarchical_transport.h"
#include "cc/transport/loopback_transport.h"
#include "cc/transport/path_trial.h"
#include "cc/transport/wire_codec.h"
#include "tests/cc/expect.h"

namespace tfring {
namespace testing {
namespace {

const WireCompression kModes[] = {WireCompression::kNone, WireCompression::kBf16,
                                  WireCompression::kFp16};

// The largest error of one encoding of `value` in a block whose largest
// magnitude is `largest`: half a unit in the last place of the 16-bit form.
double EncodingBound(double value, double largest, WireCompression mode) {
  switch (mode) {
    case WireCompression::kNone: return 0.0;
    case WireCompression::kBf16: return std::ldexp(std::fabs(value), -8);
    // 11 significant bits; values far below the block's largest fall into
    // float16's subnormals, spaced 2^-24 of the scaled unit (largest ~ 2^15).
    case WireCompression::kFp16: return std::ldexp(std::fabs(value), -11) + largest * std::ldexp(1.0, -39);
  }
  return 0.0;
}

std::vector<float> RoundTrip(const std::vector<float>& values, WireCompression mode) {
  std::vector<uint8_t> encoded(EncodedBytes(values.size(), mode));
  EncodeWire(values.data(), values.size(), mode, encoded.data());
  std::vector<float> decoded(values.size());
  DecodeWire(encoded.data(), values.size(), mode, decoded.data());
  return decoded;
}

void TestBf16Rounding(int) {
  // Ties go to the even neighbour; above the tie rounds up.
  EXPECT_TRUE(BFloat16ToFloat(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8))) == 1.0f, "tie to even (down)");
  EXPECT_TRUE(BFloat16ToFloat(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8))) ==
                  1.0f + std::ldexp(1.0f, -6),
              "tie to even (up)");
  EXPECT_TRUE(BFloat16ToFloat(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))) ==
                  1.0f + std::ldexp(1.0f, -7),
              "above the tie");
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))), "NaN stays NaN");
  EXPECT_TRUE(BFloat16ToFloat(FloatToBFloat16(-INFINITY)) == -INFINITY, "inf stays inf");
  EXPECT_TRUE(BFloat16ToFloat(FloatToBFloat16(3e38f)) == 3.0e38f || std::isfinite(BFloat16ToFloat(FloatToBFloat16(3e38f))),
              "large finite values keep float32's range");
}

void TestFp16Conversion(int) {
  // Every float16 survives float32 and back.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t half = static_cast<uint16_t>(bits);
    const float value = HalfToFloat(half);
    if (std::isnan(value)) continue;
    EXPECT_TRUE(FloatToHalf(value) == half, "half " << bits << " -> " << value);
  }
  EXPECT_TRUE(FloatToHalf(65520.0f) == 0x7C00, "beyond 65504 rounds to inf");
  EXPECT_TRUE(FloatToHalf(1.0f + std::ldexp(1.0f, -11)) == 0x3C00, "tie to even");
  EXPECT_TRUE(HalfToFloat(FloatToHalf(std::ldexp(1.0f, -25) * 1.5f)) == std::ldexp(1.0f, -24),
              "subnormal rounding");
}

void TestRoundTripBounds(int) {
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (WireCompression mode : kModes) {
    // Blocks of very different scales, a block of zeros, a short last block.
    std::vector<float> values(4 * kFp16BlockValues + 17);
    for (size_t i = 0; i < values.size(); ++i) {
      const int block = static_cast<int>(i / kFp16BlockValues);
      const float scale = block == 2 ? 0.0f : std::ldexp(1.0f, block * 37 - 60);
      values[i] = normal(random) * scale;
    }
    const std::vector<float> decoded = RoundTrip(values, mode);
    for (size_t begin = 0; begin < values.size(); begin += kFp16BlockValues) {
      const size_t end = std::min(values.size(), begin + kFp16BlockValues);
      double largest = 0;
      for (size_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs((double)values[i]));
      for (size_t i = begin; i < end; ++i) {
        const double error = std::fabs((double)decoded[i] - values[i]);
        EXPECT_TRUE(error <= EncodingBound(values[i], largest, mode),
                    WireCompressionName(mode) << " [" << i << "] " << values[i] << " -> "
                                              << decoded[i]);
      }
    }
  }
}

void TestFp16CannotOverflow(int) {
  const std::vector<float> values{1e30f, -3e38f, 1e-30f, 65504.0f * 4, -1.0f, 0.0f,
                                  std::numeric_limits<float>::max()};
  const std::vector<float> decoded = RoundTrip(values, WireCompression::kFp16);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_TRUE(std::isfinite(decoded[i]), values[i] << " -> " << decoded[i]);
    EXPECT_TRUE(std::fabs((double)decoded[i] - values[i]) <=
                    EncodingBound(values[i], std::numeric_limits<float>::max(),
                                  WireCompression::kFp16),
                values[i] << " -> " << decoded[i]);
  }
  const std::vector<float> special{INFINITY, -INFINITY, std::nanf(""), 2.0f};
  const std::vector<float> back = RoundTrip(special, WireCompression::kFp16);
  EXPECT_TRUE(back[0] == INFINITY && back[1] == -INFINITY && std::isnan(back[2]) && back[3] == 2.0f,
              back[0] << " " << back[1] << " " << back[2] << " " << back[3]);
}

// Rank r's value i (varied magnitudes, both signs).
float InputValue(int rank, int64_t i) {
  const float sign = (i + rank) % 3 == 0 ? -1.0f : 1.0f;
  return sign * (1.0f + 0.37f * rank + 0.011f * (i % 97)) * std::ldexp(1.0f, (i % 11) - 5);
}

// The float64 sum, and the sum of magnitudes (what the bound scales with).
void ExactSum(int size, int64_t i, double* sum, double* magnitude) {
  *sum = *magnitude = 0;
  for (int r = 0; r < size; ++r) {
    *sum += InputValue(r, i);
    *magnitude += std::fabs(InputValue(r, i));
  }
}

// Every value is encoded at most twice (the arrival, then the sum) and added
// in float32.
bool WithinBound(float got, int size, int64_t i, WireCompression mode, int64_t count) {
  double sum, magnitude;
  ExactSum(size, i, &sum, &magnitude);
  // fp16's subnormal floor scales with the block's largest sum: bound by the
  // largest magnitude any value here can take.
  const double block_largest = size * 2.5 * 32;
  const double bound = 2 * EncodingBound(magnitude, block_largest, mode) +
                       size * std::ldexp(magnitude, -22) + (count ? 0 : 0);
  return std::fabs(got - sum) <= bound;
}

// CrossHostSum over `size` ranks (each one "host"): every rank gets the same
// bits, within the bounds of the float64 sum.
void TestCrossHostSum(int size) {
  auto world = std::make_shared<LoopbackWorld>(size);
  for (WireCompression mode : kModes) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{size - 1 > 0 ? size - 1 : 1},
                          int64_t{1000}, int64_t{3 * kFp16BlockValues + 5}}) {
      std::vector<std::vector<float>> results(size);
      std::vector<std::thread> threads;
      for (int rank = 0; rank < size; ++rank) {
        threads.emplace_back([&, rank] {
          LoopbackTransport transport(world, rank);
          CrossHostSum sum;
          std::vector<float> values(count);
          for (int64_t i = 0; i < count; ++i) values[i] = InputValue(rank, i);
          for (int repeat = 0; repeat < 2; ++repeat) {  // scratch reused
            results[rank] = values;
            Status status = sum.Run(&transport, results[rank].data(), count, mode);
            EXPECT_TRUE(status.ok(), status.message());
          }
        });
      }
      for (std::thread& thread : threads) thread.join();
      for (int rank = 0; rank < size; ++rank) {
        EXPECT_TRUE(std::memcmp(results[rank].data(), results[0].data(), count * 4) == 0,
                    WireCompressionName(mode) << " count " << count << ": rank " << rank
                                              << " differs from rank 0");
      }
      for (int64_t i = 0; i < count; ++i) {
        EXPECT_TRUE(WithinBound(results[0][i], size, i, mode, count),
                    WireCompressionName(mode) << " [" << i << "] " << results[0][i]);
      }
    }
  }
}

// The same values summed at different offsets of the buffer (so that other
// ranks own their chunks, as when a step's tensors fuse differently) give
// the same bf16 bits: each element's sum does not depend on its owner.
void TestBf16SumIgnoresLayout(int size) {
  auto world = std::make_shared<LoopbackWorld>(size);
  const int64_t count = 1000;
  std::vector<std::vector<std::vector<float>>> results(size);  // [rank][shift]
  const std::vector<int64_t> shifts = {0, 1, 7, 333};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      LoopbackTransport transport(world, rank);
      CrossHostSum sum;
      for (int64_t shift : shifts) {
        // `shift` leading values, then the same `count` values every time.
        std::vector<float> values(shift + count);
        for (int64_t i = 0; i < shift; ++i) values[i] = InputValue(rank, count + i);
        for (int64_t i = 0; i < count; ++i) values[shift + i] = InputValue(rank, i);
        Status status = sum.Run(&transport, values.data(), shift + count, WireCompression::kBf16);
        EXPECT_TRUE(status.ok(), status.message());
        results[rank].emplace_back(values.begin() + shift, values.end());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t s = 1; s < shifts.size(); ++s) {
    EXPECT_TRUE(std::memcmp(results[0][s].data(), results[0][0].data(), count * 4) == 0,
                "size " << size << ": shifted by " << shifts[s] << ", the bf16 sums differ");
  }
}

// The loopback worlds of `size` ranks as `hosts` hosts of `local_size`:
// every rank, its host's ranks, and the ranks of each local rank.
struct HostWorlds {
  HostWorlds(int size, int local_size) : local_size(local_size) {
    flat = std::make_shared<LoopbackWorld>(size);
    for (int h = 0; h < size / local_size; ++h) {
      hosts.push_back(std::make_shared<LoopbackWorld>(local_size));
    }
    for (int j = 0; j < local_size; ++j) {
      cross.push_back(std::make_shared<LoopbackWorld>(size / local_size));
    }
  }
  // Rank `rank`'s hierarchical transport over `flat` (its LoopbackTransport
  // of the world `flat`).
  std::unique_ptr<HierarchicalTransport> Make(Transport* flat_transport, int rank,
                                              int64_t min_bytes, int64_t trials = 0) const {
    const int host = rank / local_size, local_rank = rank % local_size;
    return std::make_unique<HierarchicalTransport>(
        flat_transport, std::make_unique<LoopbackTransport>(hosts[host], local_rank),
        std::make_unique<LoopbackTransport>(cross[local_rank], host), min_bytes, trials);
  }

  const int local_size;
  std::shared_ptr<LoopbackWorld> flat;
  std::vector<std::shared_ptr<LoopbackWorld>> hosts, cross;
};

// HierarchicalTransport::AllreduceWire over every split of `size` into
// hosts x local ranks: one host gives exactly the uncompressed sum; several
// give identical bits on every rank within the bounds; other dtypes and ops
// are untouched by the compression.
void TestCompressedHierarchicalAllreduce(int size) {
  for (int local_size = 1; local_size <= size; ++local_size) {
    if (size % local_size != 0) continue;
    const int hosts = size / local_size;
    const HostWorlds worlds(size, local_size);
    const int64_t count = 2 * kFp16BlockValues + 3;
    // results[rank][mode]; exact[rank]: the uncompressed sum.
    std::vector<std::vector<std::vector<float>>> results(size, std::vector<std::vector<float>>(3));
    std::vector<std::vector<int32_t>> integers(size);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < size; ++rank) {
      threads.emplace_back([&, rank] {
        LoopbackTransport flat(worlds.flat, rank);
        const std::unique_ptr<HierarchicalTransport> transport =
            worlds.Make(&flat, rank, /*min_bytes=*/-1);
        std::vector<float> values(count);
        for (int64_t i = 0; i < count; ++i) values[i] = InputValue(rank, i);
        for (int m = 0; m < 3; ++m) {
          results[rank][m].resize(count);
          Status status = transport->AllreduceWire(values.data(), results[rank][m].data(), count,
                                                  DataType::kFloat32, ReduceOp::kSum, kModes[m]);
          EXPECT_TRUE(status.ok(), status.message());
        }
        integers[rank].assign(count, rank + 1);
        Status status = transport->AllreduceWire(integers[rank].data(), integers[rank].data(),
                                                count, DataType::kInt32, ReduceOp::kSum,
                                                WireCompression::kBf16);
        EXPECT_TRUE(status.ok(), status.message());
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (int m = 0; m < 3; ++m) {
      for (int rank = 0; rank < size; ++rank) {
        EXPECT_TRUE(std::memcmp(results[rank][m].data(), results[0][m].data(), count * 4) == 0,
                    "hosts " << hosts << ": rank " << rank << " differs");
        EXPECT_TRUE(integers[rank] == std::vector<int32_t>(count, size * (size + 1) / 2),
                    "int32 Sum with compression asked for is exact");
      }
      if (hosts == 1) {
        EXPECT_TRUE(std::memcmp(results[0][m].data(), results[0][0].data(), count * 4) == 0,
                    "one host: " << WireCompressionName(kModes[m]) << " is not exact");
      }
      for (int64_t i = 0; i < count; ++i) {
        EXPECT_TRUE(WithinBound(results[0][m][i], size, i, kModes[m], count),
                    "hosts " << hosts << " " << WireCompressionName(kModes[m]) << " [" << i
                             << "] " << results[0][m][i]);
      }
    }
  }
}

// PathTrial alone, with made-up times: the warm-up is not counted, the
// paths alternate, and the faster one per MB wins whichever it is.
void TestPathTrialPicksTheFasterPath(int) {
  for (const bool hierarchical_faster : {true, false}) {
    PathTrial trial(/*trials=*/3);
    int64_t calls = 0;
    while (!trial.NeedsAgreement()) {
      const PathTrial::Path path = trial.Next();
      EXPECT_TRUE(path == (calls % 2 == 0 ? PathTrial::Path::kFlat : PathTrial::Path::kHierarchical),
                  "call " << calls << ": the paths alternate");
      const bool faster = (path == PathTrial::Path::kHierarchical) == hierarchical_faster;
      // Warm-up calls (the first two of each) look 100x slower on the path
      // that is in fact faster: they must not count.
      const double seconds_per_mb = calls < 4 ? (faster ? 100.0 : 1.0) : (faster ? 0.5 : 1.0);
      // Sizes differ between calls: the comparison is per MB.
      const int64_t bytes = (calls + 1) * 1000000;
      trial.Record(bytes, seconds_per_mb * static_cast<double>(bytes) / 1e6);
      ++calls;
      EXPECT_TRUE(calls <= 10, "agreement due after 2 x (2 + 3) calls, not " << calls);
    }
    EXPECT_TRUE(calls == 10, "agreement after " << calls << " calls");
    EXPECT_TRUE(!trial.decided(), "not decided before the ranks agree");
    int64_t measured[2];
    trial.Measured(measured);
    const int64_t summed[2] = {measured[0] * 3, measured[1] * 3};  // as if 3 ranks
    trial.Agree(summed);
    EXPECT_TRUE(trial.decided() && !trial.NeedsAgreement(), "decided once agreed");
    const PathTrial::Path wanted =
        hierarchical_faster ? PathTrial::Path::kHierarchical : PathTrial::Path::kFlat;
    for (int i = 0; i < 5; ++i) {
      EXPECT_TRUE(trial.Next() == wanted, "the faster path, for good");
      trial.Record(1000000, 10.0);
    }
  }
}

// The measured choice inside a HierarchicalTransport over loopback worlds:
// exact integer sums before, at and after the agreement, and every rank
// takes the same path in the end.
void TestMeasuredPathIsExactAndAgreed(int size) {
  const HostWorlds worlds(size, size % 2 == 0 ? 2 : 1);
  const int64_t count = 4099;
  std::vector<int> chosen(size, -1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      LoopbackTransport flat(worlds.flat, rank);
      const std::unique_ptr<HierarchicalTransport> transport =
          worlds.Make(&flat, rank, /*min_bytes=*/0, /*trials=*/2);
      for (int call = 0; call < 14; ++call) {
        std::vector<int32_t> values(count, (rank + 1) * (call + 1)), sums(count, -1);
        Status status = transport->Allreduce(values.data(), sums.data(), count, DataType::kInt32,
                                            ReduceOp::kSum);
        EXPECT_TRUE(status.ok(), status.message());
        EXPECT_TRUE(sums == std::vector<int32_t>(count, (call + 1) * size * (size + 1) / 2),
                    "rank " << rank << " call " << call << ": wrong sum");
      }
      PathTrial::Path path;
      EXPECT_TRUE(transport->MeasuredPath(&path), "rank " << rank << " decided");
      chosen[rank] = static_cast<int>(path);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_TRUE(chosen[rank] == chosen[0], "rank " << rank << " took another path");
  }
}

}  // namespace
}  // namespace testing
}  // namespace tfring

int main(int argc, char** argv) {
  using namespace tfring::testing;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <scenario|all|list> [world size]\n", argv[0]);
    return 2;
  }
  const int size = argc > 2 ? std::atoi(argv[2]) : 1;
  static const std::map<std::string, void (*)(int)> scenarios = {
      {"bf16_rounding", TestBf16Rounding},
      {"fp16_conversion", TestFp16Conversion},
      {"round_trip_bounds", TestRoundTripBounds},
      {"fp16_cannot_overflow", TestFp16CannotOverflow},
      {"cross_host_sum", TestCrossHostSum},
      {"bf16_sum_ignores_layout", TestBf16SumIgnoresLayout},
      {"compressed_hierarchical_allreduce", TestCompressedHierarchicalAllreduce},
      {"path_trial_picks_the_faster_path", TestPathTrialPicksTheFasterPath},
      {"measured_path_is_exact_and_agreed", TestMeasuredPathIsExactAndAgreed},
  };
  return RunScenarios(scenarios, argv[1], " size=" + std::to_string(size),
                      [size](void (*fn)(int)) { fn(size); });
}
