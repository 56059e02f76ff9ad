// The inverse of an enum's name function over the list of its values: what
// each planner Parse<Enum> (types.h, layout.h, model.h, model_planner.h) is.
#pragma once

#include <cstddef>
#include <string_view>

namespace moeplan::planner::internal {

// Sets `*out` to the value of `values` whose name_of() is `name`; false
// (`*out` untouched) when none is.
template <typename E, size_t N, typename NameOf>
bool ParseByName(std::string_view name, const E (&values)[N], NameOf name_of, E* out) {
  for (E v : values) {
    if (name_of(v) == name) {
      *out = v;
      return true;
    }
  }
  return false;
}

}  // namespace moeplan::planner::internal
