// Byte encoding of requests and responses for the negotiation messages.
//
// Why hand-rolled: the messages are small, flat and only ever read by the
// same build of tfring on the other ranks, so a length-prefixed little-endian
// encoding is all that is needed (no schema compiler, no dependency).
#ifndef TFRING_CC_NEGOTIATION_WIRE_FORMAT_H_
#define TFRING_CC_NEGOTIATION_WIRE_FORMAT_H_

#include <string>
#include <vector>

#include "cc/common.h"
#include "cc/negotiation/response.h"
#include "cc/status.h"

namespace tfring {

std::string EncodeRequests(const std::vector<Request>& requests);
Status DecodeRequests(const std::string& bytes, std::vector<Request>* requests);

// `shutdown_reason` is empty unless the coordinator decided to stop the job.
std::string EncodeResponses(const ResponseList& responses, const std::string& shutdown_reason);
Status DecodeResponses(const std::string& bytes, ResponseList* responses,
                       std::string* shutdown_reason);

}  // namespace tfring

#endif  // TFRING_CC_NEGOTIATION_WIRE_FORMAT_H_
