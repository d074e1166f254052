// The core's public entry points: the only functions the TensorFlow op
// library and the pybind11 module call.
//
// Why a narrow C++ API: the core owns one process-wide state (the background
// thread, the queue, the transport). Both native front ends link the same
// libtfring_core.so, so whichever loads first creates the state and the other
// sees it. Nothing here mentions TensorFlow or Python.
#ifndef TFRING_CC_API_H_
#define TFRING_CC_API_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cc/common.h"
#include "cc/config.h"
#include "cc/status.h"

namespace tfring {

// Called exactly once per enqueued tensor, from the background thread, after
// the output is written (or with the error that prevented it).
using DoneCallback = std::function<void(const Status&)>;

// Allgather, alltoall and reducescatter: called from the background thread
// once the output shape is known (it depends on the other ranks' inputs, or
// on this rank's position). Must return writable memory for
// NumElements(shape) elements in *data.
using OutputAllocator =
    std::function<Status(const std::vector<int64_t>& shape, void** data)>;

struct TensorBuffers {
  const void* input = nullptr;
  // Allreduce and broadcast: preallocated, same shape as the input. May equal
  // `input` (in place). The other collectives: leave null and set
  // `allocate_output`.
  void* output = nullptr;
  OutputAllocator allocate_output;
  // Alltoall only: the rows of dimension 0 this rank sends to each rank, in
  // rank order; empty splits dimension 0 evenly. The core checks them (on
  // every rank, so a bad entry on one rank fails the op everywhere).
  std::vector<int64_t> splits;
  // Alltoall only, optional: receives the rows that came from each rank
  // before `done` runs. Owned by the caller; must stay valid until then.
  std::vector<int64_t>* received_splits = nullptr;
};

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
};

// Starts the background thread over a duplicate of the MPI communicator whose
// Fortran handle is `mpi_comm_fortran` (mpi4py's comm.py2f()). MPI must
// already be initialised (tfring.init() imports mpi4py, which does it).
// Calling it again while initialised is a no-op returning OK.
//
// Process sets: `process_sets` lists the sets besides the global one (id 0,
// every rank), each as sorted, distinct ranks of the job; they get ids 1, 2,
// ... in order. Every rank must pass the same list (checked: an
// InvalidArgument naming the ranks that differ). `dynamic_process_sets`
// allows AddProcessSet / RemoveProcessSet later.
TFRING_EXPORT Status InitializeMpi(int64_t mpi_comm_fortran,
                                   const std::vector<std::vector<int>>& process_sets = {},
                                   bool dynamic_process_sets = false);

// Adds a process set while running. Collective over every rank of the job,
// which must all pass the same ranks (sorted, distinct, in [0, size)).
// Returns when every rank can use it, with its id in *id (ids are never
// reused). InvalidArgument when the job was not started with dynamic process
// sets, when a set of exactly these ranks exists, or when the ranks passed
// differ between ranks (the message says which).
TFRING_EXPORT Status AddProcessSet(const std::vector<int>& ranks, int32_t* id);

// Removes a process set. Collective over every rank of the job. Collectives
// of the set still pending fail. InvalidArgument for id 0, an unknown id, or
// a job without dynamic process sets.
TFRING_EXPORT Status RemoveProcessSet(int32_t id);

// The process sets that exist now, by id (0: the global set), each with its
// ranks. Empty while not initialised.
TFRING_EXPORT std::map<int32_t, std::vector<int>> ProcessSets();

// Coordinated shutdown: the flag rides the next negotiation round so every
// rank stops together; pending operations fail with an Aborted status.
// Blocks until the background thread has exited. Safe to call twice.
TFRING_EXPORT Status Shutdown();

TFRING_EXPORT bool IsInitialized();

// Whether the core stopped because a peer died or the transport failed (not
// by a shutdown): pending and later collectives fail, and the job can go on
// only over a new communicator (elastic training shuts down and initializes
// again over the survivors). Stays true after Shutdown until the next
// successful InitializeMpi.
TFRING_EXPORT bool StoppedByFailure();

// Elastic training. After SetElasticMode(true) (also while running), a failure
// that stops the core leaves rank 0's timeline open, ShutdownForReset stops
// the core without closing it, and MarkTimeline adds an instant event (the
// reset) to it; the job then goes on over a new communicator
// (InitializeMpi again) in the same file. Shutdown closes it as before.
TFRING_EXPORT void SetElasticMode(bool elastic);
TFRING_EXPORT Status ShutdownForReset();
// Elastic training, on a rank that leaves the job on its own (its training
// function raised): revokes the job's communicator (ULFM), so every rank's
// core stops as after a peer's failure, pending and later collectives fail,
// and the others reset without this rank. No-op when not initialised or
// where MPI has no fault tolerance.
TFRING_EXPORT void RevokeJob();
TFRING_EXPORT void MarkTimeline(const std::string& name, const std::string& detail);

// Valid only while initialised.
TFRING_EXPORT Topology GetTopology();

// The configuration the running job uses: this process's TFRING_* values
// with the job-wide knobs replaced by rank 0's (see job_config.h). Before
// init, what init would start from.
TFRING_EXPORT Config EffectiveConfig();

// Whether the MPI library provides MPI_THREAD_MULTIPLE.
TFRING_EXPORT bool MpiThreadsSupported();

// How the global set's allreduces move data (data_path.h).
enum class DataPath {
  kMpi,           // MPI alone
  kSharedMemory,  // every rank on one host: a shared segment (shm_transport.h)
  kHierarchical,  // several hosts: inside each host, then across (hierarchical_transport.h)
};

// Whether the running job's ranks move data through shared memory
// (shm_transport.h); false before init.
TFRING_EXPORT bool SharedMemoryEnabled();
// The running job's data path; kMpi before init.
TFRING_EXPORT DataPath CurrentDataPath();

// Tensors submitted by one grouped call (grouped_allreduce). The background
// thread is woken when the last of `size` members with the same `key` has
// arrived, not by each, so the group meets in one negotiation round instead
// of trickling into several. Only a hint about this process's submissions:
// keys need not match across ranks, and members still held when the
// thread wakes for another reason (new work, its cycle) go into that round.
struct SubmissionGroup {
  int64_t key = 0;
  int32_t size = 1;  // 1: not part of a group
};

// Hands one tensor to the background thread. Returns an error immediately
// (and does not call `done`) if the core is not running or the name is
// already in flight; otherwise `done` is called exactly once later.
TFRING_EXPORT Status Enqueue(Request request, TensorBuffers buffers,
                             DoneCallback done, SubmissionGroup group = {});

// Starts rank 0's timeline: a Chrome trace-event file at `path` (see
// docs/timeline.md) of every collective from now on; `mark_cycles` adds a
// mark per background-loop cycle. Any rank may call it (only rank 0
// records; the others report when their tensors were ready). A recording in
// progress is closed first. FailedPrecondition when not initialised;
// InvalidArgument when rank 0 cannot create the file.
TFRING_EXPORT Status StartTimeline(const std::string& path, bool mark_cycles);
// Closes the timeline file (valid JSON from then on). No-op when none records.
TFRING_EXPORT Status StopTimeline();

// Address of the process-wide state, for tests that check the op library and
// the pybind11 module share one core.
TFRING_EXPORT const void* CoreStateAddress();

}  // namespace tfring

#endif  // TFRING_CC_API_H_
