// The layout search's options, checked before anything is enumerated
// (layout_planner.h ValidateSearchOptions): each rule names its search.<field>.
#include <algorithm>
#include <cstddef>
#include <string_view>
#include <utility>
#include <vector>

#include "field_rules.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/layout_planner.h"

namespace moeplan::planner {

using internal::Bad;

absl::Status ValidateSearchOptions(const SearchOptions& o) {
  if (o.top < 1 || o.top > 1000) return Bad("search.top", "must be between 1 and 1000", Cat(o.top));
  if (o.record_pipelines < 0 || o.record_pipelines > 1000) {
    return Bad("search.timeline_top", "must be between 0 and 1000", Cat(o.record_pipelines));
  }
  if (o.gpus < 0 || o.gpus > (1 << 20)) {
    return Bad("search.gpus", "must be between 1 and 2^20 (0: the profile's)", Cat(o.gpus));
  }
  for (int z : o.zero_stages) {
    if (z < 0 || z > 3) return Bad("search.zero_stages", "each must be 0, 1, 2 or 3", Cat(z));
  }
  if (o.max_microbatches < 1 || o.max_microbatches > 4096) {
    return Bad("search.max_microbatches", "must be between 1 and 4096", Cat(o.max_microbatches));
  }
  for (const auto& [field, values] : {std::pair<std::string_view, const std::vector<bool>*>{
                                          "search.sequence_parallel", &o.sequence_parallel},
                                      {"search.a2a_overlap", &o.a2a_overlap},
                                      {"search.balanced_pipeline", &o.balanced_pipeline}}) {
    if (values->size() > 2 || (values->size() == 2 && (*values)[0] == (*values)[1])) {
      return Bad(field, "each of false and true may be listed once",
                 Cat(values->size(), " values"));
    }
  }
  std::vector<Dispatcher> listed = o.dispatchers;
  std::sort(listed.begin(), listed.end());
  if (std::adjacent_find(listed.begin(), listed.end()) != listed.end()) {
    return Bad("search.dispatchers", "each of alltoall, deepep and allgather may be listed once",
               Cat(o.dispatchers.size(), " values"));
  }
  for (const auto& [field, list] : {std::pair<std::string_view, const std::vector<int>*>{
                                        "search.context_parallel", &o.context_parallel},
                                    {"search.expert_tensor_parallel", &o.expert_tensor_parallel}}) {
    for (size_t i = 0; i < list->size(); ++i) {
      const int d = (*list)[i];
      if (d < 1 || d > 1024) return Bad(field, "each must be between 1 and 1024", Cat(d));
      if (std::find(list->begin(), list->begin() + static_cast<ptrdiff_t>(i), d) !=
          list->begin() + static_cast<ptrdiff_t>(i)) {
        return Bad(field, "each may be listed once", Cat(d, " twice"));
      }
    }
  }
  if (!o.expert_tensor_parallel.empty() &&
      std::find(o.sequence_parallel.begin(), o.sequence_parallel.end(), true) ==
          o.sequence_parallel.end()) {
    return Bad("search.expert_tensor_parallel",
               "folded expert grids run with sequence parallelism, which the search must try "
               "(search.sequence_parallel with true; --sequence-parallel on or both)",
               Cat(o.expert_tensor_parallel.size(), " degrees"));
  }
  if (o.virtual_stages.empty()) return Bad("search.virtual_stages", "must not be empty", "[]");
  for (int v : o.virtual_stages) {
    if (v < 2 || v > 64)
      return Bad("search.virtual_stages", "each must be between 2 and 64", Cat(v));
  }
  return absl::OkStatus();
}

}  // namespace moeplan::planner
