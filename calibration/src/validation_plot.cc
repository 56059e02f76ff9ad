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

std::string PlotData(const v1::ValidationSummary& s) {
  const std::vector<std::string> candidates = CandidatesOf(s);
  const std::string_view noun = CandidateNoun(s.models());
  std::string data;
  auto out = std::back_inserter(data);
  fmt::format_to(out, "# moeplan validation, profile {}: predicted vs measured {}\n",
                 DataText(s.profile()), TimeLabel(s));
  fmt::format_to(out, "# one block per {} (gnuplot index 0, 1, ...):", noun);
  for (const std::string& cand : candidates) fmt::format_to(out, " {}", DataText(cand));
  fmt::format_to(out, "\n# {} measured_ms predicted_ms config_name\n", noun);
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    // Two blank lines end a block: that is what gnuplot's `index` counts.
    if (i > 0) data += "\n\n";
    for (const v1::ValidationConfig& c : s.results()) {
      const v1::ValidationPoint* p = PointOf(c, candidates[i]);
      if (p == nullptr) continue;
      fmt::format_to(out, "{} {:.6g} {:.6g} \"{}\"\n", DataText(p->candidate()),
                     p->measured_us() / 1000.0, p->predicted_us() / 1000.0, DataText(c.name()));
    }
  }
  return data;
}

std::string GnuplotScript(const v1::ValidationSummary& s, const std::string& data_file,
                          const std::string& png_file) {
  const std::vector<std::string> candidates = CandidatesOf(s);
  // Equal x and y ranges around every point, so y = x is the diagonal.
  double lo = 0.0;
  double hi = 0.0;
  for (const v1::ValidationConfig& c : s.results()) {
    for (const v1::ValidationPoint& p : c.points()) {
      for (double us : {p.measured_us(), p.predicted_us()}) {
        if (!(us > 0.0)) continue;  // not drawable on a log axis
        const double ms = us / 1000.0;
        lo = lo == 0.0 ? ms : std::min(lo, ms);
        hi = std::max(hi, ms);
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
  gp += "# moeplan validation scatter plot; run as `gnuplot <this file>`.\n";
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
  fmt::format_to(out, "set title {}\n",
                 GnuplotString(Cat("moeplan validation (profile ", s.profile(), ", ", s.ranks(),
                                   " ranks): predicted vs measured iteration time")));
  fmt::format_to(out, "set xlabel {}\nset ylabel {}\nset logscale xy\n",
                 GnuplotString(Cat("measured ", TimeLabel(s), " (ms)")),
                 GnuplotString(Cat("predicted ", TimeLabel(s), " (ms)")));
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
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    fmt::format_to(out,
                   ", \\\n     data_file index {} using 2:3 with points pt {} ps 1.3 lc rgb '{}' "
                   "title {}",
                   i, kPointTypes[i % std::size(kPointTypes)], kColours[i % std::size(kColours)],
                   GnuplotString(candidates[i]));
  }
  // Closing the output flushes the PNG before gnuplot exits.
  gp += "\nset output\n";
  return gp;
}

}  // namespace moeplan::calibration
