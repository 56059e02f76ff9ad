// A layer file (moeplan.v1.LayerConfig JSON) decoded, validated and planned
// with every schedule and the timeline, as `moeplan plan-layer` and the
// server's PlanLayer do.
#include "fuzz_util.h"
#include "moeplan/planner/planner.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeplan;
  v1::PlanLayerRequest request;
  if (!proto::ParseJson(fuzz::View(data, size), request.mutable_layer()).ok()) return 0;
  request.set_include_timeline(true);
  const planner::CostModel& cost = fuzz::DefaultCost();
  planner::LayerPlanner planner(cost);
  v1::PlanLayerResponse response;
  (void)requests::AnswerPlanLayer(request, planner, cost.profile(), &response);
  return 0;
}
