#include "forge/train/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "forge/io/atomic_file.h"

namespace forge {

namespace {

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", x);
  return buf;
}

}  // namespace

void write_loss_svg(const std::string& path, const Curve& train, const Curve& val,
                    const std::string& title) {
  const double W = 800, H = 480, left = 70, right = 20, top = 40, bottom = 50;
  double x0 = 0, x1 = 1, y0 = 1e300, y1 = -1e300;
  for (const Curve* c : {&train, &val})
    for (const auto& [s, l] : *c) {
      if (!std::isfinite(l)) continue;
      x1 = std::max(x1, s);
      y0 = std::min(y0, l);
      y1 = std::max(y1, l);
    }
  if (y0 > y1) y0 = 0, y1 = 1;
  if (y1 - y0 < 1e-9) y1 = y0 + 1;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad;
  y1 += pad;
  auto px = [&](double s) { return left + (s - x0) / (x1 - x0) * (W - left - right); };
  auto py = [&](double l) { return top + (y1 - l) / (y1 - y0) * (H - top - bottom); };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << title
    << "</text>\n";
  // Axes, ticks and grid.
  for (int i = 0; i <= 5; ++i) {
    const double l = y0 + (y1 - y0) * i / 5, y = py(l);
    o << "<line x1=\"" << left << "\" x2=\"" << W - right << "\" y1=\"" << y << "\" y2=\"" << y
      << "\" stroke=\"#e5e5e5\"/>\n<text x=\"" << left - 6 << "\" y=\"" << y + 4
      << "\" text-anchor=\"end\">" << fmt(l) << "</text>\n";
    const double s = x0 + (x1 - x0) * i / 5, x = px(s);
    o << "<text x=\"" << x << "\" y=\"" << H - bottom + 18 << "\" text-anchor=\"middle\">"
      << fmt(std::round(s)) << "</text>\n";
  }
  o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << W - left - right
    << "\" height=\"" << H - top - bottom << "\" fill=\"none\" stroke=\"#333\"/>\n"
    << "<text x=\"" << (left + W - right) / 2 << "\" y=\"" << H - 12
    << "\" text-anchor=\"middle\">step</text>\n"
    << "<text x=\"16\" y=\"" << (top + H - bottom) / 2 << "\" transform=\"rotate(-90 16 "
    << (top + H - bottom) / 2 << ")\" text-anchor=\"middle\">loss</text>\n";
  auto polyline = [&](const Curve& c, const char* color, double width) {
    if (c.empty()) return;
    o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"" << width
      << "\" points=\"";
    for (const auto& [s, l] : c)
      if (std::isfinite(l)) o << px(s) << "," << py(l) << " ";
    o << "\"/>\n";
  };
  polyline(train, "#9ecae1", 1);
  // Moving average over ~2% of the points makes the trend readable through the noise.
  Curve smooth;
  const size_t k = std::max<size_t>(1, train.size() / 50);
  double acc = 0;
  for (size_t i = 0; i < train.size(); ++i) {
    acc += train[i].second;
    if (i >= k) acc -= train[i - k].second;
    smooth.push_back({train[i].first, acc / static_cast<double>(std::min(i + 1, k))});
  }
  polyline(smooth, "#1f77b4", 2);
  polyline(val, "#d62728", 2);
  for (const auto& [s, l] : val)
    o << "<circle cx=\"" << px(s) << "\" cy=\"" << py(l) << "\" r=\"3\" fill=\"#d62728\"/>\n";
  o << "<text x=\"" << W - right - 150 << "\" y=\"" << top + 18
    << "\" fill=\"#1f77b4\">train loss</text>\n<text x=\"" << W - right - 150 << "\" y=\""
    << top + 34 << "\" fill=\"#d62728\">validation loss</text>\n</svg>\n";

  io::write_file_atomic(path, o.str());
}

}  // namespace forge
