// Answering the service's planning requests (requests/README.md): the layer
// between the codec (moeplan/proto/convert.h) and its callers — the server,
// the CLI, the executor, refits, the PyTorch extension. Each request is
// converted, validated once with its fields named as the request names them
// ("layer.", "model.", "options.", "layout.", "search.", "memory."), planned,
// and its response filled.
#pragma once

#include "absl/status/status.h"
#include "moeplan/planner/limits.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/profile.h"
#include "moeplan/planner/types.h"
#include "moeplan/v1/model.pb.h"
#include "moeplan/v1/plan.pb.h"

namespace moeplan::requests {

// Answers a PlanLayerRequest with `planner` (built on the request's profile,
// `profile`): converts and validates the layer and schedules, plans, and fills
// `out`. The caller resolves the request's profile. Errors: InvalidArgument
// naming the field (prefixed "layer." for layer fields).
absl::Status AnswerPlanLayer(const v1::PlanLayerRequest& request, planner::LayerPlanner& planner,
                             const planner::ClusterProfile& profile, v1::PlanLayerResponse* out);
// The same for a layer already converted with LayerFromProto (request.layer()
// is then not read; schedules and include_timeline are). `kept`, when given,
// receives the plan itself (its op graphs: a caller that also replays a run
// of it need not plan again).
absl::Status AnswerPlanLayer(const planner::LayerConfig& layer, const v1::PlanLayerRequest& request,
                             planner::LayerPlanner& planner, const planner::ClusterProfile& profile,
                             v1::PlanLayerResponse* out, planner::LayerPlan* kept = nullptr);

// Answers a PlanModelRequest with `planner` (built on the resolved `profile`).
// With `search` or `layout` set, the layout modes (candidates[]); else the
// variants plan of model.parallel.
// The model is validated once here (ValidateModelShape for the layout modes,
// ValidateModel inside ModelPlanner::Plan for the variants plan); the
// planner below trusts it. Errors: InvalidArgument "model.<field>: ...", "options.<field>: ...",
// "layout.<field>: ...", "search.<field>: ..." or "memory.<field>: ...";
// ResourceExhausted past a limit of planner/limits.h; DeadlineExceeded once
// `deadline` passes.
absl::Status AnswerPlanModel(const v1::PlanModelRequest& request, planner::ModelPlanner& planner,
                             const planner::ClusterProfile& profile, v1::PlanModelResponse* out,
                             planner::Deadline deadline = {});
// The same for a model already converted with ModelFromProto. `kept`, when
// given, receives the variants plan itself (left empty by the layout modes).
absl::Status AnswerPlanModel(const planner::ModelConfig& model, const v1::PlanModelRequest& request,
                             planner::ModelPlanner& planner, const planner::ClusterProfile& profile,
                             v1::PlanModelResponse* out, planner::Deadline deadline = {},
                             planner::ModelPlan* kept = nullptr);

}  // namespace moeplan::requests
