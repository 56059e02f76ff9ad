// The field-rule helpers every validator of the planner shares (private to the
// library): errors are InvalidArgument "<field>: <rule> (got <value>)".
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::planner::internal {

// Largest size of any one dimension: keeps every derived product far inside
// int64 and doubles exact.
inline constexpr int64_t kMaxDim = int64_t{1} << 24;

inline absl::Status Bad(std::string_view field, std::string_view rule, std::string_view got) {
  return absl::InvalidArgumentError(Cat(field, ": ", rule, " (got ", got, ")"));
}

// 0 < v <= kMaxDim.
inline absl::Status CheckDim(std::string_view field, int64_t v) {
  if (v <= 0) return Bad(field, "must be > 0", Cat(v));
  if (v > kMaxDim) return Bad(field, Cat("must be <= ", kMaxDim), Cat(v));
  return absl::OkStatus();
}

}  // namespace moeplan::planner::internal
