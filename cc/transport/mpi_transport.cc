#include "cc/transport/mpi_transport.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cc/logging.h"
#include "cc/transport/mpi_failures.h"
#include "cc/reduce_kernels.h"

namespace tfring {
namespace {

// MPI counts are ints: larger buffers go in chunks of at most this many elements.
constexpr int64_t kMaxCount = INT_MAX / 8;

std::string MpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, length);
}

Status MpiError(int code, const std::string& what) {
  return Status::Aborted(what + " failed: " + MpiErrorText(code) +
                         " (another rank may have exited or lost its connection)");
}

// For the set-up calls, before a transport exists.
#define TFRING_MPI_SETUP_CALL(call, what)                              \
  do {                                                                 \
    int _tfring_rc = (call);                                           \
    if (_tfring_rc != MPI_SUCCESS) return MpiError(_tfring_rc, what);  \
  } while (0)

// Inside MpiTransport: the failure names the ranks that died where MPI
// knows them.
#define TFRING_MPI_CALL(call, what)                                    \
  do {                                                                 \
    int _tfring_rc = (call);                                           \
    if (_tfring_rc != MPI_SUCCESS) return Failure(_tfring_rc, what);   \
  } while (0)

// float16 and bfloat16 have no MPI type: they travel as 16-bit integers and
// reduce through user-defined MPI ops that call ReduceInto.
template <DataType kType, ReduceOp kOp>
void SixteenBitReduction(void* in, void* inout, int* length, MPI_Datatype*) {
  ReduceInto(kType, kOp, in, inout, *length);
}

template <DataType kType>
MPI_Op SixteenBitOp(ReduceOp op) {
  static MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  static const bool created = [] {
    MPI_Op_create(&SixteenBitReduction<kType, ReduceOp::kSum>, 1, &ops[0]);
    MPI_Op_create(&SixteenBitReduction<kType, ReduceOp::kMin>, 1, &ops[1]);
    MPI_Op_create(&SixteenBitReduction<kType, ReduceOp::kMax>, 1, &ops[2]);
    MPI_Op_create(&SixteenBitReduction<kType, ReduceOp::kProduct>, 1, &ops[3]);
    return true;
  }();
  (void)created;
  switch (op) {
    case ReduceOp::kMin: return ops[1];
    case ReduceOp::kMax: return ops[2];
    case ReduceOp::kProduct: return ops[3];
    default: return ops[0];
  }
}

MPI_Datatype ToMpiType(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUInt16: return MPI_UINT16_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16: return MPI_UINT16_T;
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kBool: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op ToMpiOp(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kFloat16) return SixteenBitOp<DataType::kFloat16>(op);
  if (dtype == DataType::kBFloat16) return SixteenBitOp<DataType::kBFloat16>(op);
  switch (op) {
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    default: return MPI_SUM;
  }
}

// MPI's int counts and displacements for consecutive blocks of the given
// sizes. Fails (on every rank alike: the sizes are the same everywhere) when
// the total does not fit an int.
Status IntCountsAndOffsets(const std::vector<int64_t>& sizes, const char* what,
                           std::vector<int>* counts, std::vector<int>* offsets) {
  int64_t offset = 0;
  for (int64_t size : sizes) {
    if (offset + size > INT_MAX) {
      return Status::InvalidArgument(
          std::string("tfring ") + what + " exceeds 2 GiB, which the MPI transport does not "
          "support yet; split the tensor into smaller ones");
    }
    counts->push_back(static_cast<int>(size));
    offsets->push_back(static_cast<int>(offset));
    offset += size;
  }
  return Status::OK();
}

// Local: the ranks sharing this node's memory. Cross: one rank per node,
// those with the same local rank. Both ordered by rank in `comm`.
Status SplitByHost(MPI_Comm comm, MPI_Comm* local, MPI_Comm* cross) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  TFRING_MPI_SETUP_CALL(
      MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, local),
      "MPI_Comm_split_type");
  int local_rank = 0;
  MPI_Comm_rank(*local, &local_rank);
  TFRING_MPI_SETUP_CALL(MPI_Comm_split(comm, local_rank, rank, cross), "MPI_Comm_split");
  return Status::OK();
}

}  // namespace

Status MpiTransport::Create(MPI_Comm comm, std::unique_ptr<MpiTransport>* transport,
                            MPI_Comm job) {
  std::unique_ptr<MpiTransport> created(new MpiTransport());
  TFRING_MPI_SETUP_CALL(MPI_Comm_dup(comm, &created->comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(created->comm_, MPI_ERRORS_RETURN);
  MPI_Comm_group(job == MPI_COMM_NULL ? comm : job, &created->job_group_);
  Topology& topology = created->topology_;
  MPI_Comm_rank(created->comm_, &topology.rank);
  MPI_Comm_size(created->comm_, &topology.size);

  MPI_Comm local_comm, cross_comm;
  TFRING_RETURN_IF_ERROR(SplitByHost(created->comm_, &local_comm, &cross_comm));
  MPI_Comm_rank(local_comm, &topology.local_rank);
  MPI_Comm_size(local_comm, &topology.local_size);
  MPI_Comm_rank(cross_comm, &topology.cross_rank);
  MPI_Comm_size(cross_comm, &topology.cross_size);
  MPI_Comm_free(&local_comm);
  MPI_Comm_free(&cross_comm);
  *transport = std::move(created);
  return Status::OK();
}

Status MpiTransport::CreateHostSplit(MPI_Comm comm, std::unique_ptr<MpiTransport>* local,
                                     std::unique_ptr<MpiTransport>* cross) {
  MPI_Comm local_comm, cross_comm;
  TFRING_RETURN_IF_ERROR(SplitByHost(comm, &local_comm, &cross_comm));
  Status created = Create(local_comm, local, comm);  // each its own duplicate
  if (created.ok()) created = Create(cross_comm, cross, comm);
  MPI_Comm_free(&local_comm);
  MPI_Comm_free(&cross_comm);
  return created;
}

Status MpiTransport::CreateSubset(MPI_Comm comm, const std::vector<int>& ranks,
                                  std::unique_ptr<MpiTransport>* transport) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const bool member = std::binary_search(ranks.begin(), ranks.end(), rank);
  MPI_Comm subset = MPI_COMM_NULL;
  TFRING_MPI_SETUP_CALL(MPI_Comm_split(comm, member ? 0 : MPI_UNDEFINED, rank, &subset),
                        "MPI_Comm_split (process set)");
  transport->reset();
  if (subset == MPI_COMM_NULL) return Status::OK();
  Status created = Create(subset, transport, comm);  // its own duplicate
  MPI_Comm_free(&subset);
  return created;
}

MpiTransport::~MpiTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (job_group_ != MPI_GROUP_NULL) MPI_Group_free(&job_group_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Status MpiTransport::Failure(int code, const char* what) const {
  std::string cause = "another rank may have exited or lost its connection";
  if (IsProcessFailure(code)) {
    const std::vector<int> failed = FailedJobRanks(comm_, job_group_);
    if (!failed.empty()) {
      const bool one = failed.size() == 1;
      cause = RanksToString(failed) + (one ? " has" : " have") + " failed: " +
              (one ? "its process" : "their processes") + " ended or " +
              (one ? "its host" : "their hosts") + " became unreachable; " +
              (one ? "its" : "their") + " output and host logs say why";
    }
    // The ranks still waiting on this communicator for the failed one would
    // otherwise wait until mpirun ends the job.
    RevokeAfterFailure(comm_);
  }
  return Status::Aborted(std::string(what) + " failed: " + MpiErrorText(code) + " (" + cause +
                         ")");
}

Status MpiTransport::Wait(MPI_Request* request, const char* what) {
  // A peer already in the round answers within microseconds: poll without
  // pause for a short while. Past that the peer is busy (computing, or not
  // scheduled), perhaps for milliseconds: nap between polls, each nap a
  // fixed fraction of the time waited so far. Noticing the answer late then
  // adds at most that fraction to the wait, and a rank waiting long for a
  // busy peer wakes ever more rarely, leaving the core to TensorFlow. (Naps
  // last as long as asked: see thread_tuning.h.)
  using Clock = std::chrono::steady_clock;
  constexpr auto kSpin = std::chrono::microseconds(50);
  constexpr int kNapFraction = 8;
  constexpr auto kMinNap = std::chrono::microseconds(5);
  // Also bounds how long a completed round can go unnoticed.
  constexpr auto kMaxNap = std::chrono::microseconds(200);
  const Clock::time_point start = Clock::now();
  while (true) {
    int done = 0;
    TFRING_MPI_CALL(MPI_Test(request, &done, MPI_STATUS_IGNORE), what);
    if (done) return Status::OK();
    const Clock::duration waited = Clock::now() - start;
    if (waited < kSpin) continue;
    std::this_thread::sleep_for(std::clamp<Clock::duration>(waited / kNapFraction, kMinNap, kMaxNap));
  }
}

Status MpiTransport::BitwiseAndAllreduce(std::vector<uint64_t>* words) {
  MPI_Request request;
  TFRING_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, words->data(), static_cast<int>(words->size()),
                                 MPI_UINT64_T, MPI_BAND, comm_, &request),
                  "MPI_Iallreduce (negotiation bits)");
  return Wait(&request, "MPI_Iallreduce (negotiation bits)");
}

Status MpiTransport::GatherToRoot(const std::string& local, std::vector<std::string>* gathered) {
  const int size = topology_.size;
  int local_length = static_cast<int>(local.size());
  std::vector<int> lengths(topology_.rank == 0 ? size : 0);
  MPI_Request request;
  TFRING_MPI_CALL(MPI_Igather(&local_length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm_,
                              &request),
                  "MPI_Igather (request sizes)");
  TFRING_RETURN_IF_ERROR(Wait(&request, "MPI_Igather (request sizes)"));

  std::vector<int> offsets(lengths.size(), 0);
  std::string all;
  if (topology_.rank == 0) {
    int64_t total = 0;
    for (int r = 0; r < size; ++r) {
      offsets[r] = static_cast<int>(total);
      total += lengths[r];
    }
    all.resize(total);
  }
  TFRING_MPI_CALL(MPI_Igatherv(local.data(), local_length, MPI_CHAR, &all[0], lengths.data(),
                               offsets.data(), MPI_CHAR, 0, comm_, &request),
                  "MPI_Igatherv (requests)");
  TFRING_RETURN_IF_ERROR(Wait(&request, "MPI_Igatherv (requests)"));
  if (topology_.rank == 0) {
    gathered->resize(size);
    for (int r = 0; r < size; ++r) (*gathered)[r] = all.substr(offsets[r], lengths[r]);
  }
  return Status::OK();
}

Status MpiTransport::BroadcastFromRoot(std::string* bytes) {
  int64_t length = static_cast<int64_t>(bytes->size());
  MPI_Request request;
  TFRING_MPI_CALL(MPI_Ibcast(&length, 1, MPI_INT64_T, 0, comm_, &request),
                  "MPI_Ibcast (response size)");
  TFRING_RETURN_IF_ERROR(Wait(&request, "MPI_Ibcast (response size)"));
  bytes->resize(length);
  TFRING_MPI_CALL(MPI_Ibcast(&(*bytes)[0], static_cast<int>(length), MPI_CHAR, 0, comm_, &request),
                  "MPI_Ibcast (responses)");
  return Wait(&request, "MPI_Ibcast (responses)");
}

Status MpiTransport::Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                               ReduceOp op) {
  const MPI_Datatype mpi_type = ToMpiType(dtype);
  const MPI_Op mpi_op = ToMpiOp(dtype, op);
  const int64_t element_size = DataTypeSize(dtype);
  for (int64_t done = 0; done < count; done += kMaxCount) {
    const int chunk = static_cast<int>(std::min(kMaxCount, count - done));
    char* out = static_cast<char*>(output) + done * element_size;
    const void* in =
        input == output ? MPI_IN_PLACE : static_cast<const char*>(input) + done * element_size;
    TFRING_MPI_CALL(MPI_Allreduce(in, out, chunk, mpi_type, mpi_op, comm_), "MPI_Allreduce");
  }
  return Status::OK();
}

Status MpiTransport::AllreduceWire(const void* input, void* output, int64_t count,
                                   DataType dtype, ReduceOp op, WireCompression compression) {
  const bool spans_hosts = topology_.local_size < topology_.size;
  if (compression == WireCompression::kNone || dtype != DataType::kFloat32 ||
      op != ReduceOp::kSum || !spans_hosts) {
    return Allreduce(input, output, count, dtype, op);
  }
  if (input != output) std::memcpy(output, input, count * sizeof(float));
  return cross_sum_.Run(this, static_cast<float*>(output), count, compression);
}

Status MpiTransport::AllgatherInt64s(const std::vector<int64_t>& local,
                                     std::vector<int64_t>* all) {
  all->assign(local.size() * topology_.size, 0);
  TFRING_MPI_CALL(MPI_Allgather(local.data(), static_cast<int>(local.size()), MPI_INT64_T,
                                all->data(), static_cast<int>(local.size()), MPI_INT64_T, comm_),
                  "MPI_Allgather (run-time shapes)");
  return Status::OK();
}

Status MpiTransport::Allgatherv(const void* input, int64_t input_bytes, void* output,
                                const std::vector<int64_t>& bytes_per_rank) {
  std::vector<int> counts, offsets;
  TFRING_RETURN_IF_ERROR(IntCountsAndOffsets(bytes_per_rank, "allgather output", &counts,
                                             &offsets));
  const void* send = input == nullptr ? MPI_IN_PLACE : input;
  TFRING_MPI_CALL(MPI_Allgatherv(send, static_cast<int>(input_bytes), MPI_BYTE, output,
                                 counts.data(), offsets.data(), MPI_BYTE, comm_),
                  "MPI_Allgatherv");
  return Status::OK();
}

Status MpiTransport::Alltoallv(const void* input, const std::vector<int64_t>& send_bytes,
                               void* output, const std::vector<int64_t>& recv_bytes) {
  std::vector<int> send_counts, send_offsets, recv_counts, recv_offsets;
  TFRING_RETURN_IF_ERROR(IntCountsAndOffsets(send_bytes, "alltoall input", &send_counts,
                                             &send_offsets));
  TFRING_RETURN_IF_ERROR(IntCountsAndOffsets(recv_bytes, "alltoall output", &recv_counts,
                                             &recv_offsets));
  TFRING_MPI_CALL(MPI_Alltoallv(input, send_counts.data(), send_offsets.data(), MPI_BYTE, output,
                                recv_counts.data(), recv_offsets.data(), MPI_BYTE, comm_),
                  "MPI_Alltoallv");
  return Status::OK();
}

Status MpiTransport::ReduceScatter(const void* input, void* output,
                                   const std::vector<int64_t>& counts, DataType dtype,
                                   ReduceOp op) {
  std::vector<int> int_counts, offsets;
  TFRING_RETURN_IF_ERROR(IntCountsAndOffsets(counts, "reducescatter input (in elements)",
                                             &int_counts, &offsets));
  const void* send = input == output ? MPI_IN_PLACE : input;
  TFRING_MPI_CALL(MPI_Reduce_scatter(send, output, int_counts.data(), ToMpiType(dtype),
                                     ToMpiOp(dtype, op), comm_),
                  "MPI_Reduce_scatter");
  return Status::OK();
}

Status MpiTransport::Broadcast(void* buffer, int64_t bytes, int root_rank) {
  for (int64_t done = 0; done < bytes; done += INT_MAX / 2) {
    const int chunk = static_cast<int>(std::min<int64_t>(INT_MAX / 2, bytes - done));
    TFRING_MPI_CALL(MPI_Bcast(static_cast<char*>(buffer) + done, chunk, MPI_BYTE, root_rank, comm_),
                    "MPI_Bcast");
  }
  return Status::OK();
}

}  // namespace tfring
