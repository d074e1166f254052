#include "cc/negotiation/response_builder.h"

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>
#include <string>

namespace tfring {
namespace {

std::string FormatNumber(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// "rank 0 and rank 2 submitted [2, 3]; rank 1 submitted [3, 2]": ranks are
// grouped by the value they hold, groups in order of their lowest rank.
std::string DescribeValuesByRank(const std::vector<Request>& requests,
                                 const std::function<std::string(const Request&)>& value_of) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> ranks_by_value;
  for (const Request& request : requests) {
    const std::string value = value_of(request);
    if (!ranks_by_value.count(value)) order.push_back(value);
    ranks_by_value[value].push_back(request.rank);
  }
  std::ostringstream out;
  for (size_t i = 0; i < order.size(); ++i) {
    const std::vector<int>& ranks = ranks_by_value[order[i]];
    if (i > 0) out << "; ";
    out << RanksToString(ranks) << " submitted " << order[i];
  }
  return out.str();
}

using ValueOf = std::function<std::string(const Request&)>;

Response Mismatch(const std::vector<Request>& requests, const char* field,
                  const ValueOf& value_of, const std::string& fix) {
  Response response;
  response.request = requests[0];
  response.is_error = true;
  std::ostringstream message;
  message << "tfring " << CollectiveTypeName(requests[0].type) << " of tensor '"
          << requests[0].name << "': ranks disagree on the " << field << ": "
          << DescribeValuesByRank(requests, value_of) << ". Every rank must submit the tensor '"
          << requests[0].name << "' with the same " << field << ". " << fix;
  response.error_message = message.str();
  return response;
}

const char kSameProgramFix[] =
    "Check that every rank runs the same code path with the same arguments for this "
    "collective.";

// Returns true and fills *mismatch when ranks disagree on value_of. The
// message shows describe_of (default: value_of) for each rank.
bool Disagree(const std::vector<Request>& requests, const char* field, const ValueOf& value_of,
              const std::string& fix, Response* mismatch, const ValueOf& describe_of = nullptr) {
  const std::string first = value_of(requests[0]);
  for (const Request& request : requests) {
    if (value_of(request) != first) {
      *mismatch = Mismatch(requests, field, describe_of ? describe_of : value_of, fix);
      return true;
    }
  }
  return false;
}

std::string TrailingShape(const Request& request) {
  if (request.shape.empty()) return "[] (scalar)";
  return ShapeToString(std::vector<int64_t>(request.shape.begin() + 1, request.shape.end()));
}

std::string TrailingAndFullShape(const Request& request) {
  return TrailingShape(request) + " (full shape " + ShapeToString(request.shape) + ")";
}

// Alltoall and reducescatter divide dimension 0 between the ranks.
Response ScalarRejected(const Request& request) {
  Response response;
  response.request = request;
  response.is_error = true;
  response.error_message = std::string("tfring ") + CollectiveTypeName(request.type) +
                           " of tensor '" + request.name +
                           "': the tensor is a scalar, but " + CollectiveTypeName(request.type) +
                           " divides dimension 0 between the ranks, so it needs at least one "
                           "dimension. Reshape it to shape [1] before the call (every rank passed "
                           "a scalar).";
  return response;
}

// While ranks have joined only allreduce can run: they have no data for the
// others (Horovod's rule).
Response JoinedRejected(const Request& request, const std::vector<int>& joined) {
  Response response;
  response.request = request;
  response.is_error = true;
  std::string message = std::string("tfring ") + CollectiveTypeName(request.type) +
                        " of tensor '" + request.name + "': " + RanksToString(joined) +
                        (joined.size() == 1 ? " has" : " have") +
                        " joined (hvd.join()), so it runs no more collectives until every "
                        "rank has joined; only allreduce can run meanwhile (the joined ranks "
                        "take part with zeros).";
  if (request.type == CollectiveType::kBroadcast &&
      std::find(joined.begin(), joined.end(), request.root_rank) != joined.end()) {
    message += " The broadcast's root, rank " + std::to_string(request.root_rank) +
               ", is one of them and has nothing to send.";
  }
  message += " Run this collective before the ranks join, or after join() returns on every "
             "rank.";
  response.error_message = message;
  return response;
}

}  // namespace

Response BuildResponse(const std::vector<Request>& requests, const std::vector<int>& joined) {
  Response mismatch;
  if (Disagree(requests, "collective operation",
               [](const Request& r) { return std::string(CollectiveTypeName(r.type)); },
               "The same name was used for different collectives; give each collective call a "
               "unique name.",
               &mismatch) ||
      Disagree(requests, "dtype",
               [](const Request& r) { return std::string(DataTypeName(r.dtype)); },
               "Cast the tensor to one dtype on every rank before the collective.", &mismatch)) {
    return mismatch;
  }
  const CollectiveType type = requests[0].type;
  if (IsReduction(type)) {
    if (Disagree(requests, "reduction op",
                 [](const Request& r) { return std::string(ReduceOpName(r.reduce_op)); },
                 kSameProgramFix, &mismatch) ||
        Disagree(requests, "prescale_factor",
                 [](const Request& r) { return FormatNumber(r.prescale_factor); },
                 kSameProgramFix, &mismatch) ||
        Disagree(requests, "postscale_factor",
                 [](const Request& r) { return FormatNumber(r.postscale_factor); },
                 kSameProgramFix, &mismatch) ||
        Disagree(requests, "wire compression",
                 [](const Request& r) { return std::string(WireCompressionName(r.compression)); },
                 "Pass the same compression= on every rank (and set TFRING_WIRE_COMPRESSION "
                 "the same way for every rank).",
                 &mismatch)) {
      return mismatch;
    }
  }
  if (type == CollectiveType::kBroadcast &&
      Disagree(requests, "root rank",
               [](const Request& r) { return std::to_string(r.root_rank); },
               "Pass the same root_rank on every rank.", &mismatch)) {
    return mismatch;
  }
  if (HasRunTimeShape(type)) {
    if (Disagree(requests, "shape after the first dimension", TrailingShape,
                 std::string("Only the first dimension may differ between ranks in an ") +
                     CollectiveTypeName(type) + ".",
                 &mismatch, TrailingAndFullShape)) {
      return mismatch;
    }
  } else if (Disagree(requests, "shape",
                      [](const Request& r) { return ShapeToString(r.shape); },
                      "Check that every rank builds the same model and feeds inputs of the same "
                      "shape (only allgather and alltoall accept a first dimension that "
                      "differs).",
                      &mismatch)) {
    return mismatch;
  }
  if ((type == CollectiveType::kAlltoall || type == CollectiveType::kReducescatter) &&
      requests[0].shape.empty()) {
    return ScalarRejected(requests[0]);
  }

  if (!joined.empty() && type != CollectiveType::kAllreduce) {
    return JoinedRejected(requests[0], joined);
  }

  Response response;
  response.request = requests[0];
  response.request.rank = 0;
  if (HasRunTimeShape(type) && !response.request.shape.empty()) {
    response.request.shape[0] = -1;
  }
  if (!joined.empty()) response.contributors = static_cast<int32_t>(requests.size());
  return response;
}

}  // namespace tfring
