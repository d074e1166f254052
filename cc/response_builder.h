// Cross-rank validation: turns the requests every rank made for one tensor
// name into the single response all ranks will act on.
//
// Why at the coordinator: a mismatch found here (shape, dtype, op, root,
// scale factors) becomes one error response that every rank reports, naming
// which ranks held which value -- instead of a hang or garbage data.
#ifndef TFRING_CC_RESPONSE_BUILDER_H_
#define TFRING_CC_RESPONSE_BUILDER_H_

#include <vector>

#include "cc/common.h"
#include "cc/response.h"

namespace tfring {

// `requests` holds exactly one request per rank, indexed by rank, all with
// the same name.
Response BuildResponse(const std::vector<Request>& requests);

}  // namespace tfring

#endif  // TFRING_CC_RESPONSE_BUILDER_H_
