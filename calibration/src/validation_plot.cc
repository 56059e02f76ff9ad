// `moeplan validate`'s scatter plot: the data file and the gnuplot script.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <string_view>

#include "moeplan/base/strings.h"
#include "moeplan/calibration/validation.h"
#include "validation_internal.h"

namespace moeplan::calibration {
namespace {

using internal::CandidateNoun;
using internal::CandidatesOf;
using internal::PointOf;

// A gnuplot string expression equal to `text`. Single-quoted strings take
// everything literally (no backslash escapes, no backquote command
// substitution, which double-quoted strings would run) except that a quote is
// doubled; a line break cannot appear inside one, so it is concatenated in as
// "\n" / "\r".
std::string GnuplotString(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "''";
    } else if (c == '\n') {
      out += "'.\"\\n\".'";
    } else if (c == '\r') {
      out += "'.\"\\r\".'";
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

// Text for a data-file comment or quoted column: one line, no double quote
// (gnuplot's data-file quoting has no escape).
std::string DataText(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\n' || c == '\r') {
      out += ' ';
    } else if (c == '"') {
      out += '\'';
    } else {
      out += c;
    }
  }
  return out;
}

// Tic marks for a log axis over [lo, hi]: gnuplot labels only the powers of
// ten, which leaves a range inside one decade with one label or none. 1-2-5
// steps, or every 1..9 step when that gives fewer than three; "" (gnuplot's
// own) when the range spans so many decades that powers of ten are enough.
std::string LogTics(double lo, double hi) {
  if (!(lo > 0.0) || !(hi > lo) || std::log10(hi / lo) > 3.0) return "";
  auto list = [&](std::initializer_list<int> mantissas) {
    std::vector<double> v;
    for (int e = static_cast<int>(std::floor(std::log10(lo)));
         e <= static_cast<int>(std::ceil(std::log10(hi))); ++e) {
      for (int m : mantissas) {
        const double t = m * std::pow(10.0, e);
        if (t >= lo && t <= hi) v.push_back(t);
      }
    }
    return v;
  };
  std::vector<double> tics = list({1, 2, 5});
  if (tics.size() < 3) tics = list({1, 2, 3, 4, 5, 6, 7, 8, 9});
  std::string out;
  for (double t : tics) out += fmt::format("{}{:.6g}", out.empty() ? "" : ", ", t);
  return out;
}

// What the totals are: a layer's forward + backward, a model's iteration.
std::string_view TimeLabel(const v1::ValidationSummary& s) {
  return s.models() ? "training iteration time" : "forward + backward time";
}

}  // namespace

std::string ScatterData(const Scatter& p) {
  std::string data;
  auto out = std::back_inserter(data);
  fmt::format_to(out, "# {}\n", DataText(p.comment));
  fmt::format_to(out, "# one block per {} (gnuplot index 0, 1, ...):", DataText(p.series_noun));
  for (const ScatterSeries& series : p.series) fmt::format_to(out, " {}", DataText(series.name));
  fmt::format_to(out, "\n# {} {} {} {}\n", DataText(p.series_noun), DataText(p.x_column),
                 DataText(p.y_column), DataText(p.label_column));
  for (std::size_t i = 0; i < p.series.size(); ++i) {
    // Two blank lines end a block: that is what gnuplot's `index` counts.
    if (i > 0) data += "\n\n";
    for (const ScatterPoint& q : p.series[i].points) {
      fmt::format_to(out, "{} {:.6g} {:.6g} \"{}\"\n", DataText(p.series[i].name), q.x, q.y,
                     DataText(q.label));
    }
  }
  return data;
}

std::string ScatterScript(const Scatter& p, const std::string& data_file,
                          const std::string& png_file) {
  // Equal x and y ranges around every point, so y = x is the diagonal.
  double lo = 0.0;
  double hi = 0.0;
  for (const ScatterSeries& series : p.series) {
    for (const ScatterPoint& q : series.points) {
      for (double v : {q.x, q.y}) {
        if (!(v > 0.0)) continue;  // not drawable on a log axis
        lo = lo == 0.0 ? v : std::min(lo, v);
        hi = std::max(hi, v);
      }
    }
  }
  if (hi == 0.0) {
    lo = 0.01;
    hi = 100.0;
  } else {
    lo /= 1.25;
    hi *= 1.25;
  }

  std::string gp;
  auto out = std::back_inserter(gp);
  fmt::format_to(out, "# {} scatter plot; run as `gnuplot <this file>`.\n",
                 DataText(p.script_noun));
  fmt::format_to(out, "data_file = {}\npng_file = {}\n", GnuplotString(data_file),
                 GnuplotString(png_file));
  // Debian's gnuplot-nox 5.4 has pngcairo (it links cairo/pango), but other
  // builds may only have libgd's png: pick whichever this gnuplot has.
  gp +=
      "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
      "  set terminal pngcairo size 900,700 noenhanced font 'sans,10'\n"
      "} else {\n"
      "  set terminal png size 900,700 noenhanced\n"
      "}\n"
      "set output png_file\n";
  fmt::format_to(out, "set title {}\n", GnuplotString(p.title));
  fmt::format_to(out, "set xlabel {}\nset ylabel {}\nset logscale xy\n", GnuplotString(p.x_label),
                 GnuplotString(p.y_label));
  fmt::format_to(out, "set xrange [{0:.6g}:{1:.6g}]\nset yrange [{0:.6g}:{1:.6g}]\n", lo, hi);
  const std::string tics = LogTics(lo, hi);
  if (!tics.empty()) fmt::format_to(out, "set xtics ({0})\nset ytics ({0})\n", tics);
  gp +=
      "set size square\n"
      "set grid\n"
      "set key top left box opaque\n"
      "plot x with lines lc rgb 'black' title 'y = x', \\\n"
      "     1.1*x with lines dt 2 lc rgb 'gray50' title '+10 %', \\\n"
      "     0.9*x with lines dt 2 lc rgb 'gray50' title '-10 %'";
  // Filled circle, square, triangle, diamond, inverted triangle, pentagon, in
  // colours that stay apart on white (gnuplot's third default is a pale yellow).
  constexpr int kPointTypes[] = {7, 5, 9, 13, 11, 15};
  constexpr std::string_view kColours[] = {"#1f77b4", "#d62728", "#2ca02c",
                                           "#9467bd", "#ff7f0e", "#8c564b"};
  for (std::size_t i = 0; i < p.series.size(); ++i) {
    fmt::format_to(out,
                   ", \\\n     data_file index {} using 2:3 with points pt {} ps 1.3 lc rgb '{}' "
                   "title {}",
                   i, kPointTypes[i % std::size(kPointTypes)], kColours[i % std::size(kColours)],
                   GnuplotString(p.series[i].name));
  }
  // Closing the output flushes the PNG before gnuplot exits.
  gp += "\nset output\n";
  return gp;
}

Scatter ValidationScatter(const v1::ValidationSummary& s) {
  Scatter p;
  p.comment =
      Cat("moeplan validation, profile ", s.profile(), ": predicted vs measured ", TimeLabel(s));
  p.series_noun = std::string(CandidateNoun(s.models()));
  p.x_column = "measured_ms";
  p.y_column = "predicted_ms";
  p.label_column = "config_name";
  p.script_noun = "moeplan validation";
  p.title = Cat("moeplan validation (profile ", s.profile(), ", ", s.ranks(),
                " ranks): predicted vs measured iteration time");
  p.x_label = Cat("measured ", TimeLabel(s), " (ms)");
  p.y_label = Cat("predicted ", TimeLabel(s), " (ms)");
  for (const std::string& cand : CandidatesOf(s)) {
    ScatterSeries series;
    series.name = cand;
    for (const v1::ValidationConfig& c : s.results()) {
      const v1::ValidationPoint* q = PointOf(c, cand);
      if (q == nullptr) continue;
      series.points.push_back({q->measured_us() / 1000.0, q->predicted_us() / 1000.0, c.name()});
    }
    p.series.push_back(std::move(series));
  }
  return p;
}

std::string PlotData(const v1::ValidationSummary& s) { return ScatterData(ValidationScatter(s)); }

std::string GnuplotScript(const v1::ValidationSummary& s, const std::string& data_file,
                          const std::string& png_file) {
  return ScatterScript(ValidationScatter(s), data_file, png_file);
}

}  // namespace moeplan::calibration
