// RowLayout: where each rank's rows of dimension 0 go in the collectives
// whose output shape is not the input's: allgather, alltoall and
// reducescatter.
//
// Why a separate step: for allgather and alltoall the output depends on the
// other ranks' first dimensions and splits, which negotiation does not carry
// (they may change every step without invalidating the response cache). The
// executor exchanges them once per round for all such tensors together
// (ShapeWords), and every rank derives the same layouts from the same words,
// so every rank also reaches the same verdict on bad splits.
#ifndef TFRING_CC_EXECUTION_ROW_LAYOUT_H_
#define TFRING_CC_EXECUTION_ROW_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "cc/api.h"
#include "cc/common.h"
#include "cc/status.h"

namespace tfring {

struct RowLayout {
  // Bytes of one row: the product of the dimensions after the first.
  int64_t row_bytes = 0;
  // Rows this rank sends to each rank (alltoall), or contributes to every
  // rank's output (allgather: its first dimension, the same for all).
  std::vector<int64_t> send_rows;
  // Rows of this rank's output that come from (allgather, alltoall), or are
  // kept by (reducescatter), each rank.
  std::vector<int64_t> recv_rows;
  std::vector<int64_t> output_shape;
};

// How many int64 words each rank contributes for one tensor of this type to
// the round's exchange (0: its layout is known locally).
int64_t ShapeWordCount(CollectiveType type, int size);

// This rank's words for one tensor (ShapeWordCount of them). Alltoall splits
// are checked here; the verdict travels in the words.
std::vector<int64_t> ShapeWords(const Request& request, const TensorBuffers& buffers, int size);

// The layout of one tensor on `rank`. `words_by_rank[r]` points to rank r's
// ShapeWords for this tensor (unused for reducescatter); `world_ranks[r]` is
// rank r's job rank (for messages; its size is the number of ranks).
// Returns InvalidArgument, identically on every rank, when some rank's
// alltoall splits are invalid or the transfer is too large for the
// transport.
Status BuildRowLayout(const Request& request, const std::vector<const int64_t*>& words_by_rank,
                      int rank, const std::vector<int>& world_ranks, RowLayout* layout);

// Rows of a reducescatter's dimension 0 kept by `rank`: an even share, one
// more on the first rows % size ranks (Horovod's rule).
int64_t ReducescatterRows(int64_t rows, int rank, int size);

}  // namespace tfring

#endif  // TFRING_CC_EXECUTION_ROW_LAYOUT_H_
