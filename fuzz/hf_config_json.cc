// A Hugging Face config.json imported (ImportHfConfig: the strict pass, the
// mapping of its model type, moeplan's rules) and, when it imports, planned
// with every overlap variant as `moeplan plan-model --model config.json` does.
// What import-hf writes must read back as a native model file.
#include <cstdlib>

#include "fuzz_util.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/proto/hf_config.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeplan;
  const std::string_view text = fuzz::View(data, size);
  const bool looks = proto::LooksLikeHfConfig(text);
  absl::StatusOr<proto::HfImport> imported = proto::ImportHfConfig(text, {}, "fuzz");
  if (!imported.ok()) return 0;
  if (!looks) std::abort();  // plan-model would have read it as a native file
  absl::StatusOr<std::string> json = proto::ToJson(imported->model);
  v1::PlanModelRequest request;
  if (!json.ok() || proto::LooksLikeHfConfig(*json) ||
      !proto::ParseJson(*json, request.mutable_model()).ok()) {
    std::abort();  // import-hf's output is not a model file plan-model reads
  }
  const planner::CostModel& cost = fuzz::DefaultCost();
  planner::ModelPlanner planner(cost);
  v1::PlanModelResponse response;
  (void)requests::AnswerPlanModel(request, planner, cost.profile(), &response);
  return 0;
}
