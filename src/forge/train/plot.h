// A self-contained SVG line chart of the loss curves (no plotting dependency): people would
// rather look at a curve than read a log.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace forge {

using Curve = std::vector<std::pair<double, double>>;  // (step, loss)

// Draws train (thin, with a moving average) and val (markers) losses against the step and
// writes the SVG to path (atomically: io/atomic_file.h). Throws forge::Error when the file cannot
// be written.
void write_loss_svg(const std::string& path, const Curve& train, const Curve& val,
                    const std::string& title);

}  // namespace forge
