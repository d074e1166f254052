// ShmBarrier: a barrier among the ranks of one host, in shared memory.
//
// Why not MPI's: the shared-memory collectives (shm_collectives.h) meet once
// or twice per operation and once per chunk of a large one; an MPI barrier
// costs tens of microseconds there, a cache-line handshake well under one.
//
// How: every rank owns one cache line holding a 64-bit step counter that only
// ever grows (published with release, read with acquire) and its pid. A rank
// arrives by publishing its next step, and the barrier is passed when every
// rank's counter reaches it. A waiting rank spins briefly (the others are
// usually a few microseconds behind), then sleeps on a futex that every
// arriving rank rings when someone sleeps: on a host with few cores a
// spinning (or yielding) rank would steal the core of the rank it waits for
// or of TensorFlow, and a timed sleep would add its whole length to the
// latency of small operations.
//
// Round calls: a rank that has waited a millisecond at a negotiation step
// for peers that have not come (they may be idle, sleeping until new work
// arrives) calls them: it bumps a shared word that each rank's watcher
// (WaitForRoundCall, on a thread of its own) sleeps on. At most one call a
// millisecond per rank, and none for a peer that comes sooner, so a peer
// busy computing the same work is not pulled into rounds for nothing. This
// lets idle ranks skip idle rounds altogether.
//
// Passing is decided by one shared word: the count of every rank's arrivals
// (step k is passed once it reaches k * size). Each rank also publishes its
// step in a cache line of its own, which says who is missing.
//
// Failures: while it sleeps, a waiting rank checks every few milliseconds
// whether the missing ranks' processes still exist, and gives up with
// Aborted naming a rank that exited. A wait with a time limit (a data
// operation, whose peers are known to be in it already) also gives up when
// the missing ranks make no progress for that long. Giving up takes this
// rank's arrival back and marks the barrier given up in the same atomic
// step (GiveUp), unless the count completed first: so either every rank
// passes the step or none does. A rank that comes late (it was suspended,
// say) fails instead of passing and going on to write its part of an
// operation the others have abandoned; the ranks still waiting fail at once
// too. Either way the barrier refuses every later wait: the ranks' steps no
// longer match.
//
// Not thread-safe: one instance per rank, used by one thread.
#ifndef TFRING_CC_SHM_SHM_BARRIER_H_
#define TFRING_CC_SHM_SHM_BARRIER_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cc/status.h"

namespace tfring {

class ShmBarrier {
 public:
  // Bytes of shared memory the barrier of `size` ranks needs (a multiple of
  // 64 bytes).
  static size_t Bytes(int size);

  // Uses `area` (Bytes(size) bytes, 64-byte aligned, zero-filled when the
  // segment was created, shared by the `size` ranks) as rank `rank`.
  // `job_ranks[r]` names rank r in messages (the job's rank numbers).
  ShmBarrier(void* area, int rank, int size, std::vector<int> job_ranks);

  // Arrives and waits for every rank. `what` names the operation in errors.
  // `timeout`: give up when the missing ranks do not arrive for that long;
  // zero waits as long as they are alive.
  Status Wait(const char* what, std::chrono::nanoseconds timeout);
  // As Wait, and calls the missing peers to a round (above) when they do
  // not come within the spin.
  Status WaitCallingPeers(const char* what);

  // The round-call word, and a sleep until it differs from `seen` (or
  // `limit` passes, or a spurious wake-up). Thread-safe, unlike the rest.
  uint32_t RoundCalls() const;
  void WaitForRoundCall(uint32_t seen, std::chrono::nanoseconds limit) const;
  // Wakes every rank's watcher. Thread-safe.
  void CallRound() const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Barriers this rank has passed.
  uint64_t steps() const { return steps_; }

  // "rank 7" or "ranks 4, 9": local ranks as the job numbers them. An index
  // outside [0, size) (read from a corrupted segment) is named as such.
  std::string Describe(const std::vector<int>& ranks) const;

 private:
  struct alignas(64) RankLine;
  struct alignas(64) Doorbell;

  enum class Verdict { kWaiting, kPassed, kGivenUp };

  RankLine& Line(int rank) const;
  Doorbell& Bell() const;
  // Whether step `target` is passed, given up, or still waiting.
  Verdict Check(uint64_t target) const;
  // Gives up step `target` (above); false if it was passed meanwhile.
  bool GiveUp(uint64_t target);
  // The rank that gave the barrier up; valid once Check says so.
  int Giver() const;
  Status GivenUpStatus(const char* what, uint64_t target,
                       std::chrono::nanoseconds timeout) const;
  Status ExitedStatus(const char* what, const std::vector<int>& exited) const;
  std::vector<int> Missing(uint64_t target) const;
  // The missing ranks whose process no longer exists.
  std::vector<int> Exited(const std::vector<int>& missing) const;
  Status WaitFor(const char* what, std::chrono::nanoseconds timeout, bool call_peers);

  char* const area_;
  const int rank_;
  const int size_;
  const std::vector<int> job_ranks_;
  uint64_t steps_ = 0;
  std::chrono::steady_clock::time_point last_round_call_;
  Status broken_;
};

}  // namespace tfring

#endif  // TFRING_CC_SHM_SHM_BARRIER_H_
