#include "cc/timeline/timeline.h"

#include <cerrno>
#include <cstring>
#include <sstream>
#include <utility>

#include "cc/logging.h"
#include "cc/output_file.h"

namespace tfring {
namespace {

constexpr int kTimelineFormatVersion = 1;
constexpr int kCycleRow = 0;

const char* PhaseName(OpPhase phase) {
  switch (phase) {
    case OpPhase::kQueue: return "queue";
    case OpPhase::kCopyIn: return "copy_in";
    case OpPhase::kCommunicate: return "communicate";
    case OpPhase::kCopyOut: return "copy_out";
    case OpPhase::kCallback: return "callback";
    case OpPhase::kCount: break;
  }
  return "?";
}

// A JSON string literal.
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string Number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f", value);
  return text;
}

std::string ShapeJson(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ",";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// A complete ("X") event on `row`.
std::string Span(const std::string& name, const char* category, int row, double ts, double dur,
                 const std::string& args) {
  return "{\"name\":" + Quoted(name) + ",\"cat\":\"" + category + "\",\"ph\":\"X\",\"pid\":" +
         std::to_string(row) + ",\"tid\":0,\"ts\":" + Number(ts) + ",\"dur\":" +
         Number(dur < 0 ? 0 : dur) + (args.empty() ? "" : ",\"args\":{" + args + "}") + "}";
}

std::string Instant(const char* name, int row, double ts, const std::string& args) {
  return std::string("{\"name\":\"") + name + "\",\"cat\":\"" + name +
         "\",\"ph\":\"i\",\"s\":\"t\",\"pid\":" + std::to_string(row) + ",\"tid\":0,\"ts\":" +
         Number(ts) + ",\"args\":{" + args + "}}";
}

std::string RowMetadata(int row, const std::string& name) {
  return "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(row) +
         ",\"args\":{\"name\":" + Quoted(name) + "}},\n{\"name\":\"process_sort_index\","
         "\"ph\":\"M\",\"pid\":" + std::to_string(row) + ",\"args\":{\"sort_index\":" +
         std::to_string(row) + "}}";
}

}  // namespace

Timeline::~Timeline() { Stop(); }

Status Timeline::Start(const std::string& path, bool mark_cycles, int size,
                       const std::string& chosen_by) {
  std::lock_guard<std::mutex> lifecycle(lifecycle_mutex_);
  StopWriterLocked();  // restarting: finish the current file first
  std::FILE* file = nullptr;
  TFRING_RETURN_IF_ERROR(OpenOutputFile(path, "tfring timeline (" + chosen_by + ")", &file));
  file_ = file;
  first_event_ = true;
  rows_.clear();
  start_ = TimelineClock::now();
  size_ = size;
  dropped_ = 0;
  std::fputs("{\"traceEvents\":[\n", file_);
  Emit(RowMetadata(kCycleRow, "cycles"));
  mark_cycles_ = mark_cycles;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.clear();
    stop_writer_ = false;
    writer_running_ = true;
    path_ = path;
    recording_ = true;
  }
  writer_ = std::thread([this] { WriterLoop(); });
  return Status::OK();
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> lifecycle(lifecycle_mutex_);
  StopWriterLocked();
}

void Timeline::StopWriterLocked() {
  if (!writer_.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    recording_ = false;  // no new rounds
    round_ended_.wait_for(lock, std::chrono::seconds(1),
                          [this] { return rounds_in_flight_ == 0; });
    stop_writer_ = true;
  }
  wake_writer_.notify_one();
  writer_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  writer_running_ = false;
  path_.clear();
}

bool Timeline::BeginRound() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording_) return false;
  ++rounds_in_flight_;
  return true;
}

void Timeline::EndRound() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --rounds_in_flight_;
  }
  round_ended_.notify_all();
}

std::string Timeline::path() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return path_;
}

void Timeline::RecordTensor(TensorTrace trace) {
  Item item;
  item.tensor = std::move(trace);
  Push(std::move(item));
}

void Timeline::RecordCycle(int64_t cycle, TimelineClock::time_point start) {
  Item item;
  item.is_cycle = true;
  item.cycle = cycle;
  item.cycle_start = start;
  Push(std::move(item));
}

void Timeline::RecordMark(const std::string& name, const std::string& detail) {
  Item item;
  item.mark = name;
  item.detail = detail;
  item.cycle_start = TimelineClock::now();
  Push(std::move(item));
}

void Timeline::Push(Item item) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!writer_running_ || stop_writer_) return;
    if (queue_.size() >= kMaxQueued) {
      ++dropped_;
      return;
    }
    queue_.push_back(std::move(item));
  }
  wake_writer_.notify_one();
}

void Timeline::WriterLoop() {
  while (true) {
    std::deque<Item> batch;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_writer_.wait(lock, [this] { return stop_writer_ || !queue_.empty(); });
      batch.swap(queue_);
      stopping = stop_writer_;
    }
    for (const Item& item : batch) Write(item);
    if (stopping) break;
    std::fflush(file_);
  }
  std::fprintf(file_,
               "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"tfring_timeline_version\":%d,"
               "\"size\":%d,\"dropped_events\":%lld}}\n",
               kTimelineFormatVersion, size_, static_cast<long long>(dropped_.load()));
  if (std::fclose(file_) != 0) {
    TFRING_LOG(kWarning, "tfring timeline: closing the file failed (" << std::strerror(errno)
                                                                     << "); it may be incomplete");
  }
  file_ = nullptr;
}

double Timeline::Micros(TimelineClock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - start_).count();
}

void Timeline::Emit(const std::string& event) {
  if (!first_event_) std::fputs(",\n", file_);
  first_event_ = false;
  std::fputs(event.c_str(), file_);
}

int Timeline::RowOf(const std::string& name) {
  auto it = rows_.find(name);
  if (it != rows_.end()) return it->second;
  const int row = static_cast<int>(rows_.size()) + 1;  // row 0: cycles
  rows_.emplace(name, row);
  Emit(RowMetadata(row, name));
  return row;
}

void Timeline::Write(const Item& item) {
  if (item.is_cycle) {
    Emit(Instant("cycle", kCycleRow, Micros(item.cycle_start),
                 "\"cycle\":" + std::to_string(item.cycle)));
    return;
  }
  if (!item.mark.empty()) {
    Emit(Instant(item.mark.c_str(), kCycleRow, Micros(item.cycle_start),
                 "\"detail\":" + Quoted(item.detail)));
    return;
  }
  WriteTensor(item.tensor);
}

void Timeline::WriteTensor(const TensorTrace& trace) {
  const Request& request = trace.request;
  const int row = RowOf(request.name);
  const char* op = CollectiveTypeName(request.type);

  // Negotiation: first readiness to agreement, and each rank's mark.
  TimelineClock::time_point first = trace.agreed;
  TimelineClock::time_point last = TimelineClock::time_point::min();
  int last_rank = -1;
  for (const ReadyMark& mark : trace.ready) {
    if (mark.time < first) first = mark.time;
    if (mark.time > last) {
      last = mark.time;
      last_rank = mark.rank;
    }
  }
  Emit(Span("negotiate", "negotiate", row, Micros(first), Micros(trace.agreed) - Micros(first),
            std::string("\"op\":\"") + op + "\",\"last_ready_rank\":" +
                std::to_string(last_rank)));
  for (const ReadyMark& mark : trace.ready) {
    Emit(Instant("ready", row, Micros(mark.time), "\"rank\":" + std::to_string(mark.rank)));
  }

  // The op span ends with its last recorded phase.
  TimelineClock::time_point end = trace.agreed;
  for (const auto& phase_end : trace.phases.end) {
    if (phase_end > end) end = phase_end;
  }
  std::ostringstream args;
  args << "\"dtype\":\"" << DataTypeName(request.dtype) << "\",\"shape\":"
       << ShapeJson(request.shape) << ",\"bytes\":" << trace.bytes << ",\"batch\":" << trace.batch
       << ",\"batch_tensors\":" << trace.batch_tensors << ",\"batch_bytes\":" << trace.batch_bytes
       << ",\"fused\":" << (trace.fused ? "true" : "false") << ",\"cycle\":" << trace.cycle
       << ",\"process_set\":" << request.process_set_id;
  if (!trace.error.empty()) args << ",\"error\":" << Quoted(trace.error);
  Emit(Span(op, "op", row, Micros(trace.agreed), Micros(end) - Micros(trace.agreed),
            args.str()));

  TimelineClock::time_point phase_start = trace.agreed;
  const std::string batch_arg = "\"batch\":" + std::to_string(trace.batch);
  for (int p = 0; p < static_cast<int>(OpPhase::kCount); ++p) {
    const TimelineClock::time_point phase_end = trace.phases.end[p];
    if (phase_end == TimelineClock::time_point()) continue;
    Emit(Span(PhaseName(static_cast<OpPhase>(p)), "phase", row, Micros(phase_start),
              Micros(phase_end) - Micros(phase_start), batch_arg));
    phase_start = phase_end;
  }
}

}  // namespace tfring
