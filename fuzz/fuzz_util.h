// Shared by the libFuzzer harnesses (fuzz/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "moeplan/calibration/profiles.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/proto/convert.h"

namespace moeplan::fuzz {

inline std::string_view View(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The built-in default profile's cost model: what a layer or model file is
// planned against when no profile is named.
inline const planner::CostModel& DefaultCost() {
  static const planner::CostModel* cost = [] {
    auto loaded = calibration::LoadProfile(calibration::kDefaultProfileName);
    if (!loaded.ok()) std::abort();
    auto model = planner::CostModel::Create(loaded->profile);
    if (!model.ok()) std::abort();
    return new planner::CostModel(*std::move(model));
  }();
  return *cost;
}

}  // namespace moeplan::fuzz
