#include "forge/train/loss_outliers.h"

#include <cmath>

namespace forge {

double LossOutlierDetector::score(double loss) {
  if (!std::isfinite(loss)) return NAN;
  double z = NAN;
  if (window_.size() == kWindow) {
    double sum = 0;
    for (double x : window_) sum += x;
    const double mean = sum / kWindow;
    double sq = 0;
    for (double x : window_) sq += (x - mean) * (x - mean);
    const double sd = std::sqrt(sq / kWindow);
    z = sd > 0 ? (loss - mean) / sd : 0.0;
    window_.pop_front();
  }
  window_.push_back(loss);
  return z;
}

}  // namespace forge
