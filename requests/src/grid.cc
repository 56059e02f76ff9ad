// Layer grids expanded into their configs (requests/README.md).
#include "moeplan/requests/grid.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/proto/convert.h"

namespace moeplan::requests {

using proto::CheckName;

absl::StatusOr<std::vector<v1::LayerConfig>> ExpandGrid(const v1::LayerGrid& g,
                                                        size_t max_configs) {
  if (g.schema_version() > 1) {
    return absl::InvalidArgumentError(
        Cat("schema_version: must be 1 (got ", g.schema_version(), ")"));
  }
  struct Axis {
    const char* field;
    int size;
  };
  const int bpe = g.bytes_per_element_size() ? g.bytes_per_element_size() : 1;
  const int skew = g.token_skew_size() ? g.token_skew_size() : 1;
  const int dropless = g.dropless_size() ? g.dropless_size() : 1;
  // Dropless layers have no capacity: a grid of only dropless configs may
  // leave capacity_factor out (the configs leave it unset).
  const bool all_dropless =
      g.dropless_size() > 0 &&
      std::all_of(g.dropless().begin(), g.dropless().end(), [](bool d) { return d; });
  const int cf = g.capacity_factor_size() ? g.capacity_factor_size() : (all_dropless ? 1 : 0);
  const Axis axes[] = {{"batch_size", g.batch_size_size()},
                       {"seq_len", g.seq_len_size()},
                       {"model_dim", g.model_dim_size()},
                       {"hidden_dim", g.hidden_dim_size()},
                       {"num_experts", g.num_experts_size()},
                       {"top_k", g.top_k_size()},
                       {"capacity_factor", cf},
                       {"bytes_per_element", bpe},
                       {"token_skew", skew},
                       {"parallel", g.parallel_size()},
                       {"dropless", dropless}};
  MOEPLAN_RETURN_IF_ERROR(CheckName(g.name()));
  size_t total = 1;
  for (const Axis& a : axes) {
    if (a.size == 0) {
      return absl::InvalidArgumentError(
          Cat(a.field, ": a grid needs at least one value (got an empty list)",
              a.size == cf && a.field == std::string_view("capacity_factor")
                  ? "; only a grid whose dropless values are all true may leave it out"
                  : ""));
    }
    total *= static_cast<size_t>(a.size);
    if (total > max_configs) {
      return absl::InvalidArgumentError(
          Cat(a.field, ": the grid's product of list lengths exceeds the limit of ", max_configs,
              " configs"));
    }
  }
  std::vector<v1::LayerConfig> out;
  out.reserve(total);
  int idx[11] = {};
  for (size_t n = 0; n < total; ++n) {
    v1::LayerConfig c;
    c.set_schema_version(1);
    c.set_name(Cat(g.name().empty() ? "grid" : g.name(), "#", n));
    c.set_batch_size(g.batch_size(idx[0]));
    c.set_seq_len(g.seq_len(idx[1]));
    c.set_model_dim(g.model_dim(idx[2]));
    c.set_hidden_dim(g.hidden_dim(idx[3]));
    c.set_num_experts(g.num_experts(idx[4]));
    c.set_top_k(g.top_k(idx[5]));
    if (g.capacity_factor_size()) c.set_capacity_factor(g.capacity_factor(idx[6]));
    if (g.bytes_per_element_size()) c.set_bytes_per_element(g.bytes_per_element(idx[7]));
    if (g.token_skew_size()) c.set_token_skew(g.token_skew(idx[8]));
    *c.mutable_parallel() = g.parallel(idx[9]);
    if (g.dropless_size()) c.set_dropless(g.dropless(idx[10]));
    out.push_back(std::move(c));
    // Odometer increment, last axis fastest.
    for (int a = 10; a >= 0; --a) {
      if (++idx[a] < axes[a].size) break;
      idx[a] = 0;
    }
  }
  return out;
}

}  // namespace moeplan::requests
