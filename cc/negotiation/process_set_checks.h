// Checks of process-set definitions, made before any rank acts on them.
//
// Why collective checks: adding a set splits a communicator, which every
// rank must do with the same arguments; a rank that passed a different list
// would make MPI pair the wrong calls. The ranks compare fingerprints first
// and all fail with the same message when they differ.
#ifndef TFRING_CC_NEGOTIATION_PROCESS_SET_CHECKS_H_
#define TFRING_CC_NEGOTIATION_PROCESS_SET_CHECKS_H_

#include <string>
#include <vector>

#include "cc/status.h"
#include "cc/transport.h"

namespace tfring {

// A set's ranks: non-empty, sorted, distinct, each in [0, size).
Status CheckProcessSetRanks(const std::vector<int>& ranks, int size, const std::string& what);

// Collective over every rank of `transport`: InvalidArgument on every rank
// when the ranks passed different `sets` to `what`, naming which ranks
// agree with which. The returned status is also the transport's.
Status AgreeOnProcessSets(Transport* transport, const std::vector<std::vector<int>>& sets,
                          const std::string& what);

// "[0, 1]"
std::string RankListToString(const std::vector<int>& ranks);
// "[[0, 1], [2, 3]]"
std::string SetsToString(const std::vector<std::vector<int>>& sets);

}  // namespace tfring

#endif  // TFRING_CC_NEGOTIATION_PROCESS_SET_CHECKS_H_
