// BayesianOptimizer: decides where to measure next when every measurement is
// slow and noisy, by modelling the score as a Gaussian process over a box.
//
// Why: the autotuner (autotuner.h) can afford about twenty trials, each one a
// few dozen training steps, and measured throughput jitters from step to
// step. A grid or random search spends most of those trials on settings that
// are plainly poor; a Gaussian-process posterior says both how good a
// setting probably is and how unsure that is, and expected improvement
// spends each trial where a better score is most likely. Everything here is
// plain arithmetic on a handful of points (no threads, no clocks, no
// third-party code), deterministic for a given seed, so it is tested on
// synthetic objectives (tests/cc/autotune_test.cc).
//
// Model: inputs are normalised to [0,1]^d and scores standardised (zero
// mean, unit variance); Matern-5/2 kernel of unit variance whose length
// scale is chosen per fit from a few candidates by marginal likelihood;
// `noise` is added to the kernel's diagonal. Maximises the score.
#ifndef TFRING_CC_TUNING_BAYESIAN_OPTIMIZER_H_
#define TFRING_CC_TUNING_BAYESIAN_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace tfring {

// One dimension of the search box, in the caller's units (lo < hi).
struct Bounds {
  double lo = 0.0;
  double hi = 1.0;
};

// The posterior at one point, in the units of the scores passed to AddSample.
// `stddev` is the uncertainty of the underlying function, not of one noisy
// measurement of it.
struct Prediction {
  double mean = 0.0;
  double stddev = 0.0;
};

class BayesianOptimizer {
 public:
  // `noise`: the variance added to the kernel's diagonal, relative to the
  // standardised scores (0.8 trusts any single score little; 0.01 nearly
  // interpolates). `seed` fixes every random choice.
  BayesianOptimizer(std::vector<Bounds> bounds, double noise, uint64_t seed);

  // Records that the score at `x` (one value per dimension) was `y`, and
  // refits the model (a few Cholesky factorisations of samples x samples).
  void AddSample(const std::vector<double>& x, double y);

  // The point that maximises expected improvement over the best posterior
  // mean among the samples; a uniform random point before any sample.
  std::vector<double> NextPoint();

  // The sampled point with the highest posterior mean: robust to one lucky
  // noisy score. Requires at least one sample.
  std::vector<double> BestPoint() const;
  // Its index in the order AddSample was called.
  size_t BestSampleIndex() const;

  // The posterior at `x`; the prior (mean and spread of the scores so far)
  // far from every sample.
  Prediction Predict(const std::vector<double>& x) const;
  // Expected improvement at `x` in standardised score units (>= 0).
  double ExpectedImprovement(const std::vector<double>& x) const;

  size_t dimensions() const { return bounds_.size(); }
  size_t num_samples() const { return points_.size(); }
  // The kernel length scale of the current fit, in normalised ([0,1]) units.
  double length_scale() const { return length_scale_; }

 private:
  std::vector<double> Normalise(const std::vector<double>& x) const;
  std::vector<double> Denormalise(const std::vector<double>& unit) const;
  void Fit();
  // Posterior mean and stddev in standardised units at a normalised point.
  Prediction PredictUnit(const std::vector<double>& unit) const;
  double ExpectedImprovementUnit(const std::vector<double>& unit) const;

  std::vector<Bounds> bounds_;
  double noise_;
  std::mt19937_64 rng_;

  // Samples: normalised inputs and raw scores.
  std::vector<std::vector<double>> points_;
  std::vector<double> scores_;

  // The fit: score standardisation, length scale, the lower Cholesky factor
  // of K + noise*I (row-major, n x n), alpha = (K + noise*I)^-1 y, and the
  // best posterior mean over the samples (standardised), EI's incumbent.
  double score_mean_ = 0.0;
  double score_scale_ = 1.0;
  double length_scale_ = 0.25;
  std::vector<double> cholesky_;
  std::vector<double> alpha_;
  double incumbent_ = 0.0;
  size_t best_index_ = 0;
};

// `count` points spread evenly over the box: a Latin hypercube (each
// dimension cut into `count` equal strata, every stratum used exactly once,
// a random point inside each), the usual opening design before a model is
// worth trusting. Deterministic for a given seed.
std::vector<std::vector<double>> LatinHypercube(const std::vector<Bounds>& bounds, int count,
                                                uint64_t seed);

}  // namespace tfring

#endif  // TFRING_CC_TUNING_BAYESIAN_OPTIMIZER_H_
