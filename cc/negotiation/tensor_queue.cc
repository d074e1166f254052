#include "cc/negotiation/tensor_queue.h"

#include <exception>

#include "cc/logging.h"

namespace tfring {

void CompleteEntry(TensorEntry& entry, const Status& result) {
  try {
    entry.done(result);
  } catch (const std::exception& e) {
    TFRING_LOG(kError, "the completion callback of '" << entry.request.name
                                                      << "' threw an exception: " << e.what());
  } catch (...) {
    TFRING_LOG(kError, "the completion callback of '" << entry.request.name
                                                      << "' threw a non-standard exception");
  }
}

Status TensorQueue::Add(TensorEntry entry, SubmissionGroup group) {
  bool wake = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return close_reason_;
    const std::string& name = entry.request.name;
    if (in_flight_.count(name)) {
      return Status::InvalidArgument(
          "tfring: a " + std::string(CollectiveTypeName(entry.request.type)) + " named '" +
          name +
          "' is already in flight on this rank. Each collective in flight needs a unique name: "
          "pass a distinct name= to each call that runs concurrently, or wait for the first "
          "one to finish.");
    }
    new_requests_.push_back(SubmittedRequest{entry.request, std::chrono::steady_clock::now()});
    in_flight_.emplace(name, std::move(entry));
    if (group.size > 1) {
      GroupProgress& progress = incomplete_groups_[group.key];
      if (++progress.arrived < group.size) {
        ++progress.held;
        ++held_for_groups_;
        wake = false;
      } else {
        held_for_groups_ -= progress.held;
        incomplete_groups_.erase(group.key);
      }
    }
  }
  // After unlocking: the background thread preempts on waking (see
  // thread_tuning.h) and would otherwise block at once on the mutex.
  if (wake) work_arrived_.notify_one();
  return Status::OK();
}

std::vector<SubmittedRequest> TensorQueue::TakeNewRequests() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<SubmittedRequest> taken;
  taken.swap(new_requests_);
  // Members of an incomplete group taken now (the thread woke for other
  // work or its cycle) go into this round; the group's last member still
  // wakes the thread for the rest.
  for (auto& [key, progress] : incomplete_groups_) progress.held = 0;
  held_for_groups_ = 0;
  return taken;
}

TensorEntry TensorQueue::Take(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = in_flight_.find(name);
  TFRING_CHECK(it != in_flight_.end(), "no tensor named '" << name << "' in flight");
  TensorEntry entry = std::move(it->second);
  in_flight_.erase(it);
  return entry;
}

bool TensorQueue::TryTake(const std::string& name, TensorEntry* entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = in_flight_.find(name);
  if (it == in_flight_.end()) return false;
  *entry = std::move(it->second);
  in_flight_.erase(it);
  return true;
}

std::vector<TensorEntry> TensorQueue::Close(const Status& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  close_reason_ = reason;
  std::vector<TensorEntry> remaining;
  for (auto& [name, entry] : in_flight_) remaining.push_back(std::move(entry));
  in_flight_.clear();
  new_requests_.clear();
  incomplete_groups_.clear();
  held_for_groups_ = 0;
  return remaining;
}

void TensorQueue::WaitForWork(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  work_arrived_.wait_until(lock, deadline,
                           [&] { return new_requests_.size() > held_for_groups_ || woken_; });
  woken_ = false;
}

void TensorQueue::Wake() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_ = true;
  }
  work_arrived_.notify_one();
}

}  // namespace tfring
