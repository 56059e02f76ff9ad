#include "moeplan/base/format.h"

#include <fmt/format.h>

#include <cmath>
#include <string_view>

namespace moeplan {
namespace {

// `v` divided by `step` until below it (at most to the last unit), with 4
// significant digits and the unit.
template <size_t N>
std::string Scaled(double v, double step, const std::string_view (&units)[N]) {
  size_t u = 0;
  while (std::abs(v) >= step && u + 1 < N) {
    v /= step;
    ++u;
  }
  return fmt::format("{:.4g} {}", v, units[u]);
}

}  // namespace

std::string FormatBytes(double bytes) {
  static constexpr std::string_view kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  return Scaled(bytes, 1024.0, kUnits);
}

std::string FormatFlops(double flops) {
  static constexpr std::string_view kUnits[] = {"flop",  "kflop", "Mflop",
                                                "Gflop", "Tflop", "Pflop"};
  return Scaled(flops, 1000.0, kUnits);
}

std::string FormatDuration(double us) {
  if (std::abs(us) < 1.0 && us != 0.0) return fmt::format("{:.4g} ns", us * 1e3);
  static constexpr std::string_view kUnits[] = {"us", "ms", "s"};
  return Scaled(us, 1000.0, kUnits);
}

std::string FormatPercent(double ratio) {
  return std::abs(ratio) >= 0.1 ? fmt::format("{:.0f} %", ratio * 100.0)
                                : fmt::format("{:.1f} %", ratio * 100.0);
}

}  // namespace moeplan
