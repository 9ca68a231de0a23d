// A line chart as a standalone SVG file: axes with ticks, one polyline per series (each its own colour and
// dash pattern) with an optional band around it, a legend, and optionally the line y = 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace smoe {

struct Series {
  std::string name;
  std::vector<double> y;          // at x = 0, 1, 2, ...
  std::vector<double> low, high;  // a band from low to high at the same x (empty: none)
};

namespace detail {

inline std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// Tick positions at a round step (1, 2 or 5 times a power of ten) covering [lo, hi] with about 6 ticks.
inline std::vector<double> ticks(double lo, double hi) {
  const double raw = (hi - lo) / 6, power = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = power * (raw / power < 1.5 ? 1 : raw / power < 3.5 ? 2 : raw / power < 7.5 ? 5 : 10);
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + 1e-9 * step; t += step) out.push_back(t);
  return out;
}

inline std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", std::abs(v) < 1e-12 ? 0.0 : v);
  return buf;
}

}  // namespace detail

inline void write_line_chart(const std::string& path, const std::string& title, const std::string& x_label,
                             const std::string& y_label, const std::vector<Series>& series, bool zero_line = false) {
  const double width = 900, height = 500, left = 70, right = 230, top = 48, bottom = 55;
  // A title's parenthesis goes on a second, smaller line: "Heading (details)".
  const std::size_t open = title.find(" (");
  const std::string heading = title.substr(0, open);
  std::string subtitle = open == std::string::npos ? std::string() : title.substr(open + 2);
  if (!subtitle.empty() && subtitle.back() == ')') subtitle.pop_back();
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  double y_lo = std::numeric_limits<double>::infinity(), y_hi = -y_lo;
  std::size_t points = 2;
  for (const Series& s : series) {
    points = std::max(points, s.y.size());
    for (const std::vector<double>* values : {&s.y, &s.low, &s.high})
      for (double v : *values)
        if (std::isfinite(v)) y_lo = std::min(y_lo, v), y_hi = std::max(y_hi, v);
  }
  if (zero_line) y_lo = std::min(y_lo, 0.0), y_hi = std::max(y_hi, 0.0);
  if (!(y_lo <= y_hi)) y_lo = 0, y_hi = 1;
  const double pad = std::max(0.05 * (y_hi - y_lo), 1e-3);
  y_lo -= pad;
  y_hi += pad;
  const double x_hi = static_cast<double>(points - 1);
  auto px = [&](double x) { return left + plot_w * x / x_hi; };
  auto py = [&](double y) { return top + plot_h * (1 - (y - y_lo) / (y_hi - y_lo)); };
  // Ten colours, then the same colours dashed, then dotted: no two of up to 30 series look alike.
  static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                  "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  static const char* dashes[] = {"", " stroke-dasharray=\"7,4\"", " stroke-dasharray=\"2,3\""};
  constexpr std::size_t n_colours = sizeof colours / sizeof *colours;

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << left + plot_w / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"15\">"
      << detail::xml_escape(heading) << "</text>\n";
  if (!subtitle.empty())
    svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"37\" text-anchor=\"middle\" fill=\"#555\">"
        << detail::xml_escape(subtitle) << "</text>\n";
  for (double t : detail::ticks(y_lo, y_hi)) {
    svg << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << py(t) << "\" y2=\"" << py(t)
        << "\" stroke=\"#e5e5e5\"/>\n"
        << "<text x=\"" << left - 6 << "\" y=\"" << py(t) + 4 << "\" text-anchor=\"end\">" << detail::number(t)
        << "</text>\n";
  }
  for (double t : detail::ticks(0, x_hi)) {
    svg << "<line x1=\"" << px(t) << "\" x2=\"" << px(t) << "\" y1=\"" << top + plot_h << "\" y2=\"" << top + plot_h + 5
        << "\" stroke=\"black\"/>\n"
        << "<text x=\"" << px(t) << "\" y=\"" << top + plot_h + 18 << "\" text-anchor=\"middle\">"
        << detail::number(t) << "</text>\n";
  }
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\"" << plot_h
      << "\" fill=\"none\" stroke=\"black\"/>\n"
      << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << height - 14 << "\" text-anchor=\"middle\">"
      << detail::xml_escape(x_label) << "</text>\n"
      << "<text transform=\"translate(18 " << top + plot_h / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
      << detail::xml_escape(y_label) << "</text>\n";
  if (zero_line)
    svg << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << py(0) << "\" y2=\"" << py(0)
        << "\" stroke=\"black\" stroke-width=\"1\"/>\n";
  for (std::size_t s = 0; s < series.size(); ++s) {
    const char* colour = colours[s % n_colours];
    const char* dash = dashes[(s / n_colours) % (sizeof dashes / sizeof *dashes)];
    const std::size_t n = series[s].y.size(), stride = std::max<std::size_t>(1, n / 600);  // at most ~600 points
    const std::vector<double>&low = series[s].low, &high = series[s].high;
    if (!low.empty() && low.size() == n && high.size() == n) {  // the band: along high, back along low
      svg << "<polygon fill=\"" << colour << "\" fill-opacity=\"0.15\" stroke=\"none\" points=\"";
      for (std::size_t i = 0; i < n; i += stride)
        if (std::isfinite(high[i])) svg << px(static_cast<double>(i)) << "," << py(high[i]) << " ";
      for (std::size_t i = (n - 1) / stride * stride + 1; i-- > 0;)
        if (i % stride == 0 && std::isfinite(low[i])) svg << px(static_cast<double>(i)) << "," << py(low[i]) << " ";
      svg << "\"/>\n";
    }
    svg << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"1.6\"" << dash << " points=\"";
    for (std::size_t i = 0; i < n; i += stride)
      if (std::isfinite(series[s].y[i])) svg << px(static_cast<double>(i)) << "," << py(series[s].y[i]) << " ";
    const double ly = top + 12 + 20 * static_cast<double>(s), lx = left + plot_w + 15;
    svg << "\"/>\n<line x1=\"" << lx << "\" x2=\"" << lx + 24 << "\" y1=\"" << ly << "\" y2=\"" << ly << "\" stroke=\""
        << colour << "\" stroke-width=\"3\"" << dash << "/>\n<text x=\"" << lx + 30 << "\" y=\"" << ly + 4 << "\">"
        << detail::xml_escape(series[s].name) << "</text>\n";
  }
  svg << "</svg>\n";
  std::ofstream out(path);
  if (!(out << svg.str())) throw std::runtime_error("cannot write " + path);
}

}  // namespace smoe
