// Quantities for people (reports, warnings, labels): one rendering of each
// unit across the CLI, the profiler and the calibration reports. Machine
// output (JSON, CSV) keeps plain numbers.
#pragma once

#include <string>

namespace moeplan {

// Binary units, 4 significant digits, no trailing zeros: "0 B", "512 B",
// "1 KiB", "1.5 KiB", "33.69 MiB", "256 MiB", "1.25 TiB".
std::string FormatBytes(double bytes);

// Decimal units of floating-point operations: "512 flop", "2.097 Mflop",
// "1.1 Tflop".
std::string FormatFlops(double flops);

// Microseconds in the largest unit below 1000 of it: "850 ns", "12.5 us",
// "3.2 ms", "1.5 s" (4 significant digits).
std::string FormatDuration(double us);

// A ratio as a percentage: whole percents from 10 % ("47 %"), one decimal
// below ("4.5 %").
std::string FormatPercent(double ratio);

}  // namespace moeplan
