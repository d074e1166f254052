#include "cc/tuning/bayesian_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "cc/logging.h"

namespace tfring {
namespace {

// Length scales (normalised units) the fit chooses between by marginal
// likelihood: from "only neighbours inform each other" to "nearly linear".
constexpr double kLengthScales[] = {0.08, 0.12, 0.18, 0.27, 0.4, 0.6, 0.9};
// Expected improvement must beat the incumbent by this much (standardised
// units) to count, so flat regions do not attract every trial.
constexpr double kImprovementMargin = 0.01;
// NextPoint's candidates: uniform over the box, then perturbations around
// the best samples at a few scales, then a short local refinement.
constexpr int kUniformCandidates = 2000;
constexpr int kSeedSamples = 3;
constexpr double kPerturbationScales[] = {0.02, 0.07, 0.2};
constexpr int kPerturbationsPerScale = 50;
constexpr int kRefinementSteps = 100;
constexpr double kPi = 3.14159265358979323846;

// Portable random numbers: std::uniform_real_distribution and
// std::normal_distribution may differ between standard libraries, and the
// tuner's choices should not.
double Uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

double StandardNormal(std::mt19937_64& rng) {
  const double u1 = 1.0 - Uniform01(rng);  // (0, 1]: the log is finite
  const double u2 = Uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

double Matern52(const std::vector<double>& a, const std::vector<double>& b, double length) {
  double squared = 0.0;
  for (size_t i = 0; i < a.size(); ++i) squared += (a[i] - b[i]) * (a[i] - b[i]);
  const double r = std::sqrt(5.0 * squared) / length;
  return (1.0 + r + r * r / 3.0) * std::exp(-r);
}

// Lower Cholesky factor of the symmetric positive definite n x n `matrix`
// (row-major), in place; false if it is not positive definite.
bool CholeskyInPlace(std::vector<double>& matrix, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    double diagonal = matrix[j * n + j];
    for (size_t k = 0; k < j; ++k) diagonal -= matrix[j * n + k] * matrix[j * n + k];
    if (!(diagonal > 0.0)) return false;
    const double pivot = std::sqrt(diagonal);
    matrix[j * n + j] = pivot;
    for (size_t i = j + 1; i < n; ++i) {
      double value = matrix[i * n + j];
      for (size_t k = 0; k < j; ++k) value -= matrix[i * n + k] * matrix[j * n + k];
      matrix[i * n + j] = value / pivot;
    }
    for (size_t i = 0; i < j; ++i) matrix[i * n + j] = 0.0;
  }
  return true;
}

// Solves L z = b for lower-triangular L.
std::vector<double> ForwardSubstitute(const std::vector<double>& lower, size_t n,
                                      std::vector<double> b) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < i; ++k) b[i] -= lower[i * n + k] * b[k];
    b[i] /= lower[i * n + i];
  }
  return b;
}

// Solves L^T z = b for lower-triangular L.
std::vector<double> BackSubstitute(const std::vector<double>& lower, size_t n,
                                   std::vector<double> b) {
  for (size_t i = n; i-- > 0;) {
    for (size_t k = i + 1; k < n; ++k) b[i] -= lower[k * n + i] * b[k];
    b[i] /= lower[i * n + i];
  }
  return b;
}

// The factor of K + noise*I for the given points; a little jitter is added
// if rounding made the matrix indefinite (duplicate points, tiny noise).
std::vector<double> FactorKernel(const std::vector<std::vector<double>>& points, double length,
                                 double noise) {
  const size_t n = points.size();
  for (double jitter = 1e-10;; jitter *= 100.0) {
    std::vector<double> matrix(n * n);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j <= i; ++j) {
        matrix[i * n + j] = matrix[j * n + i] = Matern52(points[i], points[j], length);
      }
      matrix[i * n + i] += noise + jitter;
    }
    if (CholeskyInPlace(matrix, n)) return matrix;
    TFRING_CHECK(jitter < 1.0, "kernel matrix of " << n << " points is not positive definite");
  }
}

double NormalPdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2.0 * kPi); }
double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

}  // namespace

BayesianOptimizer::BayesianOptimizer(std::vector<Bounds> bounds, double noise, uint64_t seed)
    : bounds_(std::move(bounds)), noise_(noise), rng_(seed) {
  TFRING_CHECK(!bounds_.empty(), "BayesianOptimizer needs at least one dimension");
  for (const Bounds& b : bounds_) {
    TFRING_CHECK(b.lo < b.hi, "empty bounds [" << b.lo << ", " << b.hi << "]");
  }
  TFRING_CHECK(noise_ >= 0.0, "negative noise " << noise_);
}

std::vector<double> BayesianOptimizer::Normalise(const std::vector<double>& x) const {
  TFRING_CHECK(x.size() == bounds_.size(),
               "point of " << x.size() << " values in a " << bounds_.size() << "-D box");
  std::vector<double> unit(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    unit[i] = (x[i] - bounds_[i].lo) / (bounds_[i].hi - bounds_[i].lo);
  }
  return unit;
}

std::vector<double> BayesianOptimizer::Denormalise(const std::vector<double>& unit) const {
  std::vector<double> x(unit.size());
  for (size_t i = 0; i < unit.size(); ++i) {
    const double clamped = std::min(1.0, std::max(0.0, unit[i]));
    x[i] = bounds_[i].lo + clamped * (bounds_[i].hi - bounds_[i].lo);
  }
  return x;
}

void BayesianOptimizer::AddSample(const std::vector<double>& x, double y) {
  TFRING_CHECK(std::isfinite(y), "non-finite score " << y);
  points_.push_back(Normalise(x));
  scores_.push_back(y);
  Fit();
}

void BayesianOptimizer::Fit() {
  const size_t n = points_.size();
  score_mean_ = std::accumulate(scores_.begin(), scores_.end(), 0.0) / n;
  double variance = 0.0;
  for (double y : scores_) variance += (y - score_mean_) * (y - score_mean_);
  variance /= n;
  // Identical scores (or one sample) carry no scale: keep unit scale so the
  // posterior mean is flat and EI explores by uncertainty alone.
  score_scale_ = variance > 1e-300 ? std::sqrt(variance) : 1.0;
  std::vector<double> standardised(n);
  for (size_t i = 0; i < n; ++i) standardised[i] = (scores_[i] - score_mean_) / score_scale_;

  double best_likelihood = -std::numeric_limits<double>::infinity();
  for (double length : kLengthScales) {
    std::vector<double> factor = FactorKernel(points_, length, noise_);
    std::vector<double> alpha =
        BackSubstitute(factor, n, ForwardSubstitute(factor, n, standardised));
    // log p(y) = -y^T alpha / 2 - sum log L_ii - n log(2 pi) / 2; the last
    // term is the same for every candidate.
    double likelihood = -0.5 * std::inner_product(standardised.begin(), standardised.end(),
                                                  alpha.begin(), 0.0);
    for (size_t i = 0; i < n; ++i) likelihood -= std::log(factor[i * n + i]);
    if (likelihood > best_likelihood) {
      best_likelihood = likelihood;
      length_scale_ = length;
      cholesky_ = std::move(factor);
      alpha_ = std::move(alpha);
    }
  }

  incumbent_ = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) {
    const double mean = PredictUnit(points_[i]).mean;
    if (mean > incumbent_) {
      incumbent_ = mean;
      best_index_ = i;
    }
  }
}

Prediction BayesianOptimizer::PredictUnit(const std::vector<double>& unit) const {
  const size_t n = points_.size();
  if (n == 0) return Prediction{0.0, 1.0};
  std::vector<double> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = Matern52(unit, points_[i], length_scale_);
  const double mean = std::inner_product(k.begin(), k.end(), alpha_.begin(), 0.0);
  const std::vector<double> v = ForwardSubstitute(cholesky_, n, std::move(k));
  const double variance = 1.0 - std::inner_product(v.begin(), v.end(), v.begin(), 0.0);
  return Prediction{mean, std::sqrt(std::max(variance, 1e-12))};
}

Prediction BayesianOptimizer::Predict(const std::vector<double>& x) const {
  const Prediction unit = PredictUnit(Normalise(x));
  return Prediction{score_mean_ + unit.mean * score_scale_, unit.stddev * score_scale_};
}

double BayesianOptimizer::ExpectedImprovementUnit(const std::vector<double>& unit) const {
  const Prediction p = PredictUnit(unit);
  const double gain = p.mean - incumbent_ - kImprovementMargin;
  const double z = gain / p.stddev;
  return std::max(0.0, gain * NormalCdf(z) + p.stddev * NormalPdf(z));
}

double BayesianOptimizer::ExpectedImprovement(const std::vector<double>& x) const {
  if (points_.empty()) return 0.0;
  return ExpectedImprovementUnit(Normalise(x));
}

std::vector<double> BayesianOptimizer::NextPoint() {
  const size_t d = bounds_.size();
  auto uniform_point = [&] {
    std::vector<double> unit(d);
    for (double& u : unit) u = Uniform01(rng_);
    return unit;
  };
  if (points_.empty()) return Denormalise(uniform_point());

  std::vector<double> best_unit;
  double best_ei = -1.0;
  auto consider = [&](std::vector<double> unit) {
    for (double& u : unit) u = std::min(1.0, std::max(0.0, u));
    const double ei = ExpectedImprovementUnit(unit);
    if (ei > best_ei) {
      best_ei = ei;
      best_unit = std::move(unit);
    }
  };
  for (int i = 0; i < kUniformCandidates; ++i) consider(uniform_point());

  // Around the samples the model rates highest: the optimum is often close.
  std::vector<size_t> order(points_.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> means(points_.size());
  for (size_t i = 0; i < points_.size(); ++i) means[i] = PredictUnit(points_[i]).mean;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return means[a] > means[b]; });
  const size_t seeds = std::min<size_t>(kSeedSamples, order.size());
  for (size_t s = 0; s < seeds; ++s) {
    for (double scale : kPerturbationScales) {
      for (int i = 0; i < kPerturbationsPerScale; ++i) {
        std::vector<double> unit = points_[order[s]];
        for (double& u : unit) u += scale * StandardNormal(rng_);
        consider(std::move(unit));
      }
    }
  }

  // Local refinement of the winner with a shrinking step.
  for (int step = 0; step < kRefinementSteps; ++step) {
    const double scale = 0.05 * std::pow(0.97, step);
    std::vector<double> unit = best_unit;
    for (double& u : unit) u += scale * StandardNormal(rng_);
    consider(std::move(unit));
  }
  return Denormalise(best_unit);
}

std::vector<double> BayesianOptimizer::BestPoint() const {
  TFRING_CHECK(!points_.empty(), "BestPoint before any sample");
  return Denormalise(points_[best_index_]);
}

size_t BayesianOptimizer::BestSampleIndex() const {
  TFRING_CHECK(!points_.empty(), "BestSampleIndex before any sample");
  return best_index_;
}

std::vector<std::vector<double>> LatinHypercube(const std::vector<Bounds>& bounds, int count,
                                                uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<double>> points(std::max(count, 0), std::vector<double>(bounds.size()));
  for (size_t dim = 0; dim < bounds.size(); ++dim) {
    std::vector<int> strata(points.size());
    std::iota(strata.begin(), strata.end(), 0);
    // Fisher-Yates with the portable generator (std::shuffle's use of the
    // engine is unspecified).
    for (size_t i = strata.size(); i > 1; --i) {
      std::swap(strata[i - 1], strata[rng() % i]);
    }
    for (size_t i = 0; i < points.size(); ++i) {
      const double unit = (strata[i] + Uniform01(rng)) / static_cast<double>(points.size());
      points[i][dim] = bounds[dim].lo + unit * (bounds[dim].hi - bounds[dim].lo);
    }
  }
  return points;
}

}  // namespace tfring
