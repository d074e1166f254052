// ShmSegment: one POSIX shared-memory segment, mapped by the ranks of one host.
//
// Why a class of its own: the shared-memory allreduce (shm_collectives.h) only
// needs "a block of bytes every local rank sees"; creating, sizing, mapping
// and cleaning that block up is where the operating system bites (a full
// /dev/shm, a name left by a crashed job), so those errors are turned into
// clear Status values here, at init, instead of a SIGBUS in the middle of a
// training step.
//
// Lifecycle: one local rank Create()s the segment under a fresh name (O_EXCL,
// so two jobs never share one by accident), the others Open() it under the
// same name, and once every rank has mapped it one of them calls Unlink():
// from then on the memory lives exactly as long as the mappings, so a crash
// leaks nothing in /dev/shm. The destructor unmaps.
#ifndef TFRING_CC_SHM_SHM_SEGMENT_H_
#define TFRING_CC_SHM_SHM_SEGMENT_H_

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "cc/status.h"

namespace tfring {

class ShmSegment {
 public:
  // Creates a new segment of `bytes` bytes (zero-filled) named `name` ("/x",
  // one leading slash, no other), reserving its memory up front so a
  // too-small /dev/shm fails here. Fails if the name already exists.
  static Status Create(const std::string& name, size_t bytes,
                       std::unique_ptr<ShmSegment>* segment);
  // Maps an existing segment created by another rank; it must hold at least
  // `bytes` bytes.
  static Status Open(const std::string& name, size_t bytes,
                     std::unique_ptr<ShmSegment>* segment);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Removes the name; the mappings stay valid. Call once every rank has
  // mapped the segment. Calling it again, or from several ranks, is harmless.
  Status Unlink();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  ShmSegment(std::string name, void* data, size_t size, bool created)
      : name_(std::move(name)), data_(data), size_(size), created_(created) {}

  std::string name_;
  void* data_;
  size_t size_;
  // The creator removes a name nobody unlinked when it goes away (an init
  // that failed half way), so even that path leaves nothing behind.
  bool created_;
  bool unlinked_ = false;
};

}  // namespace tfring

#endif  // TFRING_CC_SHM_SHM_SEGMENT_H_
