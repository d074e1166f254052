// Ranks as threads: a world of BackgroundLoops over one LoopbackWorld, with
// helpers to submit tensors and wait for their completion with a deadline
// (a test that would hang fails instead).
#ifndef TFRING_TESTS_CC_LOOPBACK_HARNESS_H_
#define TFRING_TESTS_CC_LOOPBACK_HARNESS_H_

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cc/execution/background_loop.h"
#include "cc/config.h"
#include "cc/job/job_config.h"
#include "cc/transport/loopback_transport.h"
#include "cc/negotiation/tensor_queue.h"
#include "tests/cc/expect.h"

namespace tfring {
namespace testing {

// One rank's loop and the memory of the tensors it submitted.
struct RankContext {
  Config config;  // after the start-up agreement
  std::unique_ptr<LoopbackTransport> transport;
  std::unique_ptr<TensorQueue> queue;
  std::unique_ptr<BackgroundLoop> loop;
};

class LoopbackCluster {
 public:
  // Every rank starts from `config`.
  LoopbackCluster(int size, const Config& config)
      : LoopbackCluster(std::vector<Config>(size, config)) {}

  // With process sets: `process_sets[i]` (sorted ranks) gets id i + 1 and
  // its own loopback world.
  LoopbackCluster(int size, const Config& config, std::vector<std::vector<int>> process_sets)
      : LoopbackCluster(std::vector<Config>(size, config), std::move(process_sets)) {}

  // Rank r starts from configs[r]; as at a real init, every rank then adopts
  // rank 0's job-wide knobs (job_config.h) before its loop starts.
  explicit LoopbackCluster(std::vector<Config> configs,
                           std::vector<std::vector<int>> process_sets = {}) {
    const int size = static_cast<int>(configs.size());
    auto world = std::make_shared<LoopbackWorld>(size);
    std::vector<std::shared_ptr<LoopbackWorld>> set_worlds;
    for (const std::vector<int>& ranks : process_sets) {
      set_worlds.push_back(std::make_shared<LoopbackWorld>(static_cast<int>(ranks.size())));
    }
    for (int rank = 0; rank < size; ++rank) {
      auto context = std::make_unique<RankContext>();
      context->transport = std::make_unique<LoopbackTransport>(world, rank);
      context->queue = std::make_unique<TensorQueue>();
      context->config = configs[rank];
      ranks_.push_back(std::move(context));
    }
    // Start-up is collective: one thread per rank, as in separate processes.
    std::vector<std::thread> starting;
    std::vector<Status> started(size);
    for (int rank = 0; rank < size; ++rank) {
      starting.emplace_back([this, rank, &started, &process_sets, &set_worlds] {
        RankContext& context = *ranks_[rank];
        started[rank] = AdoptRootJobConfig(context.transport.get(), &context.config);
        if (!started[rank].ok()) return;
        context.loop = std::make_unique<BackgroundLoop>(context.transport.get(),
                                                        context.queue.get(), context.config);
        for (size_t s = 0; s < process_sets.size(); ++s) {
          const std::vector<int>& ranks = process_sets[s];
          auto position = std::find(ranks.begin(), ranks.end(), rank);
          if (position == ranks.end()) continue;
          context.loop->AddProcessSet(
              static_cast<int32_t>(s + 1), ranks,
              std::make_unique<LoopbackTransport>(
                  set_worlds[s], static_cast<int>(position - ranks.begin())));
        }
        started[rank] = context.loop->Start();
      });
    }
    for (std::thread& thread : starting) thread.join();
    for (int rank = 0; rank < size; ++rank) {
      if (!started[rank].ok()) {
        throw TestFailure{"rank " + std::to_string(rank) +
                          " failed to start: " + started[rank].message()};
      }
    }
  }
  ~LoopbackCluster() { Stop(); }

  int size() const { return static_cast<int>(ranks_.size()); }
  RankContext& rank(int r) { return *ranks_[r]; }

  // Every rank asks to stop; all loops end in the same round.
  void Stop() {
    for (auto& context : ranks_) {
      if (context->loop) context->loop->RequestShutdown();
    }
    for (auto& context : ranks_) {
      if (context->loop) context->loop->Join();
    }
  }

 private:
  std::vector<std::unique_ptr<RankContext>> ranks_;
};

// A submitted tensor: owns its input and output and the completion future.
struct Submitted {
  std::vector<uint8_t> input;
  std::vector<uint8_t> output;
  std::vector<int64_t> output_shape;
  std::vector<int64_t> received_splits;  // alltoall
  std::shared_ptr<std::promise<Status>> done = std::make_shared<std::promise<Status>>();
  std::future<Status> result = done->get_future();
  Status enqueue_status;
};

// `splits`: alltoall only (empty: even split).
inline std::unique_ptr<Submitted> Submit(RankContext& context, Request request,
                                         std::vector<uint8_t> input,
                                         std::vector<int64_t> splits = {},
                                         SubmissionGroup group = {}) {
  auto submitted = std::make_unique<Submitted>();
  submitted->input = std::move(input);
  Submitted* raw = submitted.get();
  TensorBuffers buffers;
  buffers.input = raw->input.data();
  buffers.splits = std::move(splits);
  buffers.received_splits = &raw->received_splits;
  if (request.type == CollectiveType::kAllgather || request.type == CollectiveType::kAlltoall ||
      request.type == CollectiveType::kReducescatter) {
    buffers.allocate_output = [raw, dtype = request.dtype](const std::vector<int64_t>& shape,
                                                           void** data) {
      raw->output_shape = shape;
      raw->output.resize(NumElements(shape) * DataTypeSize(dtype) + 1);
      *data = raw->output.data();
      return Status::OK();
    };
  } else {
    raw->output.resize(raw->input.size() + 1);
    buffers.output = raw->output.data();
  }
  auto done = raw->done;
  raw->enqueue_status = context.queue->Add(
      TensorEntry{std::move(request), buffers, [done](const Status& s) { done->set_value(s); }},
      group);
  if (!raw->enqueue_status.ok()) done->set_value(raw->enqueue_status);
  return submitted;
}

inline Status Await(Submitted& submitted, double seconds = 20.0) {
  if (submitted.result.wait_for(std::chrono::duration<double>(seconds)) !=
      std::future_status::ready) {
    throw TestFailure{"a collective did not complete within the deadline (hang)"};
  }
  return submitted.result.get();
}

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

template <typename T>
std::vector<T> Values(const std::vector<uint8_t>& bytes, size_t count) {
  std::vector<T> values(count);
  if (count) std::memcpy(values.data(), bytes.data(), count * sizeof(T));
  return values;
}

inline Request MakeRequest(const std::string& name, CollectiveType type, DataType dtype,
                           std::vector<int64_t> shape) {
  Request request;
  request.name = name;
  request.type = type;
  request.dtype = dtype;
  request.shape = std::move(shape);
  request.reduce_op = ReduceOp::kSum;
  return request;
}

// Runs body(rank) on one thread per rank and rethrows the first failure.
inline void OnEveryRank(int size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::string> failures(size);
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const TestFailure& failure) {
        failures[rank] = failure.message;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < size; ++rank) {
    if (!failures[rank].empty()) {
      throw TestFailure{"rank " + std::to_string(rank) + ": " + failures[rank]};
    }
  }
}

}  // namespace testing
}  // namespace tfring

#endif  // TFRING_TESTS_CC_LOOPBACK_HARNESS_H_
