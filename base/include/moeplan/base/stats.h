// Small statistics over samples (timings, errors). Each takes its values by
// value where it must reorder them: pass an rvalue to avoid the copy.
#pragma once

#include <span>
#include <vector>

namespace moeplan {

// The middle value; the mean of the two middle values for an even count.
// 0 for no values (callers that must tell "none" apart check first).
double Median(std::vector<double> values);

// The p-th percentile, 0 <= p <= 100 (clamped), interpolated linearly between
// order statistics (numpy.percentile's default: rank p/100 * (n - 1) on the
// sorted values). 0 for no values.
double Percentile(std::vector<double> values, double p);

// The arithmetic mean; 0 for no values.
double Mean(std::span<const double> values);

}  // namespace moeplan
