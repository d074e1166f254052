#include "cc/negotiation/process_set_registry.h"

#include <utility>

namespace tfring {

ProcessSetRegistry::ProcessSetRegistry(std::map<int32_t, std::vector<int>> sets, bool dynamic)
    : dynamic_(dynamic), sets_(std::move(sets)) {
  for (const auto& [id, ranks] : sets_) {
    if (id >= next_id_) next_id_ = id + 1;
  }
}

std::map<int32_t, std::vector<int>> ProcessSetRegistry::Sets() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sets_;
}

bool ProcessSetRegistry::Find(int32_t id, std::vector<int>* ranks) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return false;
  if (ranks != nullptr) *ranks = it->second;
  return true;
}

int32_t ProcessSetRegistry::next_id() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_id_;
}

Status ProcessSetRegistry::StageAndWait(Change change) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!stop_reason_.ok()) return stop_reason_;
  staged_ = std::make_unique<Change>(std::move(change));
  taken_ = false;
  done_ = false;
  applied_.wait(lock, [&] { return done_ || !stop_reason_.ok(); });
  staged_.reset();
  return done_ ? Status::OK() : stop_reason_;
}

bool ProcessSetRegistry::HasStaged() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return staged_ != nullptr && !taken_;
}

ProcessSetRegistry::Change ProcessSetRegistry::TakeStaged() {
  std::lock_guard<std::mutex> lock(mutex_);
  taken_ = true;
  Change change = std::move(*staged_);
  if (change.add) {
    sets_[change.id] = change.ranks;
    next_id_ = change.id + 1;
  } else {
    sets_.erase(change.id);
  }
  return change;
}

void ProcessSetRegistry::MarkApplied() {
  std::lock_guard<std::mutex> lock(mutex_);
  done_ = true;
  applied_.notify_all();
}

void ProcessSetRegistry::Stop(const Status& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  stop_reason_ = reason.ok() ? Status::Aborted("tfring stopped") : reason;
  applied_.notify_all();
}

}  // namespace tfring
