// Loss spikes: the z-score of each step's loss against the losses of the steps before it, as
// llm.c's OutlierDetector (llmc/outlier_detector.h) scores them, with one difference: llm.c puts
// the new loss into its own window before scoring it, which caps z at sqrt(window − 1) (11.3)
// and dampens the very spike it looks for; here a loss is scored against the `window` losses
// before it and joins the window afterwards.
//
// The mean and standard deviation are recomputed over the window each time (two passes, 128
// values: nothing next to a training step) rather than kept as running sums, so z depends only
// on the window's values: a resumed run, which refills the window from metrics.jsonl, logs the
// same z bit for bit as a run that never stopped.
#pragma once

#include <cstddef>
#include <deque>

namespace forge {

class LossOutlierDetector {
 public:
  static constexpr size_t kWindow = 128;  // llm.c's OUTLIER_DETECTOR_WINDOW_SIZE

  // The z-score of `loss` against the window (NaN until the window is full; 0 when its losses
  // are all equal), then `loss` joins the window, pushing out its oldest. Non-finite losses
  // (a skipped step) are not scored and do not join.
  double score(double loss);

 private:
  std::deque<double> window_;
};

}  // namespace forge
