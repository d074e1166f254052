// ChooseDataPath: which transport moves the global set's data.
//
// Why one place: the choice depends on where the ranks run (one host,
// several hosts with the same number of ranks on each, or neither) and on
// the knobs, and every rank must make it the same way, because the
// transports it builds are collective. Ranks on one host share memory
// (shm_transport.h); ranks spread evenly over hosts reduce inside each host
// first (hierarchical_transport.h); anything else talks MPI directly.
#ifndef TFRING_CC_TRANSPORT_DATA_PATH_H_
#define TFRING_CC_TRANSPORT_DATA_PATH_H_

#include <memory>

#include "cc/api.h"
#include "cc/config.h"
#include "cc/transport/mpi_transport.h"
#include "cc/transport.h"

namespace tfring {

// Collective over `flat`'s ranks (every rank of the job), at init before the
// background thread starts. Sets *path and *transport: the transport to use
// instead of `flat`, or null for `flat` itself (kMpi).
Status ChooseDataPath(MpiTransport* flat, const Config& config, DataPath* path,
                      std::unique_ptr<Transport>* transport);

}  // namespace tfring

#endif  // TFRING_CC_TRANSPORT_DATA_PATH_H_
