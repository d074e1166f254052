// CrossHostSum: a float32 sum over a transport whose ranks sit on different
// hosts, with the data encoded on the wire (wire_codec.h).
//
// Why not the transport's own allreduce: MPI reduces what it receives in the
// wire's type, so a 16-bit allreduce would add in 16 bits and lose precision
// (and fp16 would overflow). Here every value crosses the network encoded,
// but every addition happens in float32.
//
// How (a reduce-scatter then an allgather, each on encoded data): the data
// is cut into one chunk per rank; every rank sends chunk j, encoded, to rank
// j (Alltoallv); rank j decodes the arrivals, its own chunk's included,
// adds them in rank order in float32 and encodes the sum; every rank gathers
// the encoded sums (Allgatherv) and decodes them. Each rank sends and
// receives 2 (n - 1) / n of the data at 16 bits: half of what a float32
// ring moves. Every rank, the owner of a
// chunk included, ends with the decoded bits of the same encoded sum, so the
// results are identical on every rank.
#ifndef TFRING_CC_TRANSPORT_CROSS_HOST_SUM_H_
#define TFRING_CC_TRANSPORT_CROSS_HOST_SUM_H_

#include <cstdint>
#include <vector>

#include "cc/common.h"
#include "cc/status.h"
#include "cc/transport.h"

namespace tfring {

class CrossHostSum {
 public:
  // In place: `values` (count float32 values on every rank of `transport`)
  // becomes their sum over the ranks, encoded as `compression` on the wire.
  // Collective over `transport`'s ranks.
  Status Run(Transport* transport, float* values, int64_t count, WireCompression compression);

 private:
  // Scratch kept between calls (the same sizes recur every step).
  std::vector<uint8_t> send_;
  std::vector<uint8_t> received_;
  std::vector<uint8_t> gathered_;
};

}  // namespace tfring

#endif  // TFRING_CC_TRANSPORT_CROSS_HOST_SUM_H_
