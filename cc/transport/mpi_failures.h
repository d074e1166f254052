// Naming the ranks behind an MPI failure.
//
// Without fault tolerance, Open MPI ends the whole job when a peer's
// connection drops, and the report often names whichever survivor noticed
// first. In fault-tolerant mode (ULFM: OMPI_MCA_mpi_ft_enable=1, which
// tfringrun turns on for jobs on several hosts) the failure comes back as an
// error on the communicator instead, and MPI can say which processes died.
// These helpers turn that into job ranks for the error message, and revoke
// the communicator so the ranks still waiting on it fail too instead of
// waiting for a peer that is gone. Where the MPI library has no ULFM
// extension they find nothing, and the message stays without the ranks.
#ifndef TFRING_CC_TRANSPORT_MPI_FAILURES_H_
#define TFRING_CC_TRANSPORT_MPI_FAILURES_H_

#include <mpi.h>

#include <vector>

namespace tfring {

// Whether `code` is a process failure (or a revocation after one).
bool IsProcessFailure(int code);

// The ranks of `comm` MPI knows to have failed, as ranks of `job_group`
// (ranks outside it are left out). Empty when none are known.
std::vector<int> FailedJobRanks(MPI_Comm comm, MPI_Group job_group);

// Makes every pending and future operation on `comm` fail on every rank.
void RevokeAfterFailure(MPI_Comm comm);

}  // namespace tfring

#endif  // TFRING_CC_TRANSPORT_MPI_FAILURES_H_
