#include "cc/execution/row_layout.h"

#include <algorithm>
#include <climits>
#include <sstream>
#include <string>

namespace tfring {
namespace {

// An alltoall's words: verdict, its detail, the first dimension, then one
// split per rank (padded with zeros or cut to `size` when invalid).
enum SplitsVerdict : int64_t {
  kValid = 0,
  kNotDivisible = 1,  // no splits, and the rows do not divide evenly
  kWrongLength = 2,   // detail: the number of entries given
  kNegative = 3,      // detail: the index of the first negative entry
  kWrongSum = 4,      // detail: the sum of the entries
};
constexpr int kVerdict = 0, kDetail = 1, kRows = 2, kSplits = 3;

int64_t RowBytes(const Request& request) {
  if (request.shape.empty()) return DataTypeSize(request.dtype);  // a scalar is one row
  return NumElements(std::vector<int64_t>(request.shape.begin() + 1, request.shape.end())) *
         DataTypeSize(request.dtype);
}

int64_t Rows(const Request& request) { return request.shape.empty() ? 1 : request.shape[0]; }

std::string SplitsToString(const int64_t* splits, int size) {
  return ShapeToString(std::vector<int64_t>(splits, splits + size));
}

// What is wrong with one rank's splits, from its words.
std::string DescribeBadSplits(const int64_t* words, int size) {
  std::ostringstream out;
  const int64_t rows = words[kRows];
  switch (words[kVerdict]) {
    case kNotDivisible:
      out << "no splits were given and dimension 0 (" << rows << ") does not divide evenly among "
          << size << " ranks";
      break;
    case kWrongLength:
      out << "splits has " << words[kDetail] << " entries, expected one per rank (" << size
          << ")";
      break;
    case kNegative:
      out << "splits " << SplitsToString(words + kSplits, size) << " has a negative entry at index "
          << words[kDetail];
      break;
    case kWrongSum:
      out << "splits " << SplitsToString(words + kSplits, size) << " sum to " << words[kDetail]
          << ", but dimension 0 of the tensor is " << rows;
      break;
  }
  return out.str();
}

Status AlltoallLayout(const Request& request, const std::vector<const int64_t*>& words_by_rank,
                      int rank, const std::vector<int>& world_ranks, RowLayout* layout) {
  const int size = static_cast<int>(world_ranks.size());
  std::ostringstream problems;
  int bad_ranks = 0;
  for (int r = 0; r < size; ++r) {
    if (words_by_rank[r][kVerdict] == kValid) continue;
    problems << (bad_ranks++ > 0 ? "; " : "") << "rank " << world_ranks[r] << ": "
             << DescribeBadSplits(words_by_rank[r], size);
  }
  if (bad_ranks > 0) {
    return Status::InvalidArgument(
        "tfring alltoall of tensor '" + request.name + "': invalid splits on " +
        (bad_ranks == 1 ? "one rank" : std::to_string(bad_ranks) + " ranks") + " (" +
        problems.str() +
        "). splits[j] is the number of rows (dimension 0) sent to rank j: pass one "
        "non-negative entry per rank, summing to dimension 0 of the tensor, or splits=None to "
        "split dimension 0 evenly. Every rank skipped this alltoall.");
  }
  // MPI counts are ints: every rank's total sent and received bytes must
  // fit, judged on every rank from the same words.
  for (int r = 0; r < size; ++r) {
    int64_t sent = 0, received = 0;
    for (int j = 0; j < size; ++j) {
      sent += words_by_rank[r][kSplits + j];
      received += words_by_rank[j][kSplits + r];
    }
    if (std::max(sent, received) * layout->row_bytes > INT_MAX) {
      return Status::InvalidArgument(
          "tfring alltoall of tensor '" + request.name + "': rank " +
          std::to_string(world_ranks[r]) +
          " would send or receive more than 2 GiB, which the MPI transport does not support "
          "yet; split the tensor into smaller alltoalls");
    }
  }
  for (int j = 0; j < size; ++j) {
    layout->send_rows.push_back(words_by_rank[rank][kSplits + j]);
    layout->recv_rows.push_back(words_by_rank[j][kSplits + rank]);
  }
  return Status::OK();
}

}  // namespace

int64_t ShapeWordCount(CollectiveType type, int size) {
  switch (type) {
    case CollectiveType::kAllgather: return 1;
    case CollectiveType::kAlltoall: return kSplits + size;
    default: return 0;
  }
}

std::vector<int64_t> ShapeWords(const Request& request, const TensorBuffers& buffers, int size) {
  if (request.type == CollectiveType::kAllgather) return {Rows(request)};
  if (request.type != CollectiveType::kAlltoall) return {};

  std::vector<int64_t> words(kSplits + size, 0);
  const int64_t rows = Rows(request);
  words[kRows] = rows;
  const std::vector<int64_t>& splits = buffers.splits;
  for (int j = 0; j < size && j < static_cast<int>(splits.size()); ++j) {
    words[kSplits + j] = splits[j];
  }
  if (splits.empty()) {
    if (rows % size != 0) {
      words[kVerdict] = kNotDivisible;
    } else {
      for (int j = 0; j < size; ++j) words[kSplits + j] = rows / size;
    }
    return words;
  }
  if (static_cast<int64_t>(splits.size()) != size) {
    words[kVerdict] = kWrongLength;
    words[kDetail] = static_cast<int64_t>(splits.size());
    return words;
  }
  int64_t sum = 0;
  for (int j = 0; j < size; ++j) {
    if (splits[j] < 0) {
      words[kVerdict] = kNegative;
      words[kDetail] = j;
      return words;
    }
    sum += splits[j];
  }
  if (sum != rows) {
    words[kVerdict] = kWrongSum;
    words[kDetail] = sum;
  }
  return words;
}

int64_t ReducescatterRows(int64_t rows, int rank, int size) {
  return rows / size + (rank < rows % size ? 1 : 0);
}

Status BuildRowLayout(const Request& request, const std::vector<const int64_t*>& words_by_rank,
                      int rank, const std::vector<int>& world_ranks, RowLayout* layout) {
  const int size = static_cast<int>(world_ranks.size());
  *layout = RowLayout();
  layout->row_bytes = RowBytes(request);
  switch (request.type) {
    case CollectiveType::kAllgather:
      for (int r = 0; r < size; ++r) layout->recv_rows.push_back(words_by_rank[r][0]);
      layout->send_rows.assign(size, Rows(request));
      break;
    case CollectiveType::kAlltoall:
      TFRING_RETURN_IF_ERROR(AlltoallLayout(request, words_by_rank, rank, world_ranks, layout));
      break;
    case CollectiveType::kReducescatter:
      for (int r = 0; r < size; ++r) {
        layout->recv_rows.push_back(ReducescatterRows(Rows(request), r, size));
      }
      break;
    default:
      return Status::Internal("no row layout for a " +
                              std::string(CollectiveTypeName(request.type)));
  }
  // The output keeps the input's trailing dimensions; a scalar gathers to a
  // vector.
  layout->output_shape = request.shape.empty() ? std::vector<int64_t>{0} : request.shape;
  layout->output_shape[0] = request.type == CollectiveType::kReducescatter
                                ? layout->recv_rows[rank]
                                : 0;
  if (request.type != CollectiveType::kReducescatter) {
    for (int64_t rows : layout->recv_rows) layout->output_shape[0] += rows;
  }
  return Status::OK();
}

}  // namespace tfring
