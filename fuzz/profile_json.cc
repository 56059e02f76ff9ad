// A profile file (moeplan.v1.ClusterProfile JSON) decoded, validated, and a
// small layer and model planned against it, as PutProfile and an inline
// profile in a request are.
#include "fuzz_util.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/validate.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeplan;
  v1::ClusterProfile msg;
  if (!proto::ParseJson(fuzz::View(data, size), &msg).ok()) return 0;
  auto profile = proto::ProfileFromProto(msg);
  if (!profile.ok()) return 0;
  auto cost = planner::CostModel::Create(*profile);
  if (!cost.ok()) return 0;
  // A layer that fits any cluster of at least one node of 2 GPUs.
  planner::LayerConfig layer;
  layer.batch_size = 8;
  layer.seq_len = 128;
  layer.model_dim = 256;
  layer.hidden_dim = 1024;
  layer.num_experts = 8;
  layer.top_k = 2;
  layer.capacity_factor = 1.0;
  layer.parallel = {.mp = 1, .ep = 2, .esp = 1, .dp = 2, .pp = 1};
  if (planner::ValidateLayer(layer, profile->shape).ok()) {
    planner::LayerPlanner planner(*cost);
    v1::PlanLayerRequest request;
    request.set_include_timeline(true);
    v1::PlanLayerResponse response;
    (void)requests::AnswerPlanLayer(layer, request, planner, *profile, &response);
  }
  return 0;
}
