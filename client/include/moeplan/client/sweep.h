// `moeplan sweep`: plan every config of a grid and summarise which schedule wins
// and by how much.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/types.h"
#include "moeplan/v1/layer.pb.h"

namespace moeplan::client {

struct SweepOptions {
  std::vector<planner::Schedule> schedules;  // empty: all three
  // Skip configs that fail validation (counted per reason) instead of failing.
  bool skip_invalid = false;
};

struct SweepRow {
  size_t index = 0;  // position in the grid's expansion
  planner::LayerConfig layer;
  // Total (forward + backward) per schedule, indexed by Schedule; < 0: not planned.
  double total_us[planner::kNumSchedules] = {-1.0, -1.0, -1.0};
  planner::Schedule best = planner::Schedule::kDefault;
  double speedup_vs_default = 0.0;  // default total / best total; 0 if default not planned
  double margin_pct = 0.0;          // best's lead over the runner-up, % of the runner-up
};

struct SweepResult {
  std::vector<SweepRow> rows;
  size_t configs = 0;  // in the grid
  size_t skipped = 0;
  std::map<std::string, size_t> skip_reasons;  // rule text -> count
};

// Plans every config. Without skip_invalid the first invalid config fails the
// sweep: InvalidArgument "config #<i> (<name>): <field>: <rule> ...".
absl::StatusOr<SweepResult> RunSweep(const std::vector<v1::LayerConfig>& configs,
                                     const planner::CostModel& cost, const SweepOptions& options);

// One header line and one row per planned config.
std::string SweepCsv(const SweepResult& result);

// Counts of each chosen schedule and min / median / max speedup of the chosen
// schedule over default, as text lines.
std::string SweepSummary(const SweepResult& result);

}  // namespace moeplan::client
