// A grid file (moeplan.v1.LayerGrid JSON) decoded and expanded, and its first
// configs validated and planned, as `moeplan sweep` does.
#include "fuzz_util.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/validate.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/grid.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeplan;
  v1::LayerGrid grid;
  if (!proto::ParseJson(fuzz::View(data, size), &grid).ok()) return 0;
  auto configs = requests::ExpandGrid(grid);
  if (!configs.ok()) return 0;
  const planner::CostModel& cost = fuzz::DefaultCost();
  planner::LayerPlanner planner(cost);
  planner::LayerPlan plan;
  size_t planned = 0;
  for (const v1::LayerConfig& msg : *configs) {
    if (++planned > 16) break;  // the expansion is what is fuzzed; a few plans suffice
    auto layer = proto::LayerFromProto(msg);
    if (!layer.ok() || !planner::ValidateLayer(*layer, cost.profile().shape).ok()) continue;
    (void)planner.Plan(*layer, {}, &plan);
  }
  return 0;
}
