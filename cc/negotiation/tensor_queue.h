// TensorQueue: the hand-off point between framework threads and the
// background thread.
//
// Framework threads Add entries (any thread, any time); the background thread
// takes the new requests each round and later Takes the entries it executes.
// A name may be in flight only once: a second Add under the same name is a
// user error reported immediately. Names are released before callbacks run,
// because an eager caller may resubmit the same name as soon as it is done.
#ifndef TFRING_CC_NEGOTIATION_TENSOR_QUEUE_H_
#define TFRING_CC_NEGOTIATION_TENSOR_QUEUE_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cc/api.h"
#include "cc/common.h"
#include "cc/status.h"

namespace tfring {

struct TensorEntry {
  Request request;
  TensorBuffers buffers;
  DoneCallback done;
  // Set by the executor from the response: how many ranks contributed
  // (Average divides by it; fewer than the size while ranks have joined).
  int32_t contributors = 0;
};

// Calls entry.done(result). An exception from the framework's callback is
// logged, never allowed to end the background thread.
void CompleteEntry(TensorEntry& entry, const Status& result);

class TensorQueue {
 public:
  // Fails if the queue is closed or the name is already in flight. A member
  // of a group wakes the background thread only when it completes the
  // group (see SubmissionGroup).
  Status Add(TensorEntry entry, SubmissionGroup group = {});
  // Requests added since the last call, in submission order.
  std::vector<SubmittedRequest> TakeNewRequests();
  // Removes and returns the in-flight entry for `name` (must exist).
  TensorEntry Take(const std::string& name);
  // Like Take; false (and no entry) when `name` is not in flight here, as
  // for the tensors of other ranks that a joined rank takes part in.
  bool TryTake(const std::string& name, TensorEntry* entry);
  // Closes the queue (later Adds fail with `reason`) and returns every entry
  // still in flight.
  std::vector<TensorEntry> Close(const Status& reason);
  // Blocks until a new request arrives that no incomplete group holds back,
  // `deadline` passes, or Wake is called.
  void WaitForWork(std::chrono::steady_clock::time_point deadline);
  void Wake();

 private:
  std::mutex mutex_;
  std::condition_variable work_arrived_;
  std::unordered_map<std::string, TensorEntry> in_flight_;
  std::vector<SubmittedRequest> new_requests_;
  // Groups not yet complete, by key: members arrived, and those of them
  // still in new_requests_ (held back from waking the thread).
  struct GroupProgress {
    int32_t arrived = 0;
    int32_t held = 0;
  };
  std::unordered_map<int64_t, GroupProgress> incomplete_groups_;
  size_t held_for_groups_ = 0;  // the sum of `held` above
  bool woken_ = false;
  bool closed_ = false;
  Status close_reason_;
};

}  // namespace tfring

#endif  // TFRING_CC_NEGOTIATION_TENSOR_QUEUE_H_
