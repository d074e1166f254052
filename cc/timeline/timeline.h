// Timeline: where each collective's time goes, written by rank 0 as a
// Chrome trace-event file (the format is docs/timeline.md).
//
// Why a separate writer thread: the background loop must not wait on a disk.
// The loop only takes timestamps (a clock read each) and hands one record per
// tensor to a bounded queue; this class's own thread turns records into JSON
// and writes them. When the queue is full the record is dropped and counted
// (the count is in the file), so a slow disk never slows the collectives.
//
// The file is valid JSON once Stop has run: on tfring.stop_timeline(), on
// shutdown (which every end of a job goes through: tfring.shutdown(), the
// interpreter's exit, MPI_Finalize, a failure that stops the loop).
#ifndef TFRING_CC_TIMELINE_TIMELINE_H_
#define TFRING_CC_TIMELINE_TIMELINE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cc/common.h"
#include "cc/status.h"

namespace tfring {

using TimelineClock = std::chrono::steady_clock;

// The spans of an op after its agreement, in the order they happen. A phase
// that did not happen keeps a default (zero) end time.
enum class OpPhase : int { kQueue = 0, kCopyIn, kCommunicate, kCopyOut, kCallback, kCount };

// The phase ends of one batch; filled by the executor while it runs the batch.
struct BatchPhases {
  TimelineClock::time_point end[static_cast<int>(OpPhase::kCount)] = {};
  void Mark(OpPhase phase) { end[static_cast<int>(phase)] = TimelineClock::now(); }
};

// When one rank submitted a tensor.
struct ReadyMark {
  int rank = 0;
  TimelineClock::time_point time;
};

// One occurrence of one tensor: its negotiation and its op.
struct TensorTrace {
  Request request;          // rank 0's
  int64_t bytes = 0;        // rank 0's input bytes
  std::vector<ReadyMark> ready;
  TimelineClock::time_point agreed;  // end of the round that agreed it
  int64_t cycle = 0;
  int64_t batch = 0;
  int batch_tensors = 1;
  int64_t batch_bytes = 0;
  bool fused = false;
  BatchPhases phases;  // kQueue's end is the batch's start
  std::string error;   // empty on success
};

class Timeline {
 public:
  Timeline() = default;
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Opens `path` (truncating it; see output_file.h: no symbolic links, new
  // files 0600) and starts recording. `size`: ranks in the job, for the
  // file's metadata; `chosen_by`: the setting or call that named the path,
  // for errors. Fails, leaving nothing open, when the file cannot be
  // created; stops any recording in progress first.
  Status Start(const std::string& path, bool mark_cycles, int size,
               const std::string& chosen_by);
  // Writes what is queued, closes the file as valid JSON, stops the writer
  // thread. No-op when not recording. Any thread.
  void Stop();

  bool recording() const { return recording_.load(std::memory_order_relaxed); }

  // Background thread: a round that will send records begins / ends. False
  // (and no round) when not recording. Stop waits for a round in progress,
  // whose callbacks may already have returned control to the caller of
  // stop_timeline() before its records were handed over (at most a second,
  // in case Stop is called from within such a callback).
  bool BeginRound();
  void EndRound();
  bool mark_cycles() const { return mark_cycles_.load(std::memory_order_relaxed); }
  // The path being written, or empty.
  std::string path() const;

  // Background thread: hand over records (dropped when not recording, or
  // when the queue is full).
  void RecordTensor(TensorTrace trace);
  void RecordCycle(int64_t cycle, TimelineClock::time_point start);
  // Any thread: an instant event `name` on the cycles row, now, with
  // `detail` as its argument (elastic training marks its resets).
  void RecordMark(const std::string& name, const std::string& detail);

 private:
  struct Item {
    bool is_cycle = false;
    int64_t cycle = 0;
    TimelineClock::time_point cycle_start;
    TensorTrace tensor;
    std::string mark;  // non-empty: a RecordMark, at cycle_start
    std::string detail;
  };
  void Push(Item item);
  // Stops recording, waits for rounds in progress, stops the writer thread
  // (which closes the file). Holding lifecycle_mutex_.
  void StopWriterLocked();
  void WriterLoop();
  void Write(const Item& item);
  void WriteTensor(const TensorTrace& trace);
  // Emits one event line (commas between lines).
  void Emit(const std::string& event);
  // Microseconds since recording started.
  double Micros(TimelineClock::time_point t) const;
  // The row of `name`, created (and named in the file) on first use.
  int RowOf(const std::string& name);

  static constexpr size_t kMaxQueued = 1 << 16;

  mutable std::mutex mutex_;  // guards the queue, file_ handover and path_
  std::condition_variable wake_writer_;
  std::deque<Item> queue_;
  std::condition_variable round_ended_;
  int rounds_in_flight_ = 0;
  bool writer_running_ = false;
  bool stop_writer_ = false;
  std::thread writer_;
  std::atomic<bool> recording_{false};
  std::atomic<bool> mark_cycles_{false};
  std::atomic<int64_t> dropped_{0};
  std::string path_;
  int size_ = 1;
  // Writer thread only:
  std::FILE* file_ = nullptr;
  bool first_event_ = true;
  TimelineClock::time_point start_;
  std::unordered_map<std::string, int> rows_;
  std::mutex lifecycle_mutex_;  // serialises Start and Stop
};

}  // namespace tfring

#endif  // TFRING_CC_TIMELINE_TIMELINE_H_
