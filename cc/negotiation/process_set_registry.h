// ProcessSetRegistry: the process sets of the job, and the hand-over of a
// set being added or removed from the caller's thread to the background
// thread.
//
// Why a hand-over: the background thread runs one negotiation round per set
// this rank belongs to, every cycle, in id order. If one rank started the
// rounds of a new set a cycle before another, the first would wait in the
// new set's round while the second waits in the next global round: a
// deadlock. So the caller only stages the change; the background thread
// applies it after the global round in which every rank reported it staged,
// which is the same cycle on every rank.
#ifndef TFRING_CC_NEGOTIATION_PROCESS_SET_REGISTRY_H_
#define TFRING_CC_NEGOTIATION_PROCESS_SET_REGISTRY_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cc/status.h"
#include "cc/transport.h"

namespace tfring {

class ProcessSetRegistry {
 public:
  // A set being added (with this rank's transport over the set's
  // communicator, or null when this rank is not a member) or removed.
  struct Change {
    bool add = true;
    int32_t id = 0;
    std::vector<int> ranks;
    std::unique_ptr<Transport> transport;
  };

  ProcessSetRegistry(std::map<int32_t, std::vector<int>> sets, bool dynamic);

  bool dynamic() const { return dynamic_; }
  // Every set now usable, by id (0: the global set).
  std::map<int32_t, std::vector<int>> Sets() const;
  // False when no set `id` exists (never added, or removed).
  bool Find(int32_t id, std::vector<int>* ranks) const;
  // The id the next added set gets (ids are never reused).
  int32_t next_id() const;

  // Caller's thread: stages `change` and blocks until the background thread
  // has applied it (or stopped, whose reason is returned).
  Status StageAndWait(Change change);
  // Background thread: whether a change is staged on this rank.
  bool HasStaged() const;
  // Background thread: takes the staged change to apply it (every rank has
  // staged it); the registry's table changes now.
  Change TakeStaged();
  // Background thread: the change taken last is applied; wakes the caller.
  void MarkApplied();
  // Background thread, when it stops: a waiting caller returns `reason`,
  // and later callers at once.
  void Stop(const Status& reason);

 private:
  const bool dynamic_;
  mutable std::mutex mutex_;
  std::condition_variable applied_;
  std::map<int32_t, std::vector<int>> sets_;
  int32_t next_id_ = 1;
  std::unique_ptr<Change> staged_;
  bool taken_ = false;
  bool done_ = false;
  Status stop_reason_;
};

}  // namespace tfring

#endif  // TFRING_CC_NEGOTIATION_PROCESS_SET_REGISTRY_H_
