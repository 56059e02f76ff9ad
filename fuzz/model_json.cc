// A model file (moeplan.v1.ModelConfig JSON) decoded, validated and planned
// with every overlap variant, as `moeplan plan-model` and PlanModel do.
#include "fuzz_util.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeplan;
  v1::PlanModelRequest request;
  if (!proto::ParseJson(fuzz::View(data, size), request.mutable_model()).ok()) return 0;
  const planner::CostModel& cost = fuzz::DefaultCost();
  planner::ModelPlanner planner(cost);
  v1::PlanModelResponse response;
  (void)requests::AnswerPlanModel(request, planner, cost.profile(), &response);
  return 0;
}
