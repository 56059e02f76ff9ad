// Comparing what two schedules computed on the same seeded inputs (host side,
// per rank; callers reduce over ranks).
#pragma once

#include <string>
#include <vector>

#include "moeplan/executor/runner.h"

namespace moeplan::executor {

struct TensorDiff {
  std::string tensor;         // y, dx, dgate, dw1, dw2
  double max_abs_diff = 0.0;  // max |got - ref|
  double max_abs_ref = 0.0;   // max |ref|
};

// y, dx, dgate, dw1, dw2 of `got` against `ref` (same layer and rank).
std::vector<TensorDiff> CompareResults(const LayerResults& ref, const LayerResults& got);

// (token, choice) pairs the rank's routing dropped.
int64_t DroppedChoices(const LayerResults& r);

// Whether the routing of `got` equals `ref`'s on the tokens both gated: the
// same experts in the same order, and (when `slots` is set) the same slots.
bool SameRouting(const LayerResults& ref, const LayerResults& got, int64_t top_k, bool slots);

}  // namespace moeplan::executor
