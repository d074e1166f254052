// In-process tests of the core's negotiation, validation, fusion and cache,
// with ranks as threads over the loopback transport.
//
// Usage: core_logic_test <scenario|all> <world_size>
// Prints "PASS <scenario> size=N" or "FAIL <scenario> size=N: why" per
// scenario and exits non-zero if any failed. Driven from
// tests/test_core_logic.py for world sizes 1..8.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <unistd.h>

#include "cc/config.h"
#include "cc/job/cpu_binding.h"
#include "cc/negotiation/response_cache.h"
#include "cc/execution/fusion_planner.h"
#include "cc/transport/hierarchical_transport.h"
#include "cc/transport/loopback_transport.h"
#include "cc/reduce_kernels.h"
#include "tests/cc/loopback_harness.h"

namespace tfring {
namespace testing {
namespace {

Config TestConfig() {
  Config config;
  config.cycle_time_ms = 0.2;
  config.stall_check_time_s = 0;  // no warnings in tests that wait on purpose
  return config;
}

// Every rank submits `count` float32 tensors of varied sizes in its own
// random order; each sum must equal the sum of the ranks' contributions.
void AllreduceRandomOrder(int size, int count, Config config, int steps = 1) {
  LoopbackCluster cluster(size, config);
  OnEveryRank(size, [&](int rank) {
    std::mt19937 shuffle_rng(1234 + rank);
    for (int step = 0; step < steps; ++step) {
      std::vector<int> order(count);
      for (int i = 0; i < count; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), shuffle_rng);
      std::map<int, std::unique_ptr<Submitted>> submitted;
      for (int i : order) {
        const int64_t elements = 1 + (i * 37) % 700;
        std::vector<float> values(elements);
        for (int64_t e = 0; e < elements; ++e) values[e] = float(rank + 1) * (e % 7 + i);
        Request request = MakeRequest("grad_" + std::to_string(i), CollectiveType::kAllreduce,
                                      DataType::kFloat32, {elements});
        submitted[i] = Submit(cluster.rank(rank), request, Bytes(values));
      }
      const float rank_sum = size * (size + 1) / 2.0f;
      for (auto& [i, tensor] : submitted) {
        Status status = Await(*tensor);
        EXPECT_TRUE(status.ok(), status.message());
        const int64_t elements = 1 + (i * 37) % 700;
        std::vector<float> out = Values<float>(tensor->output, elements);
        for (int64_t e = 0; e < elements; ++e) {
          EXPECT_TRUE(out[e] == rank_sum * (e % 7 + i),
                      "tensor " << i << " element " << e << " = " << out[e]);
        }
      }
    }
  });
  cluster.Stop();
  if (steps > 1 && config.cache_capacity >= count && count > 0) {
    // Steady state: later steps agree through the cache bits alone, so the
    // number of negotiation rounds stays well below one per tensor per step.
    const int64_t rounds = cluster.rank(0).loop->controller().negotiation_rounds();
    EXPECT_TRUE(rounds < static_cast<int64_t>(count) * steps,
                "expected the cache to avoid negotiation, saw " << rounds << " rounds");
  }
}

void TestAllreduceOrders(int size) {
  for (int count : {0, 1, 7, 200}) AllreduceRandomOrder(size, count, TestConfig());
}

void TestSmallFusionThreshold(int size) {
  Config config = TestConfig();
  config.fusion_threshold = 4096;  // tensors just under and over it
  config.direct_threshold = 2048;
  AllreduceRandomOrder(size, 60, config);
  config.fusion_threshold = 0;  // fusion disabled
  AllreduceRandomOrder(size, 20, config);
}

void TestCacheSteadyState(int size) {
  AllreduceRandomOrder(size, 40, TestConfig(), /*steps=*/6);
  Config tiny = TestConfig();
  tiny.cache_capacity = 3;  // constant eviction must stay consistent
  AllreduceRandomOrder(size, 20, tiny, /*steps=*/3);
  Config none = TestConfig();
  none.cache_capacity = 0;
  AllreduceRandomOrder(size, 20, none, /*steps=*/2);
}

// The cache's slots are allocated as tensors are cached, not for the whole
// capacity at once: a capacity far beyond memory (before: one slot object
// each, up front, std::bad_alloc) costs nothing until used, and a job at
// the largest TFRING_CACHE_CAPACITY trains as with the default.
void TestCacheCapacityCostsNothingUpFront(int size) {
  ResponseCache huge(int64_t{1} << 40);
  EXPECT_TRUE(huge.enabled() && huge.allocated_slots() == 0,
              huge.allocated_slots() << " slots allocated up front");
  Response response;
  response.request = MakeRequest("w", CollectiveType::kAllreduce, DataType::kFloat32, {4});
  huge.Put(response);
  EXPECT_TRUE(huge.allocated_slots() == 1 && huge.Find(response.request).state ==
                                                  ResponseCache::State::kHit,
              huge.allocated_slots() << " slots after one Put");
  Config largest = TestConfig();
  for (const ConfigEntry& entry : DescribeConfig(largest)) {
    if (entry.env_name == "TFRING_CACHE_CAPACITY") {
      largest.cache_capacity = std::stoll(entry.maximum);
    }
  }
  EXPECT_TRUE(largest.cache_capacity >= 1024, "largest capacity " << largest.cache_capacity);
  AllreduceRandomOrder(size, 20, largest, /*steps=*/3);
}

void TestShapeMismatchThenRecovery(int size) {
  if (size < 2) return;
  LoopbackCluster cluster(size, TestConfig());
  OnEveryRank(size, [&](int rank) {
    // Step 0 agrees, so the name is cached; step 1 mismatches on rank 1.
    for (int step = 0; step < 2; ++step) {
      const int64_t length = (step == 1 && rank == 1) ? 3 : 4;
      auto tensor = Submit(cluster.rank(rank),
                           MakeRequest("weights", CollectiveType::kAllreduce, DataType::kFloat32,
                                       {length}),
                           Bytes(std::vector<float>(length, 1.0f)));
      Status status = Await(*tensor);
      if (step == 0) {
        EXPECT_TRUE(status.ok(), status.message());
      } else {
        EXPECT_TRUE(status.code() == StatusCode::kFailedPrecondition, status.message());
        const std::string& message = status.message();
        EXPECT_TRUE(message.find("'weights'") != std::string::npos, message);
        EXPECT_TRUE(message.find("shape") != std::string::npos, message);
        EXPECT_TRUE(message.find("rank 1 submitted [3]") != std::string::npos, message);
        EXPECT_TRUE(message.find("submitted [4]") != std::string::npos, message);
      }
    }
    // The next collective works normally.
    auto after = Submit(cluster.rank(rank),
                        MakeRequest("after", CollectiveType::kAllreduce, DataType::kInt32, {2}),
                        Bytes(std::vector<int32_t>{rank, 1}));
    Status status = Await(*after);
    EXPECT_TRUE(status.ok(), status.message());
    std::vector<int32_t> out = Values<int32_t>(after->output, 2);
    EXPECT_TRUE(out[1] == size && out[0] == size * (size - 1) / 2, out[0] << "," << out[1]);
  });
}

void TestEveryMismatchKind(int size) {
  if (size < 2) return;
  struct Case {
    const char* field;
    std::function<void(Request&)> change;
  };
  const std::vector<Case> cases = {
      {"dtype", [](Request& r) { r.dtype = DataType::kFloat64; }},
      {"reduction op", [](Request& r) { r.reduce_op = ReduceOp::kMax; }},
      {"prescale_factor", [](Request& r) { r.prescale_factor = 2.0; }},
      {"postscale_factor", [](Request& r) { r.postscale_factor = 0.5; }},
      {"collective operation", [](Request& r) { r.type = CollectiveType::kBroadcast; }},
      {"wire compression", [](Request& r) { r.compression = WireCompression::kBf16; }},
  };
  LoopbackCluster cluster(size, TestConfig());
  OnEveryRank(size, [&](int rank) {
    for (const Case& c : cases) {
      Request request = MakeRequest(std::string("t_") + c.field, CollectiveType::kAllreduce,
                                    DataType::kFloat32, {2});
      if (rank == size - 1) c.change(request);
      const int64_t bytes = 2 * DataTypeSize(request.dtype);
      auto tensor = Submit(cluster.rank(rank), request, std::vector<uint8_t>(bytes, 0));
      Status status = Await(*tensor);
      EXPECT_TRUE(status.code() == StatusCode::kFailedPrecondition,
                  c.field << ": " << status.message());
      EXPECT_TRUE(status.message().find(c.field) != std::string::npos, status.message());
      EXPECT_TRUE(status.message().find("rank " + std::to_string(size - 1)) != std::string::npos,
                  status.message());
    }
    // Broadcast root mismatch.
    Request request = MakeRequest("root", CollectiveType::kBroadcast, DataType::kInt8, {1});
    request.root_rank = rank == 0 ? 1 : 0;
    auto tensor = Submit(cluster.rank(rank), request, std::vector<uint8_t>(1, 0));
    Status status = Await(*tensor);
    EXPECT_TRUE(status.code() == StatusCode::kFailedPrecondition, status.message());
    EXPECT_TRUE(status.message().find("root rank") != std::string::npos, status.message());
    EXPECT_TRUE(status.message().find("rank 0 submitted 1") != std::string::npos,
                status.message());
  });
}

// Wire compression only encodes what crosses hosts: ranks that share a
// transport without hosts (here the loopback, as shared memory in a job)
// get bit-for-bit the uncompressed sums, whether the tensors fuse or run
// alone, with compressed and uncompressed tensors in the same round.
void TestWireCompressionOnOneHostIsExact(int size) {
  Config config = TestConfig();
  config.direct_threshold = 4096;  // some members fused, the large ones direct
  LoopbackCluster cluster(size, config);
  const int64_t lengths[] = {3, 40, 5000, 7};
  const WireCompression modes[] = {WireCompression::kNone, WireCompression::kBf16,
                                   WireCompression::kFp16};
  OnEveryRank(size, [&](int rank) {
    // Tensor 3g + m holds group g's values, sent with modes[m].
    std::vector<std::unique_ptr<Submitted>> tensors;
    for (int i = 0; i < 12; ++i) {
      const int g = i / 3;
      std::vector<float> values(lengths[g]);
      for (int64_t j = 0; j < lengths[g]; ++j) {
        values[j] = 0.1f * (rank + 1) + 1e-3f * j + (j == 1 ? 1e20f : 0.0f);
      }
      Request request = MakeRequest("w" + std::to_string(i), CollectiveType::kAllreduce,
                                    DataType::kFloat32, {lengths[g]});
      request.compression = modes[i % 3];
      if (g % 2 == 1) request.reduce_op = ReduceOp::kAverage;
      tensors.push_back(Submit(cluster.rank(rank), request, Bytes(values)));
    }
    for (int i = 0; i < 12; ++i) {
      Status status = Await(*tensors[i]);
      EXPECT_TRUE(status.ok(), status.message());
    }
    for (int i = 0; i < 12; ++i) {
      const int g = i / 3;
      const std::vector<float> out = Values<float>(tensors[i]->output, lengths[g]);
      const std::vector<float> plain = Values<float>(tensors[3 * g]->output, lengths[g]);
      EXPECT_TRUE(std::memcmp(out.data(), plain.data(), lengths[g] * sizeof(float)) == 0,
                  "tensor " << i << " (" << WireCompressionName(modes[i % 3])
                            << ") differs from the uncompressed sum");
      const float expected = (0.1f * size * (size + 1) / 2) / (g % 2 == 1 ? size : 1);
      EXPECT_TRUE(std::fabs(out[0] - expected) <= 1e-5f * expected, out[0] << " " << expected);
    }
  });
}

void TestAllgatherAndBroadcast(int size) {
  LoopbackCluster cluster(size, TestConfig());
  OnEveryRank(size, [&](int rank) {
    for (int step = 0; step < 3; ++step) {  // repeated: exercises the cache
      // Rank r contributes r+1+step rows of 2 int64 values each.
      const int64_t rows = rank + 1 + step;
      std::vector<int64_t> values;
      for (int64_t i = 0; i < rows; ++i) {
        values.push_back(rank);
        values.push_back(i);
      }
      auto gathered =
          Submit(cluster.rank(rank),
                 MakeRequest("gather", CollectiveType::kAllgather, DataType::kInt64, {rows, 2}),
                 Bytes(values));
      Status status = Await(*gathered);
      EXPECT_TRUE(status.ok(), status.message());
      int64_t total = 0;
      for (int r = 0; r < size; ++r) total += r + 1 + step;
      EXPECT_TRUE(gathered->output_shape == std::vector<int64_t>({total, 2}),
                  ShapeToString(gathered->output_shape));
      std::vector<int64_t> out = Values<int64_t>(gathered->output, total * 2);
      int64_t row = 0;
      for (int r = 0; r < size; ++r) {
        for (int64_t i = 0; i < r + 1 + step; ++i, ++row) {
          EXPECT_TRUE(out[row * 2] == r && out[row * 2 + 1] == i, "row " << row);
        }
      }
    }
    for (int root = 0; root < size; ++root) {
      Request request =
          MakeRequest("bcast_" + std::to_string(root), CollectiveType::kBroadcast,
                      DataType::kFloat64, {3});
      request.root_rank = root;
      auto tensor = Submit(cluster.rank(rank), request,
                           Bytes(std::vector<double>{double(rank), 1.5, -2.0}));
      Status status = Await(*tensor);
      EXPECT_TRUE(status.ok(), status.message());
      std::vector<double> out = Values<double>(tensor->output, 3);
      EXPECT_TRUE(out[0] == root && out[1] == 1.5 && out[2] == -2.0, "root " << root);
    }
    // A scalar allgather yields one element per rank; a zero-row one nothing.
    auto scalar = Submit(cluster.rank(rank),
                         MakeRequest("scalar", CollectiveType::kAllgather, DataType::kInt32, {}),
                         Bytes(std::vector<int32_t>{rank * 10}));
    EXPECT_TRUE(Await(*scalar).ok(), "scalar allgather");
    EXPECT_TRUE(scalar->output_shape == std::vector<int64_t>({size}),
                ShapeToString(scalar->output_shape));
    auto empty = Submit(cluster.rank(rank),
                        MakeRequest("empty", CollectiveType::kAllgather, DataType::kBool, {0, 3}),
                        {});
    EXPECT_TRUE(Await(*empty).ok(), "empty allgather");
    EXPECT_TRUE(empty->output_shape == std::vector<int64_t>({0, 3}),
                ShapeToString(empty->output_shape));
  });
}

void TestOpsScalesAndSixteenBit(int size) {
  LoopbackCluster cluster(size, TestConfig());
  OnEveryRank(size, [&](int rank) {
    struct Case {
      ReduceOp op;
      double expected;
    };
    const double n = size;
    std::vector<Case> cases = {{ReduceOp::kSum, n * (n + 1) / 2},
                               {ReduceOp::kAverage, (n + 1) / 2},
                               {ReduceOp::kMin, 1},
                               {ReduceOp::kMax, n},
                               {ReduceOp::kProduct, std::tgamma(n + 1)}};
    for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                           DataType::kFloat64, DataType::kInt32}) {
      for (const Case& c : cases) {
        Request request = MakeRequest(std::string(DataTypeName(dtype)) + ReduceOpName(c.op),
                                      CollectiveType::kAllreduce, dtype, {5});
        request.reduce_op = c.op;
        std::vector<float> as_float(5, float(rank + 1));
        std::vector<uint8_t> input(5 * DataTypeSize(dtype));
        ScaleCopy(DataType::kFloat32, as_float.data(), as_float.data(), 5, 1.0);
        for (int i = 0; i < 5; ++i) {
          const float v = as_float[i];
          switch (dtype) {
            case DataType::kFloat16: reinterpret_cast<uint16_t*>(input.data())[i] = FloatToHalf(v); break;
            case DataType::kBFloat16: reinterpret_cast<uint16_t*>(input.data())[i] = FloatToBFloat16(v); break;
            case DataType::kFloat32: reinterpret_cast<float*>(input.data())[i] = v; break;
            case DataType::kFloat64: reinterpret_cast<double*>(input.data())[i] = v; break;
            default: reinterpret_cast<int32_t*>(input.data())[i] = static_cast<int32_t>(v);
          }
        }
        auto tensor = Submit(cluster.rank(rank), request, input);
        Status status = Await(*tensor);
        EXPECT_TRUE(status.ok(), status.message());
        double got;
        switch (dtype) {
          case DataType::kFloat16: got = HalfToFloat(reinterpret_cast<uint16_t*>(tensor->output.data())[4]); break;
          case DataType::kBFloat16: got = BFloat16ToFloat(reinterpret_cast<uint16_t*>(tensor->output.data())[4]); break;
          case DataType::kFloat32: got = reinterpret_cast<float*>(tensor->output.data())[4]; break;
          case DataType::kFloat64: got = reinterpret_cast<double*>(tensor->output.data())[4]; break;
          default: got = reinterpret_cast<int32_t*>(tensor->output.data())[4];
        }
        double expected = c.expected;
        if (dtype == DataType::kInt32) expected = std::trunc(expected);
        const double tolerance = (dtype == DataType::kBFloat16 ? 1e-2 : 1e-3) * std::abs(expected);
        EXPECT_TRUE(std::abs(got - expected) <= tolerance,
                    DataTypeName(dtype) << " " << ReduceOpName(c.op) << ": got " << got
                                        << " expected " << expected);
      }
    }
    // Pre and post scaling: (sum of 2*(r+1)) * 0.25.
    Request request = MakeRequest("scaled", CollectiveType::kAllreduce, DataType::kFloat64, {1});
    request.prescale_factor = 2.0;
    request.postscale_factor = 0.25;
    auto tensor = Submit(cluster.rank(rank), request, Bytes(std::vector<double>{rank + 1.0}));
    EXPECT_TRUE(Await(*tensor).ok(), "scaled");
    const double got = Values<double>(tensor->output, 1)[0];
    EXPECT_TRUE(got == n * (n + 1) / 2 * 0.5, got);
  });
}

void TestDuplicateNameRejected(int size) {
  LoopbackCluster cluster(size, TestConfig());
  // Only rank 0 submits, so "dup" stays in flight while the second arrives.
  auto first = Submit(cluster.rank(0),
                      MakeRequest("dup", CollectiveType::kAllreduce, DataType::kFloat32, {1}),
                      Bytes(std::vector<float>{1}));
  auto second = Submit(cluster.rank(0),
                       MakeRequest("dup", CollectiveType::kAllreduce, DataType::kFloat32, {1}),
                       Bytes(std::vector<float>{1}));
  if (size > 1) {
    EXPECT_TRUE(second->enqueue_status.code() == StatusCode::kInvalidArgument,
                second->enqueue_status.message());
    EXPECT_TRUE(second->enqueue_status.message().find("already in flight") != std::string::npos,
                second->enqueue_status.message());
  }
  cluster.Stop();
  Status status = Await(*first);
  if (size > 1) {
    // Cancelled by the shutdown, with a reason.
    EXPECT_TRUE(status.code() == StatusCode::kAborted, status.message());
    EXPECT_TRUE(status.message().find("shut down") != std::string::npos, status.message());
  }
}

void TestPeerShutdownFailsPending(int size) {
  if (size < 2) return;
  LoopbackCluster cluster(size, TestConfig());
  // Rank 0 waits for a tensor the last rank never submits; the last rank
  // shuts down; rank 0's pending op must fail promptly naming that rank.
  // The callback also records whether the loop still claimed to be running
  // when the user learned of the shutdown: an init() called at that moment
  // must start a new loop, not find the stopping one "running".
  Submitted pending;
  std::vector<float> input{1}, output(1);
  TensorBuffers buffers;
  buffers.input = input.data();
  buffers.output = output.data();
  auto done = pending.done;
  auto running_at_callback = std::make_shared<std::atomic<bool>>(true);
  BackgroundLoop* loop = cluster.rank(0).loop.get();
  Status added = cluster.rank(0).queue->Add(TensorEntry{
      MakeRequest("orphan", CollectiveType::kAllreduce, DataType::kFloat32, {1}), buffers,
      [done, running_at_callback, loop](const Status& s) {
        *running_at_callback = loop->running();
        done->set_value(s);
      }});
  EXPECT_TRUE(added.ok(), added.message());
  cluster.rank(size - 1).loop->RequestShutdown();
  Status status = Await(pending, 10.0);
  EXPECT_TRUE(!*running_at_callback, "the loop still reported running() when it cancelled");
  EXPECT_TRUE(status.code() == StatusCode::kAborted, status.message());
  EXPECT_TRUE(status.message().find("rank " + std::to_string(size - 1) + " shut down") !=
                  std::string::npos,
              status.message());
  // Later submissions fail immediately with the same reason.
  auto later = Submit(cluster.rank(0),
                      MakeRequest("later", CollectiveType::kAllreduce, DataType::kFloat32, {1}),
                      Bytes(std::vector<float>{1}));
  EXPECT_TRUE(later->enqueue_status.code() == StatusCode::kAborted,
              later->enqueue_status.message());
}

void TestFusionPlanner(int) {
  auto request = [](DataType dtype, ReduceOp op, CollectiveType type = CollectiveType::kAllreduce) {
    Request r;
    r.type = type;
    r.dtype = dtype;
    r.reduce_op = op;
    return r;
  };
  const std::vector<Request> requests = {
      request(DataType::kFloat32, ReduceOp::kSum),
      request(DataType::kFloat64, ReduceOp::kSum),
      request(DataType::kFloat32, ReduceOp::kAverage),
      request(DataType::kFloat32, ReduceOp::kSum, CollectiveType::kBroadcast),
      request(DataType::kFloat32, ReduceOp::kSum),
      request(DataType::kFloat32, ReduceOp::kMax),
      request(DataType::kFloat32, ReduceOp::kSum),
      request(DataType::kInt32, ReduceOp::kSum, CollectiveType::kAllgather),
      request(DataType::kFloat64, ReduceOp::kSum, CollectiveType::kAllgather),
      request(DataType::kFloat32, ReduceOp::kSum, CollectiveType::kReducescatter),
      request(DataType::kFloat32, ReduceOp::kAverage, CollectiveType::kReducescatter),
      request(DataType::kInt8, ReduceOp::kSum, CollectiveType::kAlltoall),
      request(DataType::kInt8, ReduceOp::kSum, CollectiveType::kAlltoall)};
  const std::vector<int64_t> sizes = {100, 100, 100, 100, 5000, 100, 900,
                                      100, 100, 100, 100, 100, 100};
  std::vector<FusionCandidate> candidates;
  for (size_t i = 0; i < requests.size(); ++i) {
    candidates.push_back(FusionCandidate{i * 10, &requests[i], sizes[i]});
  }
  std::vector<Batch> batches = PlanBatches(candidates, 1000, 4000);
  // float32 Sum/Average share a batch (Average is a scaled Sum) until 1000
  // bytes; the 5000-byte tensor goes direct; Max and float64 stand apart;
  // allgathers of any dtypes share one; reducescatters fuse apart from
  // allreduces; alltoalls and broadcasts run alone. Members carry the
  // candidates' indices.
  std::vector<std::vector<size_t>> expected = {{0, 20}, {10}, {30},  {40},  {50},
                                               {60},    {70, 80}, {90, 100}, {110}, {120}};
  EXPECT_TRUE(batches.size() == expected.size(), batches.size() << " batches");
  for (size_t b = 0; b < batches.size() && b < expected.size(); ++b) {
    EXPECT_TRUE(batches[b].members == expected[b], "batch " << b);
  }
  EXPECT_TRUE(batches[0].fused && !batches[2].fused && !batches[3].fused && batches[6].fused &&
                  batches[7].fused && !batches[8].fused,
              "fused flags");
  EXPECT_TRUE(PlanBatches({}, 1000, 4000).empty(), "empty plan");
  std::vector<Batch> unfused = PlanBatches(candidates, 0, 4000);
  EXPECT_TRUE(unfused.size() == candidates.size(), "threshold 0 disables fusion");
  // A transport that reduces spans: every allreduce of one dtype and op
  // joins one batch whatever its size (the 5000-byte one too); the others
  // are planned as before.
  std::vector<Batch> spans = PlanBatches(candidates, 1000, 4000, /*allreduce_spans=*/true);
  expected = {{0, 20, 40, 60}, {10}, {30}, {50}, {70, 80}, {90, 100}, {110}, {120}};
  EXPECT_TRUE(spans.size() == expected.size(), spans.size() << " batches with spans");
  for (size_t b = 0; b < spans.size() && b < expected.size(); ++b) {
    EXPECT_TRUE(spans[b].members == expected[b], "batch " << b << " with spans");
  }
  EXPECT_TRUE(spans[0].spans && !spans[0].fused && spans[1].spans && !spans[2].spans &&
                  spans[3].spans && spans[4].fused && !spans[4].spans && spans[5].fused,
              "span flags");
}

void TestHalfConversions(int) {
  for (float value : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333f}) {
    const float back = HalfToFloat(FloatToHalf(value));
    EXPECT_TRUE(std::abs(back - value) <= std::abs(value) * 1e-3f, value << " -> " << back);
    const float back16 = BFloat16ToFloat(FloatToBFloat16(value));
    EXPECT_TRUE(std::abs(back16 - value) <= std::abs(value) * 1e-2f, value << " -> " << back16);
  }
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))), "overflow to inf");
}

// Ranks started with different fusion, direct-send and cache settings (as
// when a launcher does not forward a variable) adopt rank 0's at start-up,
// so a mixed batch of small tensors and one above rank 1's own direct
// threshold reduces correctly instead of issuing mismatched calls.
void TestJobConfigFromRankZero(int size) {
  std::vector<Config> configs(size, TestConfig());
  for (int rank = 1; rank < size; ++rank) {
    configs[rank].fusion_threshold = 0;
    configs[rank].direct_threshold = 4 * 1024 * 1024;
    configs[rank].cache_capacity = 3;
    configs[rank].stall_check_time_s = 7;
  }
  LoopbackCluster cluster(configs);
  for (int rank = 0; rank < size; ++rank) {
    const Config& adopted = cluster.rank(rank).config;
    EXPECT_TRUE(adopted.fusion_threshold == configs[0].fusion_threshold &&
                    adopted.direct_threshold == configs[0].direct_threshold &&
                    adopted.cache_capacity == configs[0].cache_capacity &&
                    adopted.stall_check_time_s == configs[0].stall_check_time_s,
                "rank " << rank << " kept its own job-wide knobs");
    // Process-wide knobs stay this rank's own.
    EXPECT_TRUE(adopted.cycle_time_ms == configs[rank].cycle_time_ms, "cycle time");
  }
  OnEveryRank(size, [&](int rank) {
    for (int step = 0; step < 3; ++step) {
      std::vector<std::unique_ptr<Submitted>> small;
      for (int i = 0; i < 5; ++i) {
        small.push_back(Submit(cluster.rank(rank),
                               MakeRequest("small_" + std::to_string(i), CollectiveType::kAllreduce,
                                           DataType::kFloat32, {10}),
                               Bytes(std::vector<float>(10, float(i)))));
      }
      const int64_t big_elements = 512 * 1024;  // 2 MiB: direct on rank 0, fused on the others
      auto big = Submit(cluster.rank(rank),
                        MakeRequest("big", CollectiveType::kAllreduce, DataType::kFloat32,
                                    {big_elements}),
                        Bytes(std::vector<float>(big_elements, 1.0f)));
      for (int i = 0; i < 5; ++i) {
        Status status = Await(*small[i]);
        EXPECT_TRUE(status.ok(), status.message());
        EXPECT_TRUE(Values<float>(small[i]->output, 10)[9] == float(i * size), "small " << i);
      }
      Status status = Await(*big);
      EXPECT_TRUE(status.ok(), status.message());
      EXPECT_TRUE(Values<float>(big->output, big_elements)[big_elements - 1] == float(size),
                  "big");
    }
  });
}

// Submits an allgather whose output allocator is `allocate` (instead of the
// harness's vector).
std::unique_ptr<Submitted> SubmitAllgather(RankContext& context, const std::string& name,
                                           std::vector<int32_t> values,
                                           OutputAllocator allocate) {
  auto submitted = std::make_unique<Submitted>();
  submitted->input = Bytes(values);
  TensorBuffers buffers;
  buffers.input = submitted->input.data();
  buffers.allocate_output = std::move(allocate);
  auto done = submitted->done;
  submitted->enqueue_status = context.queue->Add(
      TensorEntry{MakeRequest(name, CollectiveType::kAllgather, DataType::kInt32,
                              {static_cast<int64_t>(values.size())}),
                  buffers, [done](const Status& s) { done->set_value(s); }});
  if (!submitted->enqueue_status.ok()) done->set_value(submitted->enqueue_status);
  return submitted;
}

// One rank cannot allocate an allgather's output (an error, then an
// exception): every rank fails that collective with a message naming the
// rank, and the job goes on. A completion callback that throws is survived.
void TestPerTensorFailureOnOneRank(int size) {
  LoopbackCluster cluster(size, TestConfig());
  const int failing = size - 1;
  OnEveryRank(size, [&](int rank) {
    RankContext& context = cluster.rank(rank);
    std::vector<int32_t> scratch;
    for (int attempt = 0; attempt < 2; ++attempt) {
      const bool throws = attempt == 1;
      auto gathered = SubmitAllgather(
          context, "gather_" + std::to_string(attempt), {rank, rank},
          [&, rank, throws](const std::vector<int64_t>& shape, void** data) -> Status {
            if (rank == failing) {
              if (throws) throw std::bad_alloc();
              return Status::ResourceExhausted("the allocator refused 42 bytes");
            }
            scratch.resize(NumElements(shape));
            *data = scratch.data();
            return Status::OK();
          });
      Status status = Await(*gathered);
      EXPECT_TRUE(!status.ok(), "attempt " << attempt << " succeeded");
      const std::string& message = status.message();
      EXPECT_TRUE(message.find("'gather_" + std::to_string(attempt) + "'") != std::string::npos,
                  message);
      EXPECT_TRUE(message.find("failed on rank " + std::to_string(failing)) != std::string::npos,
                  message);
      EXPECT_TRUE(message.find("Every rank skipped it") != std::string::npos, message);
      if (rank == failing) {
        EXPECT_TRUE(status.code() == StatusCode::kResourceExhausted, message);
        EXPECT_TRUE(message.find(throws ? "out of memory" : "refused 42 bytes") !=
                        std::string::npos,
                    message);
      } else {
        EXPECT_TRUE(status.code() == StatusCode::kFailedPrecondition, message);
      }
    }
    // A completion callback that throws must not end the background thread.
    Submitted thrower;
    std::vector<float> one{1.0f};
    std::vector<float> out(1);
    TensorBuffers buffers;
    buffers.input = one.data();
    buffers.output = out.data();
    auto thrown = thrower.done;
    Status added = context.queue->Add(
        TensorEntry{MakeRequest("throwing_callback", CollectiveType::kAllreduce,
                                DataType::kFloat32, {1}),
                    buffers, [thrown](const Status& s) {
                      thrown->set_value(s);
                      throw std::runtime_error("callback failure");
                    }});
    EXPECT_TRUE(added.ok(), added.message());
    EXPECT_TRUE(Await(thrower).ok(), "throwing callback's collective");
    // The job goes on: later collectives of every kind work.
    auto after = Submit(context,
                        MakeRequest("after", CollectiveType::kAllreduce, DataType::kInt32, {1}),
                        Bytes(std::vector<int32_t>{1}));
    Status status = Await(*after);
    EXPECT_TRUE(status.ok(), status.message());
    EXPECT_TRUE(Values<int32_t>(after->output, 1)[0] == size, "after");
    auto gathered = Submit(context,
                           MakeRequest("gather_after", CollectiveType::kAllgather,
                                       DataType::kInt32, {1}),
                           Bytes(std::vector<int32_t>{rank}));
    status = Await(*gathered);
    EXPECT_TRUE(status.ok(), status.message());
    EXPECT_TRUE(gathered->output_shape == std::vector<int64_t>({size}), "gather_after shape");
  });
}

// Integer Average divides the sum by the size in integer arithmetic,
// truncating toward zero (a sum of 49 over 49 ranks is 1, not 0), and int64
// keeps every bit. The kernel is checked for every integer dtype and every
// size up to 200; the cluster runs it end to end at this size.
void TestIntegerAverage(int size) {
  auto check_kernel = [](DataType dtype, auto typed_zero) {
    using T = decltype(typed_zero);
    for (int64_t n = 1; n <= 200; ++n) {
      std::vector<T> sums;
      const std::vector<int64_t> candidates = {-3 * n - 1, -n, -n + 1, -1,    0,        1,
                                               n - 1,      n,  n + 1,  3 * n, 3 * n + 2};
      for (int64_t k : candidates) {
        if (k < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
            k > static_cast<int64_t>(std::numeric_limits<T>::max())) {
          continue;
        }
        sums.push_back(static_cast<T>(k));
      }
      sums.push_back(std::numeric_limits<T>::max());
      sums.push_back(std::numeric_limits<T>::min());
      std::vector<T> out(sums.size());
      ScaleCopy(dtype, sums.data(), out.data(), sums.size(), 1.0, n);
      for (size_t i = 0; i < sums.size(); ++i) {
        const T expected = static_cast<T>(static_cast<int64_t>(sums[i]) / n);
        EXPECT_TRUE(out[i] == expected, DataTypeName(dtype) << " " << int64_t(sums[i]) << " / "
                                                            << n << " gave " << int64_t(out[i]));
      }
    }
  };
  check_kernel(DataType::kUInt8, uint8_t{});
  check_kernel(DataType::kInt8, int8_t{});
  check_kernel(DataType::kUInt16, uint16_t{});
  check_kernel(DataType::kInt16, int16_t{});
  check_kernel(DataType::kInt32, int32_t{});
  check_kernel(DataType::kInt64, int64_t{});
  // A postscale factor still applies first (truncated), then the division.
  std::vector<int32_t> scaled{7, -7};
  ScaleCopy(DataType::kInt32, scaled.data(), scaled.data(), 2, 1.5, 4);
  EXPECT_TRUE(scaled[0] == 2 && scaled[1] == -2, scaled[0] << "," << scaled[1]);

  LoopbackCluster cluster(size, TestConfig());
  OnEveryRank(size, [&](int rank) {
    // Every rank contributes 1: the average is exactly 1 for every dtype
    // whose sum does not overflow (int8 holds at most 127 ranks' ones).
    for (DataType dtype : {DataType::kUInt8, DataType::kInt8, DataType::kInt32,
                           DataType::kInt64}) {
      if (dtype == DataType::kInt8 && size > 127) continue;
      Request request = MakeRequest(std::string("ones_") + DataTypeName(dtype),
                                    CollectiveType::kAllreduce, dtype, {3});
      request.reduce_op = ReduceOp::kAverage;
      std::vector<uint8_t> input(3 * DataTypeSize(dtype), 0);
      for (int i = 0; i < 3; ++i) input[i * DataTypeSize(dtype)] = 1;  // little-endian 1
      auto tensor = Submit(cluster.rank(rank), request, input);
      Status status = Await(*tensor);
      EXPECT_TRUE(status.ok(), status.message());
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(tensor->output[i * DataTypeSize(dtype)] == 1,
                    DataTypeName(dtype) << " average of ones at size " << size << " gave "
                                        << int(tensor->output[i * DataTypeSize(dtype)]));
      }
    }
    // int64 beyond 2^53 keeps its precision: Average of equal values is the value.
    const int64_t big = (int64_t{1} << 60) + 1 + 2 * rank;
    Request request = MakeRequest("big_int64", CollectiveType::kAllreduce, DataType::kInt64, {1});
    request.reduce_op = ReduceOp::kAverage;
    auto tensor = Submit(cluster.rank(rank), request, Bytes(std::vector<int64_t>{big}));
    EXPECT_TRUE(Await(*tensor).ok(), "big int64");
    // Sum over ranks r of (2^60 + 1 + 2r) = size * (2^60 + 1) + size * (size - 1);
    // divided by size: 2^60 + 1 + (size - 1) exactly (computed without overflow only
    // while the sum fits; small sizes here).
    if (size <= 7) {
      const int64_t expected = (int64_t{1} << 60) + 1 + (size - 1);
      const int64_t got = Values<int64_t>(tensor->output, 1)[0];
      EXPECT_TRUE(got == expected, "int64 average " << got << " expected " << expected);
    }
  });
}

// Alltoall: rank i sends (i + j) % 3 rows to rank j (zero rows to or from
// some ranks), each row [i, j, k]; also an even split, zero-size rows and a
// rank that sends nothing at all. Run twice (the second through the cache).
void TestAlltoall(int size) {
  LoopbackCluster cluster(size, TestConfig());
  OnEveryRank(size, [&](int rank) {
    for (int step = 0; step < 2; ++step) {
      std::vector<int64_t> splits;
      std::vector<int32_t> values;
      for (int j = 0; j < size; ++j) {
        const int64_t rows = rank == 1 ? 0 : (rank + j + step) % 3;  // rank 1 sends nothing
        splits.push_back(rows);
        for (int64_t k = 0; k < rows; ++k) values.insert(values.end(), {rank, j, int32_t(k)});
      }
      const int64_t my_rows = static_cast<int64_t>(values.size() / 3);
      auto sent = Submit(cluster.rank(rank),
                         MakeRequest("a2a", CollectiveType::kAlltoall, DataType::kInt32,
                                     {my_rows, 3}),
                         Bytes(values), splits);
      Status status = Await(*sent);
      EXPECT_TRUE(status.ok(), status.message());
      std::vector<int64_t> expected_splits;
      std::vector<int32_t> expected;
      for (int i = 0; i < size; ++i) {
        const int64_t rows = i == 1 ? 0 : (i + rank + step) % 3;
        expected_splits.push_back(rows);
        for (int64_t k = 0; k < rows; ++k) expected.insert(expected.end(), {i, rank, int32_t(k)});
      }
      const int64_t received = static_cast<int64_t>(expected.size() / 3);
      EXPECT_TRUE(sent->output_shape == std::vector<int64_t>({received, 3}),
                  ShapeToString(sent->output_shape));
      EXPECT_TRUE(sent->received_splits == expected_splits,
                  "received splits " << ShapeToString(sent->received_splits));
      EXPECT_TRUE(Values<int32_t>(sent->output, expected.size()) == expected, "alltoall rows");
    }
    // Even split of size * 2 rows of one byte each.
    std::vector<uint8_t> bytes(size * 2);
    for (int i = 0; i < size * 2; ++i) bytes[i] = uint8_t(rank * 16 + i);
    auto even = Submit(cluster.rank(rank),
                       MakeRequest("a2a_even", CollectiveType::kAlltoall, DataType::kUInt8,
                                   {size * 2}),
                       bytes);
    EXPECT_TRUE(Await(*even).ok(), "even alltoall");
    for (int i = 0; i < size; ++i) {
      for (int k = 0; k < 2; ++k) {
        EXPECT_TRUE(even->output[i * 2 + k] == uint8_t(i * 16 + rank * 2 + k),
                    "even split from rank " << i);
      }
    }
    // Zero-size rows move nothing but still report their splits.
    auto hollow = Submit(cluster.rank(rank),
                         MakeRequest("a2a_hollow", CollectiveType::kAlltoall, DataType::kFloat32,
                                     {size, 0}),
                         {});
    EXPECT_TRUE(Await(*hollow).ok(), "zero-size alltoall");
    EXPECT_TRUE(hollow->output_shape == std::vector<int64_t>({size, 0}),
                ShapeToString(hollow->output_shape));
  });
}

// Bad splits on one rank fail the alltoall on every rank with an
// InvalidArgument naming that rank and what is wrong; the job goes on.
void TestAlltoallBadSplits(int size) {
  LoopbackCluster cluster(size, TestConfig());
  struct Case {
    const char* name;
    std::vector<int64_t> bad_splits;  // on the last rank
    const char* expected_text;
  };
  std::vector<int64_t> negative(size, 1), wrong_sum(size, 1), wrong_length(size + 1, 0);
  negative[0] = -1;
  if (size > 1) negative[size - 1] = 2;  // still sums to size
  wrong_sum[0] = 2;
  wrong_length[0] = size;
  const std::vector<Case> cases = {
      {"negative", negative, "negative entry at index 0"},
      {"wrong_sum", wrong_sum, "sum to"},
      {"wrong_length", wrong_length, "entries, expected one per rank"},
  };
  OnEveryRank(size, [&](int rank) {
    for (const Case& c : cases) {
      std::vector<int64_t> splits(size, 1);
      if (rank == size - 1) splits = c.bad_splits;
      auto tensor = Submit(cluster.rank(rank),
                           MakeRequest(c.name, CollectiveType::kAlltoall, DataType::kInt64,
                                       {size}),
                           Bytes(std::vector<int64_t>(size, rank)), splits);
      Status status = Await(*tensor);
      const std::string message = status.message();
      EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument, c.name << ": " << message);
      EXPECT_TRUE(message.find("rank " + std::to_string(size - 1) + ": ") != std::string::npos &&
                      message.find(c.expected_text) != std::string::npos &&
                      message.find("'" + std::string(c.name) + "'") != std::string::npos,
                  c.name << ": " << message);
    }
    // Rows that do not divide evenly, with no splits given.
    auto uneven = Submit(cluster.rank(rank),
                         MakeRequest("uneven", CollectiveType::kAlltoall, DataType::kInt8,
                                     {size + 1}),
                         std::vector<uint8_t>(size + 1));
    Status status = Await(*uneven);
    if (size > 1) {
      EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument &&
                      status.message().find("does not divide evenly") != std::string::npos,
                  status.message());
    }
    // A scalar is rejected on every rank; then a good alltoall works.
    auto scalar = Submit(cluster.rank(rank),
                         MakeRequest("a2a_scalar", CollectiveType::kAlltoall, DataType::kInt8, {}),
                         std::vector<uint8_t>(1));
    status = Await(*scalar);
    EXPECT_TRUE(!status.ok() && status.message().find("scalar") != std::string::npos,
                status.message());
    auto good = Submit(cluster.rank(rank),
                       MakeRequest("good", CollectiveType::kAlltoall, DataType::kInt64, {size}),
                       Bytes(std::vector<int64_t>(size, rank)));
    status = Await(*good);
    EXPECT_TRUE(status.ok(), status.message());
    for (int i = 0; i < size; ++i) {
      EXPECT_TRUE(Values<int64_t>(good->output, size)[i] == i, "good alltoall after errors");
    }
  });
}

// Reducescatter: rows that divide evenly or not (the first rows % size ranks
// get one more), fewer rows than ranks, Sum and Average, scale factors, fused
// (many small tensors) and direct (fusion disabled).
void TestReducescatter(int size) {
  for (int64_t fusion_threshold : {int64_t{1} << 20, int64_t{0}}) {
    Config config = TestConfig();
    config.fusion_threshold = fusion_threshold;
    LoopbackCluster cluster(size, config);
    OnEveryRank(size, [&](int rank) {
      const std::vector<int64_t> row_counts = {1, 2, 3, 5, 7, 2 * size, 2 * size + 1};
      std::vector<std::unique_ptr<Submitted>> submitted;
      for (size_t t = 0; t < row_counts.size(); ++t) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
          const int64_t rows = row_counts[t];
          std::vector<float> values;
          for (int64_t i = 0; i < rows * 2; ++i) values.push_back(float((rank + 1) * (i + 1)));
          Request request = MakeRequest("rs_" + std::to_string(t) + ReduceOpName(op),
                                        CollectiveType::kReducescatter, DataType::kFloat32,
                                        {rows, 2});
          request.reduce_op = op;
          request.prescale_factor = 2.0;
          request.postscale_factor = 0.5;
          submitted.push_back(Submit(cluster.rank(rank), request, Bytes(values)));
        }
      }
      const float rank_sum = size * (size + 1) / 2.0f;
      for (size_t t = 0; t < row_counts.size(); ++t) {
        for (int o = 0; o < 2; ++o) {
          Submitted& tensor = *submitted[t * 2 + o];
          Status status = Await(tensor);
          EXPECT_TRUE(status.ok(), status.message());
          const int64_t rows = row_counts[t];
          const int64_t mine = rows / size + (rank < rows % size ? 1 : 0);
          int64_t start = 0;
          for (int r = 0; r < rank; ++r) start += rows / size + (r < rows % size ? 1 : 0);
          EXPECT_TRUE(tensor.output_shape == std::vector<int64_t>({mine, 2}),
                      "rows " << rows << " shape " << ShapeToString(tensor.output_shape));
          std::vector<float> out = Values<float>(tensor.output, mine * 2);
          for (int64_t i = 0; i < mine * 2; ++i) {
            const float sum = rank_sum * float(start * 2 + i + 1);
            const float expected = o == 0 ? sum : sum / size;
            // Average multiplies by postscale / size: allow its rounding.
            EXPECT_TRUE(std::abs(out[i] - expected) <= 1e-6f * expected, "rows " << rows << " op " << o << " element " << i
                                                    << " = " << out[i] << ", expected "
                                                    << expected);
          }
        }
      }
      // Integer Average truncates toward zero; a scalar is rejected.
      Request request = MakeRequest("rs_int", CollectiveType::kReducescatter, DataType::kInt32,
                                    {size});
      request.reduce_op = ReduceOp::kAverage;
      auto ints = Submit(cluster.rank(rank), request,
                         Bytes(std::vector<int32_t>(size, rank == 0 ? -2 * size - 1 : 0)));
      EXPECT_TRUE(Await(*ints).ok(), "integer reducescatter");
      const int32_t got = Values<int32_t>(ints->output, 1)[0];
      EXPECT_TRUE(got == (-2 * size - 1) / size, "integer average " << got);
      auto scalar = Submit(cluster.rank(rank),
                           MakeRequest("rs_scalar", CollectiveType::kReducescatter,
                                       DataType::kFloat32, {}),
                           Bytes(std::vector<float>{1}));
      Status status = Await(*scalar);
      EXPECT_TRUE(!status.ok() && status.message().find("scalar") != std::string::npos,
                  status.message());
    });
  }
}

// Many small allgathers of several dtypes in one round share one fused
// Allgatherv; results match the unfused path, every rank a different row count.
void TestFusedAllgather(int size) {
  LoopbackCluster cluster(size, TestConfig());
  OnEveryRank(size, [&](int rank) {
    std::vector<std::unique_ptr<Submitted>> submitted;
    for (int t = 0; t < 40; ++t) {
      const int64_t rows = (rank + t) % 4;
      const DataType dtype = t % 2 ? DataType::kInt16 : DataType::kInt64;
      std::vector<uint8_t> input(rows * 3 * DataTypeSize(dtype));
      for (size_t b = 0; b < input.size(); ++b) input[b] = uint8_t(rank * 50 + t + b);
      submitted.push_back(Submit(cluster.rank(rank),
                                 MakeRequest("g" + std::to_string(t), CollectiveType::kAllgather,
                                             dtype, {rows, 3}),
                                 input));
    }
    for (int t = 0; t < 40; ++t) {
      Status status = Await(*submitted[t]);
      EXPECT_TRUE(status.ok(), status.message());
      const DataType dtype = t % 2 ? DataType::kInt16 : DataType::kInt64;
      std::vector<uint8_t> expected;
      for (int r = 0; r < size; ++r) {
        const int64_t rows = (r + t) % 4;
        for (int64_t b = 0; b < rows * 3 * DataTypeSize(dtype); ++b) {
          expected.push_back(uint8_t(r * 50 + t + b));
        }
      }
      EXPECT_TRUE(std::vector<uint8_t>(submitted[t]->output.begin(),
                                       submitted[t]->output.begin() + expected.size()) ==
                      expected,
                  "allgather " << t);
      EXPECT_TRUE(submitted[t]->output_shape[0] ==
                      static_cast<int64_t>(expected.size()) / (3 * DataTypeSize(dtype)),
                  "allgather " << t << " rows");
    }
  });
}

// Process sets: the even ranks, the odd ranks (disjoint from the evens) and
// {0, last} (overlapping both) run different collectives interleaved with
// global ones, each rank in its own random order, for several steps: nothing
// deadlocks, and every result has only its set's contributions. Broadcast
// roots and message ranks are job ranks.
void TestProcessSets(int size) {
  std::vector<int> evens, odds;
  for (int r = 0; r < size; ++r) (r % 2 ? odds : evens).push_back(r);
  std::vector<std::vector<int>> sets = {evens};
  if (!odds.empty()) sets.push_back(odds);
  if (size > 2) sets.push_back({0, size - 1});
  LoopbackCluster cluster(size, TestConfig(), sets);
  auto sum_of = [](const std::vector<int>& ranks) {
    float total = 0;
    for (int r : ranks) total += float(r + 1);
    return total;
  };
  OnEveryRank(size, [&](int rank) {
    std::mt19937 rng(99 + rank);
    for (int step = 0; step < 5; ++step) {
      struct Job {
        std::string name;
        std::unique_ptr<Submitted> tensor;
        int32_t set;
      };
      std::vector<std::function<Job()>> makers;
      const std::string suffix = "_" + std::to_string(step);
      makers.push_back([&] {
        Request r = MakeRequest("global" + suffix, CollectiveType::kAllreduce, DataType::kFloat32,
                                {2});
        return Job{r.name, Submit(cluster.rank(rank), r, Bytes(std::vector<float>(2, rank + 1))),
                   0};
      });
      for (size_t s = 0; s < sets.size(); ++s) {
        if (std::find(sets[s].begin(), sets[s].end(), rank) == sets[s].end()) continue;
        makers.push_back([&, s] {
          const int32_t id = static_cast<int32_t>(s + 1);
          Request r;
          std::vector<uint8_t> input;
          if (s == 0) {  // evens: Sum allreduce
            r = MakeRequest("evens" + suffix, CollectiveType::kAllreduce, DataType::kFloat32, {3});
            input = Bytes(std::vector<float>(3, rank + 1));
          } else if (s == 1) {  // odds: allgather of one row per rank
            r = MakeRequest("odds" + suffix, CollectiveType::kAllgather, DataType::kInt32, {1});
            input = Bytes(std::vector<int32_t>{rank});
          } else {  // {0, last}: broadcast from the last rank (a job rank)
            r = MakeRequest("ends" + suffix, CollectiveType::kBroadcast, DataType::kInt64, {1});
            r.root_rank = size - 1;
            input = Bytes(std::vector<int64_t>{rank * 10});
          }
          r.process_set_id = id;
          return Job{r.name, Submit(cluster.rank(rank), r, input), id};
        });
      }
      std::shuffle(makers.begin(), makers.end(), rng);
      std::vector<Job> jobs;
      for (auto& make : makers) jobs.push_back(make());
      for (Job& job : jobs) {
        Status status = Await(*job.tensor);
        EXPECT_TRUE(status.ok(), job.name << ": " << status.message());
        if (job.set == 0) {
          EXPECT_TRUE(Values<float>(job.tensor->output, 2)[0] == size * (size + 1) / 2.0f,
                      job.name);
        } else if (job.set == 1) {
          EXPECT_TRUE(Values<float>(job.tensor->output, 3)[2] == sum_of(evens),
                      job.name << " = " << Values<float>(job.tensor->output, 3)[2]);
        } else if (job.set == 2) {
          EXPECT_TRUE(Values<int32_t>(job.tensor->output, odds.size()) ==
                          std::vector<int32_t>(odds.begin(), odds.end()),
                      job.name);
        } else {
          EXPECT_TRUE(Values<int64_t>(job.tensor->output, 1)[0] == (size - 1) * 10, job.name);
        }
      }
    }
    // A mismatch inside a set names job ranks: the odd ranks disagree on the
    // shape, and the message names rank 1 and rank 3.
    if (size >= 4 && rank % 2 == 1) {
      Request r = MakeRequest("odd_mismatch", CollectiveType::kAllreduce, DataType::kFloat32,
                              {rank == 1 ? 2 : 3});
      r.process_set_id = 2;
      auto tensor = Submit(cluster.rank(rank), r, Bytes(std::vector<float>(rank == 1 ? 2 : 3)));
      Status status = Await(*tensor);
      EXPECT_TRUE(!status.ok() && status.message().find("rank 1 submitted [2]") !=
                                      std::string::npos &&
                      (status.message().find("rank 3 submitted [3]") != std::string::npos ||
                       status.message().find("ranks 3, 5") != std::string::npos),
                  status.message());
    }
  });
}

// Join: rank r has r + 1 batches. At step k the ranks that still have data
// allreduce (Average) (r + 1) * (k + 1); ranks out of data have joined and
// take part with zeros, and Average divides by the ranks that contributed.
// While ranks have joined, a broadcast or an allgather fails on the ranks
// that submitted it, naming the joined ranks; join() returns the last rank
// to join (the one with the most batches) on every rank; afterwards the job
// goes on normally.
void TestJoin(int size) {
  LoopbackCluster cluster(size, TestConfig());
  OnEveryRank(size, [&](int rank) {
    RankContext& context = cluster.rank(rank);
    const int batches = rank + 1;
    for (int k = 0; k < batches; ++k) {
      Request request = MakeRequest("grad", CollectiveType::kAllreduce, DataType::kFloat32, {4});
      request.reduce_op = ReduceOp::kAverage;
      auto tensor =
          Submit(context, request, Bytes(std::vector<float>(4, float((rank + 1) * (k + 1)))));
      Status status = Await(*tensor);
      EXPECT_TRUE(status.ok(), "step " << k << ": " << status.message());
      // Ranks k..size-1 still have data at step k.
      float sum = 0;
      for (int r = k; r < size; ++r) sum += float((r + 1) * (k + 1));
      const float expected = sum / float(size - k);
      const float got = Values<float>(tensor->output, 4)[3];
      EXPECT_TRUE(std::abs(got - expected) <= 1e-5f * expected,
                  "step " << k << ": " << got << ", expected " << expected);
      if (size >= 3 && k == size - 2 && rank == size - 1) {
        // Only ranks size-2 and size-1 are left; the others have joined.
        Request bcast = MakeRequest("late_bcast", CollectiveType::kBroadcast, DataType::kInt32,
                                    {1});
        bcast.root_rank = 0;
        auto sent = Submit(context, bcast, Bytes(std::vector<int32_t>{1}));
        status = Await(*sent);
        EXPECT_TRUE(!status.ok() && status.message().find("joined") != std::string::npos &&
                        status.message().find("rank 0") != std::string::npos,
                    status.message());
      }
      if (size >= 3 && k == size - 2 && rank == size - 2) {
        Request bcast = MakeRequest("late_bcast", CollectiveType::kBroadcast, DataType::kInt32,
                                    {1});
        bcast.root_rank = 0;
        auto sent = Submit(context, bcast, Bytes(std::vector<int32_t>{1}));
        status = Await(*sent);
        EXPECT_TRUE(!status.ok() && status.message().find("has nothing to send") !=
                                        std::string::npos,
                    status.message());
      }
    }
    Request join = MakeRequest(kJoinTensorName, CollectiveType::kJoin, DataType::kInt32, {});
    auto joined = Submit(context, join, Bytes(std::vector<int32_t>{-7}));
    Status status = Await(*joined);
    EXPECT_TRUE(status.ok(), status.message());
    EXPECT_TRUE(Values<int32_t>(joined->output, 1)[0] == size - 1,
                "last joined " << Values<int32_t>(joined->output, 1)[0]);
    // Back to normal: every rank contributes again, Average divides by size.
    for (int step = 0; step < 2; ++step) {
      Request request = MakeRequest("after_join", CollectiveType::kAllreduce, DataType::kFloat32,
                                    {1});
      request.reduce_op = ReduceOp::kAverage;
      auto tensor = Submit(context, request, Bytes(std::vector<float>{float(rank)}));
      status = Await(*tensor);
      EXPECT_TRUE(status.ok(), status.message());
      const float got = Values<float>(tensor->output, 1)[0];
      EXPECT_TRUE(std::abs(got - (size - 1) / 2.0f) <= 1e-5f * size, "after join: " << got);
    }
    // A second join works the same way.
    auto again = Submit(context, join, Bytes(std::vector<int32_t>{-7}));
    EXPECT_TRUE(Await(*again).ok(), "second join");
  });
}

// The autotuner switches the fusion and direct thresholds while tensors of
// sizes on both sides of them are reduced in random orders: every result
// must stay right (all ranks switch in the same round), and the log must
// show that the thresholds did change.
void TestAutotuneSwitching(int size) {
  char log_template[] = "/tmp/tfring_autotune_XXXXXX";
  const int fd = mkstemp(log_template);
  EXPECT_TRUE(fd >= 0, "mkstemp");
  close(fd);
  Config config = TestConfig();
  config.fusion_threshold = 4 * 1024 * 1024;
  config.autotune = 1;  // rank 0's value decides
  config.autotune_log = log_template;
  config.autotune_warmup_samples = 0;
  config.autotune_cycles_per_sample = 1;
  config.autotune_samples_per_trial = 1;
  config.autotune_max_trials = 12;
  const int count = 10;
  const int steps = 20;
  LoopbackCluster cluster(size, config);
  OnEveryRank(size, [&](int rank) {
    std::mt19937 shuffle_rng(77 + rank);
    for (int step = 0; step < steps; ++step) {
      std::vector<int> order(count);
      for (int i = 0; i < count; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), shuffle_rng);
      std::map<int, std::unique_ptr<Submitted>> submitted;
      const auto elements_of = [](int i) -> int64_t { return int64_t{1} << (6 + i * 3 / 2); };
      for (int i : order) {
        std::vector<float> values(elements_of(i), float(rank + step));
        submitted[i] = Submit(cluster.rank(rank),
                              MakeRequest("tuned_" + std::to_string(i), CollectiveType::kAllreduce,
                                          DataType::kFloat32, {elements_of(i)}),
                              Bytes(values));
      }
      const float expected = size * (size - 1) / 2.0f + float(size) * step;
      for (auto& [i, tensor] : submitted) {
        Status status = Await(*tensor);
        EXPECT_TRUE(status.ok(), status.message());
        const std::vector<float> out = Values<float>(tensor->output, elements_of(i));
        for (float value : out) {
          EXPECT_TRUE(value == expected,
                      "step " << step << " tensor " << i << ": " << value << " != " << expected);
        }
      }
    }
  });
  cluster.Stop();
  std::ifstream log(log_template);
  std::set<std::string> thresholds;
  std::string line;
  std::getline(log, line);  // header
  while (std::getline(log, line)) {
    std::stringstream fields(line);
    std::string trial, phase, fusion, direct;
    std::getline(fields, trial, ',');
    std::getline(fields, phase, ',');
    std::getline(fields, fusion, ',');
    std::getline(fields, direct, ',');
    thresholds.insert(fusion + "/" + direct);
  }
  std::remove(log_template);
  EXPECT_TRUE(thresholds.size() >= 3, "the autotuner tried " << thresholds.size()
                                                              << " threshold pairs");
}

// Members of a grouped call (SubmissionGroup) do not wake the background
// thread until the last one arrives; any other request does, and a wake-up
// takes the held members too. Then, in a cluster, groups whose members are
// submitted slowly and in a different order on every rank all complete.
void TestGroupedSubmission(int size) {
  using Clock = std::chrono::steady_clock;
  auto entry = [](const std::string& name) {
    return TensorEntry{MakeRequest(name, CollectiveType::kAllreduce, DataType::kFloat32, {1}),
                       TensorBuffers{}, [](const Status&) {}};
  };
  auto blocked_for = [](TensorQueue& queue, std::chrono::milliseconds limit) {
    const Clock::time_point start = Clock::now();
    queue.WaitForWork(start + limit);
    return Clock::now() - start;
  };
  const auto held = std::chrono::milliseconds(60);
  const auto long_wait = std::chrono::seconds(20);
  TensorQueue queue;
  EXPECT_TRUE(queue.Add(entry("g.0"), SubmissionGroup{7, 3}).ok(), "add g.0");
  EXPECT_TRUE(queue.Add(entry("g.1"), SubmissionGroup{7, 3}).ok(), "add g.1");
  // Two of three: nothing wakes the thread before the deadline.
  EXPECT_TRUE(blocked_for(queue, held) >= held, "woke for an incomplete group");
  std::thread last([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    queue.Add(entry("g.2"), SubmissionGroup{7, 3});
  });
  EXPECT_TRUE(blocked_for(queue, long_wait) < long_wait / 2, "the last member did not wake it");
  last.join();
  std::vector<SubmittedRequest> taken = queue.TakeNewRequests();
  EXPECT_TRUE(taken.size() == 3 && taken[0].request.name == "g.0" &&
                  taken[2].request.name == "g.2",
              "took " << taken.size() << " requests");

  // An ordinary request wakes it at once and takes the held member along;
  // the group's last member still wakes it afterwards.
  EXPECT_TRUE(queue.Add(entry("h.0"), SubmissionGroup{8, 2}).ok(), "add h.0");
  EXPECT_TRUE(queue.Add(entry("single"), SubmissionGroup{}).ok(), "add single");
  EXPECT_TRUE(blocked_for(queue, long_wait) < long_wait / 2, "an ordinary request did not wake it");
  taken = queue.TakeNewRequests();
  EXPECT_TRUE(taken.size() == 2, "took " << taken.size() << " requests, expected h.0 and single");
  EXPECT_TRUE(blocked_for(queue, held) >= held, "woke with nothing new");
  EXPECT_TRUE(queue.Add(entry("h.1"), SubmissionGroup{8, 2}).ok(), "add h.1");
  EXPECT_TRUE(blocked_for(queue, long_wait) < long_wait / 2, "the rest of a group taken early did not wake it");
  EXPECT_TRUE(queue.TakeNewRequests().size() == 1, "h.1 not taken");
  for (const char* name : {"g.0", "g.1", "g.2", "h.0", "single", "h.1"}) queue.Take(name);

  // End to end: 4 groups of 5 per rank, members submitted in a rank-specific
  // order with pauses, and a member missing from one group on every rank
  // (it never arrives, as when a kernel fails before submitting).
  LoopbackCluster cluster(size, TestConfig());
  std::vector<std::unique_ptr<Submitted>> submitted(size * 4 * 5);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.emplace_back([&, rank] {
      std::mt19937 random(rank);
      for (int g = 0; g < 4; ++g) {
        std::vector<int> order{0, 1, 2, 3, 4};
        std::shuffle(order.begin(), order.end(), random);
        for (int member : order) {
          if (g == 3 && member == 4) continue;  // never submitted
          if (random() % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          const std::string name = "grad." + std::to_string(g) + "." + std::to_string(member);
          submitted[(rank * 4 + g) * 5 + member] =
              Submit(cluster.rank(rank),
                     MakeRequest(name, CollectiveType::kAllreduce, DataType::kFloat32, {3}),
                     Bytes(std::vector<float>(3, static_cast<float>(rank + g + member))), {},
                     SubmissionGroup{100 + g, 5});
        }
      }
    });
  }
  for (std::thread& thread : ranks) thread.join();
  for (int rank = 0; rank < size; ++rank) {
    for (int g = 0; g < 4; ++g) {
      for (int member = 0; member < 5; ++member) {
        Submitted* one = submitted[(rank * 4 + g) * 5 + member].get();
        if (one == nullptr) continue;
        const Status status = Await(*one);
        EXPECT_TRUE(status.ok(), status.message());
        const float expected = size * (size - 1) / 2.0f + size * (g + member);
        EXPECT_TRUE(Values<float>(one->output, 3) == std::vector<float>(3, expected),
                    "grad." << g << "." << member << " on rank " << rank);
      }
    }
  }
  cluster.Stop();
}

// HierarchicalTransport over loopback worlds: `size` ranks as hosts x local
// ranks (every split of `size` into two factors >= 1), allreduce of counts
// below, at and above the local size, for Sum, Min and Product of float32
// and int32, through the three steps and (under the threshold) flat. Every
// rank must get the exact integer results, and identical float bits.
void TestHierarchicalAllreduce(int size) {
  for (int local_size = 1; local_size <= size; ++local_size) {
    if (size % local_size != 0) continue;
    const int hosts = size / local_size;
    auto flat_world = std::make_shared<LoopbackWorld>(size);
    std::vector<std::shared_ptr<LoopbackWorld>> host_worlds, cross_worlds;
    for (int h = 0; h < hosts; ++h) host_worlds.push_back(std::make_shared<LoopbackWorld>(local_size));
    for (int j = 0; j < local_size; ++j) cross_worlds.push_back(std::make_shared<LoopbackWorld>(hosts));
    const std::vector<int64_t> counts{1, 2, static_cast<int64_t>(local_size) + 1, 1000, 4099};
    const std::vector<ReduceOp> ops{ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kProduct};
    // results[rank][case] as bytes.
    std::vector<std::vector<std::vector<uint8_t>>> results(size);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < size; ++rank) {
      threads.emplace_back([&, rank] {
        // Ranks of a host are consecutive, as mpirun places them by default.
        const int host = rank / local_size, local_rank = rank % local_size;
        LoopbackTransport flat(flat_world, rank);
        HierarchicalTransport transport(
            &flat, std::make_unique<LoopbackTransport>(host_worlds[host], local_rank),
            std::make_unique<LoopbackTransport>(cross_worlds[local_rank], host),
            /*min_bytes=*/16);
        for (int64_t count : counts) {
          for (ReduceOp op : ops) {
            std::vector<float> f(count);
            std::vector<int32_t> n(count);
            for (int64_t i = 0; i < count; ++i) {
              f[i] = 1.0f / (3 + rank + i % 7) + (op == ReduceOp::kProduct ? 1.0f : 0.0f);
              n[i] = static_cast<int32_t>((rank + 1) * (i % 5 + 1)) * (i % 2 ? -1 : 1);
            }
            std::vector<float> f_out(count);
            Status status = transport.Allreduce(f.data(), f_out.data(), count,
                                                DataType::kFloat32, op);
            EXPECT_TRUE(status.ok(), status.message());
            status = transport.Allreduce(n.data(), n.data(), count, DataType::kInt32, op);
            EXPECT_TRUE(status.ok(), status.message());
            results[rank].push_back(Bytes(f_out));
            results[rank].push_back(Bytes(n));
          }
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    size_t index = 0;
    for (int64_t count : counts) {
      for (ReduceOp op : ops) {
        std::vector<int64_t> expected(count);
        for (int64_t i = 0; i < count; ++i) {
          for (int rank = 0; rank < size; ++rank) {
            const int64_t v = static_cast<int64_t>((rank + 1) * (i % 5 + 1)) * (i % 2 ? -1 : 1);
            if (rank == 0) expected[i] = v;
            else if (op == ReduceOp::kSum) expected[i] += v;
            else if (op == ReduceOp::kMin) expected[i] = std::min(expected[i], v);
            else expected[i] = static_cast<int32_t>(expected[i] * v);
          }
        }
        const std::vector<int32_t> got = Values<int32_t>(results[0][index + 1], count);
        for (int64_t i = 0; i < count; ++i) {
          EXPECT_TRUE(got[i] == static_cast<int32_t>(expected[i]),
                      "int32 " << ReduceOpName(op) << " count " << count << " element " << i
                               << ": " << got[i] << " != " << expected[i] << " (hosts "
                               << hosts << " x " << local_size << ")");
        }
        for (int rank = 1; rank < size; ++rank) {
          EXPECT_TRUE(results[rank][index] == results[0][index] &&
                          results[rank][index + 1] == results[0][index + 1],
                      "rank " << rank << " differs from rank 0: " << ReduceOpName(op) << " count "
                              << count << " (hosts " << hosts << " x " << local_size << ")");
        }
        const std::vector<float> floats = Values<float>(results[0][index], count);
        for (int64_t i = 0; i < count; ++i) {
          double want = op == ReduceOp::kSum ? 0.0 : (op == ReduceOp::kMin ? 1e30 : 1.0);
          for (int rank = 0; rank < size; ++rank) {
            const double v = 1.0 / (3 + rank + i % 7) + (op == ReduceOp::kProduct ? 1.0 : 0.0);
            want = op == ReduceOp::kSum ? want + v : (op == ReduceOp::kMin ? std::min(want, v) : want * v);
          }
          EXPECT_TRUE(std::fabs(floats[i] - want) <= 1e-5 * std::fabs(want),
                      "float32 " << ReduceOpName(op) << " count " << count << " element " << i);
        }
        index += 2;
      }
    }
  }
}

// CPU shares for `size` ranks on one host: disjoint, covering the CPUs,
// sizes within one, whole cores where they divide evenly (hardware threads
// numbered as Linux does: core c has CPUs c and c + cores); none where the
// ranks may run on different CPUs or there are fewer CPUs than ranks.
void TestCpuShares(int size) {
  EXPECT_TRUE(CpuListToString({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8",
              CpuListToString({0, 1, 2, 5, 7, 8}));
  EXPECT_TRUE(CpuListToString({}).empty(), "empty list");
  for (int cores : {size, size + 1, 2 * size, 13}) {
    const int cpus = 2 * cores;
    std::vector<int> all;
    std::vector<CpuPlace> places;
    for (int cpu = 0; cpu < cpus; ++cpu) {
      all.push_back(cpu);
      places.push_back(CpuPlace{cpu, 0, cpu % cores});
    }
    const std::vector<std::vector<int>> same(size, all);
    std::set<int> covered;
    for (int rank = 0; rank < size; ++rank) {
      const std::vector<int> share = ChooseCpuShare(same, rank, places);
      if (size == 1) {
        EXPECT_TRUE(share.empty(), "one rank on the host is left alone");
        continue;
      }
      EXPECT_TRUE(std::abs(static_cast<int>(share.size()) - cpus / size) <= 1,
                  "rank " << rank << " got " << CpuListToString(share) << " of " << cpus);
      for (int cpu : share) {
        EXPECT_TRUE(covered.insert(cpu).second, "CPU " << cpu << " given twice");
        if (cores % size == 0) {
          const int sibling = cpu < cores ? cpu + cores : cpu - cores;
          EXPECT_TRUE(std::count(share.begin(), share.end(), sibling) == 1,
                      "rank " << rank << " has CPU " << cpu << " without its sibling "
                              << sibling << ": " << CpuListToString(share));
        }
      }
    }
    if (size > 1) {
      EXPECT_TRUE(static_cast<int>(covered.size()) == cpus, "shares cover " << covered.size());
    }
  }
  if (size < 2) return;
  std::vector<int> few;
  for (int cpu = 0; cpu < size - 1; ++cpu) few.push_back(cpu);
  EXPECT_TRUE(ChooseCpuShare(std::vector<std::vector<int>>(size, few), 0, {}).empty(),
              "fewer CPUs than ranks");
  // Each rank may run on enough CPUs, but not on the same ones.
  std::vector<std::vector<int>> bound_each(size);
  for (int rank = 0; rank < size; ++rank) {
    for (int cpu = 0; cpu <= 2 * size; ++cpu) {
      if (cpu != rank) bound_each[rank].push_back(cpu);
    }
  }
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_TRUE(ChooseCpuShare(bound_each, rank, {}).empty(),
                "ranks the launcher bound one by one are left alone");
  }
}

const std::map<std::string, void (*)(int)>& Scenarios() {
  static const std::map<std::string, void (*)(int)> scenarios = {
      {"allreduce_orders", TestAllreduceOrders},
      {"wire_compression_on_one_host_is_exact", TestWireCompressionOnOneHostIsExact},
      {"small_fusion_threshold", TestSmallFusionThreshold},
      {"cache_steady_state", TestCacheSteadyState},
      {"cache_capacity_costs_nothing_up_front", TestCacheCapacityCostsNothingUpFront},
      {"shape_mismatch_then_recovery", TestShapeMismatchThenRecovery},
      {"every_mismatch_kind", TestEveryMismatchKind},
      {"allgather_and_broadcast", TestAllgatherAndBroadcast},
      {"ops_scales_sixteen_bit", TestOpsScalesAndSixteenBit},
      {"duplicate_name_rejected", TestDuplicateNameRejected},
      {"peer_shutdown_fails_pending", TestPeerShutdownFailsPending},
      {"fusion_planner", TestFusionPlanner},
      {"cpu_shares", TestCpuShares},
      {"half_conversions", TestHalfConversions},
      {"job_config_from_rank0", TestJobConfigFromRankZero},
      {"per_tensor_failure_on_one_rank", TestPerTensorFailureOnOneRank},
      {"integer_average", TestIntegerAverage},
      {"alltoall", TestAlltoall},
      {"alltoall_bad_splits", TestAlltoallBadSplits},
      {"reducescatter", TestReducescatter},
      {"fused_allgather", TestFusedAllgather},
      {"process_sets", TestProcessSets},
      {"join", TestJoin},
      {"autotune_switching", TestAutotuneSwitching},
      {"grouped_submission", TestGroupedSubmission},
      {"hierarchical_allreduce", TestHierarchicalAllreduce},
  };
  return scenarios;
}

}  // namespace
}  // namespace testing
}  // namespace tfring

int main(int argc, char** argv) {
  using namespace tfring::testing;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <scenario|all|list> <world_size>\n", argv[0]);
    return 2;
  }
  const std::string which = argv[1];
  const int size = std::atoi(argv[2]);
  return RunScenarios(Scenarios(), which, " size=" + std::to_string(size),
                      [size](auto fn) { fn(size); });
}
