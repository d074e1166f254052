// Cross-rank validation: turns the requests every rank made for one tensor
// name into the single response all ranks will act on.
//
// Why at the coordinator: a mismatch found here (shape, dtype, op, root,
// scale factors) becomes one error response that every rank reports, naming
// which ranks held which value -- instead of a hang or garbage data.
#ifndef TFRING_CC_NEGOTIATION_RESPONSE_BUILDER_H_
#define TFRING_CC_NEGOTIATION_RESPONSE_BUILDER_H_

#include <vector>

#include "cc/common.h"
#include "cc/negotiation/response.h"

namespace tfring {

// `requests` holds the request of every rank that submitted the tensor (all
// with the same name, each carrying its job rank); `joined` lists the job
// ranks that did not because they have joined (tfring.join()): they take
// part in an allreduce with zeros, and any other collective is an error.
Response BuildResponse(const std::vector<Request>& requests, const std::vector<int>& joined = {});

}  // namespace tfring

#endif  // TFRING_CC_NEGOTIATION_RESPONSE_BUILDER_H_
