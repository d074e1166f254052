#include "cc/transport/cross_host_sum.h"

#include "cc/transport/wire_codec.h"

namespace tfring {

Status CrossHostSum::Run(Transport* transport, float* values, int64_t count,
                         WireCompression compression) {
  const int ranks = transport->size();
  if (ranks == 1 || count == 0) return Status::OK();
  const int me = transport->rank();
  // Chunk j: values [begin(j), begin(j + 1)).
  auto begin = [&](int j) { return count * j / ranks; };
  std::vector<int64_t> chunk_bytes(ranks);
  int64_t total_bytes = 0;
  for (int j = 0; j < ranks; ++j) {
    chunk_bytes[j] = EncodedBytes(begin(j + 1) - begin(j), compression);
    total_bytes += chunk_bytes[j];
  }
  const int64_t my_count = begin(me + 1) - begin(me);

  // Reduce-scatter: chunk j of every rank goes to rank j, encoded.
  send_.resize(total_bytes);
  int64_t offset = 0;
  for (int j = 0; j < ranks; ++j) {
    EncodeWire(values + begin(j), begin(j + 1) - begin(j), compression, send_.data() + offset);
    offset += chunk_bytes[j];
  }
  received_.resize(chunk_bytes[me] * ranks);
  const std::vector<int64_t> receive_bytes(ranks, chunk_bytes[me]);
  TFRING_RETURN_IF_ERROR(transport->Alltoallv(send_.data(), chunk_bytes, received_.data(),
                                              receive_bytes));
  // This rank's chunk: every rank's encoded values, its own included (it
  // sent them to itself), summed in rank order in float32. Rounding its own
  // values like the others' makes each element's sum the same whichever
  // rank owns it; the chunk boundaries follow the buffer's layout (for a
  // fused buffer, how the step's tensors were fused, which depends on
  // timing), so bf16 results are then bit for bit the same from run to run.
  float* mine = values + begin(me);
  DecodeWire(received_.data(), my_count, compression, mine);
  for (int j = 1; j < ranks; ++j) {
    AccumulateWire(received_.data() + j * chunk_bytes[me], my_count, compression, mine);
  }

  // Allgather of the encoded sums; every rank decodes all of them.
  gathered_.resize(total_bytes);
  offset = 0;
  for (int j = 0; j < me; ++j) offset += chunk_bytes[j];
  EncodeWire(mine, my_count, compression, gathered_.data() + offset);
  TFRING_RETURN_IF_ERROR(transport->Allgatherv(nullptr, chunk_bytes[me], gathered_.data(),
                                               chunk_bytes));
  offset = 0;
  for (int j = 0; j < ranks; ++j) {
    DecodeWire(gathered_.data() + offset, begin(j + 1) - begin(j), compression,
               values + begin(j));
    offset += chunk_bytes[j];
  }
  return Status::OK();
}

}  // namespace tfring
