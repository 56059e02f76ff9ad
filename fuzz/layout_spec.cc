// A --layout spec (plan-model --layout's syntax, pipeline layout included)
// decoded (LayoutFromSpec) and, when it decodes, evaluated on a small
// 8-layer MoE model with an MTP layer as plan-model --layout does
// (AnswerPlanModel: the layout's rules, its chunks planned, the pipeline
// simulated). A layout that evaluates must read back as the same layout.
#include <cstdlib>
#include <string>

#include "fuzz_util.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"

namespace {

constexpr std::string_view kModel = R"({
  "name": "fuzz-8", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
  "ffn_hidden_size": 1024, "seq_length": 256, "micro_batch_size": 1, "global_batch_size": 64,
  "vocab_size": 1024, "bytes_per_element": 2, "mtp_num_layers": 1, "attention_backend": "flash",
  "moe": {"layer_freq": 2, "num_experts": 16, "top_k": 2, "expert_ffn_hidden_size": 512,
          "capacity_factor": 1.0, "gate": "GATE_TOP_K"}
})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeplan;
  absl::StatusOr<v1::Layout> layout = proto::LayoutFromSpec(fuzz::View(data, size));
  if (!layout.ok()) return 0;
  v1::PlanModelRequest request;
  if (!proto::ParseJson(kModel, request.mutable_model()).ok()) std::abort();
  *request.mutable_layout() = *layout;
  const planner::CostModel& cost = fuzz::DefaultCost();
  planner::ModelPlanner planner(cost);
  v1::PlanModelResponse response;
  if (!requests::AnswerPlanModel(request, planner, cost.profile(), &response).ok()) return 0;
  // What came back is the layout asked for (its pipeline layout written out).
  if (response.candidates_size() != 1) std::abort();
  const v1::Layout& back = response.candidates(0).layout();
  if (back.dp() != layout->dp() || back.tp() != layout->tp() || back.pp() != layout->pp() ||
      back.a2a_overlap() != layout->a2a_overlap() ||
      back.overlap_param_gather() != layout->overlap_param_gather() ||
      back.tp_comm_overlap() != layout->tp_comm_overlap()) {
    std::abort();
  }
  if (layout->pipeline_model_parallel_layout().empty() !=
      back.pipeline_model_parallel_layout().empty()) {
    std::abort();
  }
  return 0;
}
