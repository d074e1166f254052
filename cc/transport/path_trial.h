// PathTrial: which way a job's uncompressed allreduces cross hosts when the
// job leaves the choice to tfring (TFRING_HIERARCHICAL_ALLREDUCE=measured,
// the default).
//
// Why measured: which path is faster depends on the links and the cores.
// On the same 2 x 2 hosts the flat allreduce of the ResNet-50 set was faster
// at 1 Gbit/s (888 against 1158 ms) and the hierarchical one at 10 Gbit/s
// (252 against 470 ms) (docs/compression.md), so no fixed rule is right.
//
// How: the eligible allreduces (those the hierarchical path may take) first
// alternate between the two paths: a few untimed to warm both up (buffers,
// TCP connections that Open MPI opens on first use), then `trials` of each
// timed. The ranks then add their measured nanoseconds per MB of each path
// (one small integer allreduce, so every rank sees the same sums) and all
// take the faster path for the rest of the job. Every rank sees the same
// eligible allreduces in the same order (the core executes the same
// responses everywhere), so the schedule and the agreement line up.
#ifndef TFRING_CC_TRANSPORT_PATH_TRIAL_H_
#define TFRING_CC_TRANSPORT_PATH_TRIAL_H_

#include <cstdint>

namespace tfring {

class PathTrial {
 public:
  enum class Path { kFlat, kHierarchical };

  // trials: timed allreduces per path before the choice (at least 1).
  explicit PathTrial(int64_t trials);

  // The path of the next eligible allreduce.
  Path Next() const;
  // Records that the eligible allreduce just run on Next() moved `bytes`
  // in `seconds`.
  void Record(int64_t bytes, double seconds);
  // Whether the trials are over and the ranks must agree (Agree) before the
  // next eligible allreduce.
  bool NeedsAgreement() const;
  // This rank's measured nanoseconds per MB on {flat, hierarchical}.
  void Measured(int64_t out[2]) const;
  // Takes the faster path given the sums of Measured over the ranks.
  void Agree(const int64_t summed[2]);

  bool decided() const { return decided_; }

 private:
  static constexpr int64_t kWarmupPerPath = 2;
  const int64_t trials_;
  int64_t calls_ = 0;  // eligible allreduces run so far
  bool decided_ = false;
  Path chosen_ = Path::kFlat;
  double seconds_[2] = {0, 0};
  double bytes_[2] = {0, 0};
};

}  // namespace tfring

#endif  // TFRING_CC_TRANSPORT_PATH_TRIAL_H_
