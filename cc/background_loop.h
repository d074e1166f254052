// BackgroundLoop: the one thread per process that does all communication.
//
// Why one thread:
//  - MPI (and later NCCL) calls stay on a single thread, in one order.
//  - Every rank must learn every other rank's shape, dtype and op for a
//    tensor before any data moves, so that a mismatch becomes an error on
//    all ranks instead of a hang or corrupted values.
//  - Framework threads never block on the network; they enqueue and return.
//  - Ranks may submit tensors in different orders (TensorFlow runs
//    independent ops in any order); the negotiation puts them in one order.
// Each cycle: wait for new work (or the cycle time), run a negotiation round
// (controller), execute the agreed responses (executor), fire callbacks.
#ifndef TFRING_CC_BACKGROUND_LOOP_H_
#define TFRING_CC_BACKGROUND_LOOP_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "cc/collective_executor.h"
#include "cc/config.h"
#include "cc/controller.h"
#include "cc/tensor_queue.h"
#include "cc/transport.h"

namespace tfring {

class BackgroundLoop {
 public:
  // The loop borrows `transport` and `queue`; both must outlive it.
  BackgroundLoop(Transport* transport, TensorQueue* queue, const Config& config);
  ~BackgroundLoop();

  // Collective: prepares every rank's executor, then starts the thread. On
  // failure (on any rank) no thread starts and every rank returns the error.
  Status Start();
  // Asks every rank to stop at the next round; returns immediately.
  void RequestShutdown();
  // Waits for the thread to exit. Returns why the loop stopped.
  Status Join();
  bool running() const { return running_.load(); }
  // Valid after Join (the controller belongs to the background thread).
  const Controller& controller() const { return controller_; }

 private:
  void Run();
  // One negotiation round; an exception (e.g. std::bad_alloc) becomes an
  // error status, which stops the loop like a transport failure would.
  Status RunRoundCatching(RoundOutcome* outcome);

  Transport* transport_;
  TensorQueue* queue_;
  const Config& config_;
  Controller controller_;
  CollectiveExecutor executor_;
  std::thread thread_;
  std::atomic<bool> shutdown_requested_{false};
  std::atomic<bool> running_{false};
  Status exit_status_;
};

}  // namespace tfring

#endif  // TFRING_CC_BACKGROUND_LOOP_H_
