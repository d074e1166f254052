// A Response is the coordinator's verdict on one named tensor: either the
// parameters every rank agreed on (so the collective can run), or the error
// every rank must report for it.
#ifndef TFRING_CC_NEGOTIATION_RESPONSE_H_
#define TFRING_CC_NEGOTIATION_RESPONSE_H_

#include <string>
#include <vector>

#include "cc/common.h"

namespace tfring {

struct Response {
  // The agreed request. For allgather and alltoall the first dimension is
  // set to -1: it may differ between ranks and is exchanged when the
  // collective runs.
  Request request;
  bool is_error = false;
  // How many ranks submitted the tensor: fewer than the set's size when the
  // others had joined (they take part with zeros; Average divides by this).
  // 0 means every rank.
  int32_t contributors = 0;
  // Shown verbatim to the user on every rank when is_error.
  std::string error_message;

  const std::string& name() const { return request.name; }
};

using ResponseList = std::vector<Response>;

}  // namespace tfring

#endif  // TFRING_CC_NEGOTIATION_RESPONSE_H_
