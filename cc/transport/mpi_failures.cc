#include "cc/transport/mpi_failures.h"

#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

namespace tfring {

bool IsProcessFailure(int code) {
#if defined(MPIX_ERR_PROC_FAILED)
  int error_class = code;
  MPI_Error_class(code, &error_class);
  return error_class == MPIX_ERR_PROC_FAILED || error_class == MPIX_ERR_PROC_FAILED_PENDING ||
         error_class == MPIX_ERR_REVOKED;
#else
  (void)code;
  return false;
#endif
}

std::vector<int> FailedJobRanks(MPI_Comm comm, MPI_Group job_group) {
  std::vector<int> job_ranks;
#if defined(MPIX_ERR_PROC_FAILED)
  MPI_Group failed = MPI_GROUP_NULL;
#if defined(OMPI_HAVE_MPIX_COMM_GET_FAILED)
  if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return job_ranks;
#else
  if (MPIX_Comm_failure_ack(comm) != MPI_SUCCESS ||
      MPIX_Comm_failure_get_acked(comm, &failed) != MPI_SUCCESS) {
    return job_ranks;
  }
#endif
  int count = 0;
  MPI_Group_size(failed, &count);
  std::vector<int> ranks(count), translated(count, MPI_UNDEFINED);
  for (int i = 0; i < count; ++i) ranks[i] = i;
  if (count > 0) {
    MPI_Group_translate_ranks(failed, count, ranks.data(), job_group, translated.data());
  }
  MPI_Group_free(&failed);
  for (int rank : translated) {
    if (rank != MPI_UNDEFINED) job_ranks.push_back(rank);
  }
#else
  (void)comm;
  (void)job_group;
#endif
  return job_ranks;
}

void RevokeAfterFailure(MPI_Comm comm) {
#if defined(MPIX_ERR_REVOKED)
  MPIX_Comm_revoke(comm);
#else
  (void)comm;
#endif
}

}  // namespace tfring
