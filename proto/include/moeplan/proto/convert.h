// Conversion between moeplan.v1 messages and planner types: the boundary where
// files and RPCs meet the pure planner. FromProto applies defaults for unset
// optional fields and the planner's validation; ToProto fills responses.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/profile.h"
#include "moeplan/planner/types.h"
#include "moeplan/v1/layer.pb.h"
#include "moeplan/v1/model.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "moeplan/v1/profile.pb.h"

namespace moeplan::proto {

// Checks schema_version and converts; does not run planner validation (which
// needs the cluster): LayerPlanner::Plan does.
absl::StatusOr<planner::LayerConfig> LayerFromProto(const v1::LayerConfig& msg);
v1::LayerConfig LayerToProto(const planner::LayerConfig& layer);

// The layout of a layer or model: pp unset is 1, dp unset is ep*esp/mp.
absl::StatusOr<planner::ParallelLayout> ParallelFromProto(const v1::ParallelLayout& msg);

// Converts and runs planner::ValidateProfile.
absl::StatusOr<planner::ClusterProfile> ProfileFromProto(const v1::ClusterProfile& msg);

// Enum conversions. FromProto rejects UNSPECIFIED and unknown values with
// InvalidArgument ("schedules: ..."; the collective's message starts with
// `field`). Labels are the planner's lower-case names ("s2", "alltoall"), or
// "unspecified", for reports that must print whatever a file holds.
v1::Schedule ScheduleToProto(planner::Schedule s);
absl::StatusOr<planner::Schedule> ScheduleFromProto(v1::Schedule s);
std::string_view ScheduleLabel(v1::Schedule s);
v1::Collective CollectiveToProto(planner::Collective c);
absl::StatusOr<planner::Collective> CollectiveFromProto(v1::Collective c,
                                                        std::string_view field = "collective");
std::string_view CollectiveLabel(v1::Collective c);

// Fills a response from a plan (ops only with include_timeline).
void PlanToProto(const planner::LayerPlan& plan, const planner::ClusterProfile& profile,
                 bool include_timeline, v1::PlanLayerResponse* out);

// Answers a PlanLayerRequest with `planner` (built on the request's profile,
// `profile`): converts and validates the layer and schedules, plans, and fills
// `out`. The caller resolves the request's profile. Errors: InvalidArgument
// naming the field (prefixed "layer." for layer fields).
absl::Status AnswerPlanLayer(const v1::PlanLayerRequest& request, planner::LayerPlanner& planner,
                             const planner::ClusterProfile& profile, v1::PlanLayerResponse* out);
// The same for a layer already converted with LayerFromProto (request.layer()
// is then not read; schedules and include_timeline are).
absl::Status AnswerPlanLayer(const planner::LayerConfig& layer, const v1::PlanLayerRequest& request,
                             planner::LayerPlanner& planner, const planner::ClusterProfile& profile,
                             v1::PlanLayerResponse* out);

// Expands a grid into its configs (cartesian product in field order). Checks that
// every list is non-empty and the product is at most `max_configs`.
absl::StatusOr<std::vector<v1::LayerConfig>> ExpandGrid(const v1::LayerGrid& grid,
                                                        size_t max_configs = 1'000'000);

// ---- Whole models (docs/model.md) ----

// Checks schema_version and the gate, converts (defaults for unset fields);
// planner::ValidateModel runs in ModelPlanner::Plan.
absl::StatusOr<planner::ModelConfig> ModelFromProto(const v1::ModelConfig& msg);
v1::ModelConfig ModelToProto(const planner::ModelConfig& model);
// Options with defaults for unset fields, validated; errors "options.<field>: ...".
absl::StatusOr<planner::ModelPlanOptions> ModelOptionsFromProto(const v1::ModelPlanOptions& msg);
v1::OverlapVariant VariantToProto(planner::Variant v);
v1::AllToAllAlgorithm AllToAllAlgoToProto(planner::AllToAllAlgo a);
std::string_view AllToAllAlgoLabel(v1::AllToAllAlgorithm a);  // "linear", "2dh"

// Fills a response (speedups over none and the best tutel when planned; ops
// only with include_timeline).
void ModelPlanToProto(const planner::ModelPlan& plan, const planner::ModelConfig& model,
                      const planner::ClusterProfile& profile, bool include_timeline,
                      v1::PlanModelResponse* out);

// The request that plans `ran`, one variant of a plan of `model`, again: its
// variant, MoE schedule, AlltoAll algorithm and Tutel degree pinned; partition
// ranges and dW placement are planned anew (on an unchanged profile: as they
// were). InvalidArgument "variant: ..." when `ran` names no variant.
absl::StatusOr<v1::PlanModelRequest> PinnedModelRequest(const v1::ModelConfig& model,
                                                        const v1::VariantPlan& ran);

// How `planned` differs from `ran` (a variant plan that ran or was saved):
// the first of schedule, Tutel degree, partition ranges, dW placements and
// ops (names in order where both have them, else their count) that differ;
// empty when it is the same plan.
std::string PlanDifference(const v1::VariantPlan& ran, const v1::VariantPlan& planned);

// Layouts (docs/layouts.md). Empty family / pipeline are inferred; errors
// "layout.<field>: ..." / "search.<field>: ...".
absl::StatusOr<planner::Layout> LayoutFromProto(const v1::Layout& msg);
// The --layout flag of plan-model and moeplan-exec:
// "dp=8,tp=4,pp=2,ep=8,esp=4[,microbatches=8,zero=1,family=..,pipeline=..,v=2,recompute=1]";
// errors name --layout and the key.
absl::StatusOr<v1::Layout> LayoutFromSpec(std::string_view spec);
v1::Layout LayoutToProto(const planner::Layout& layout, int64_t micro_batch_size);
planner::MemoryOptions MemoryFromProto(const v1::MemoryOptions& msg);
absl::StatusOr<planner::SearchOptions> SearchFromProto(const v1::SearchOptions& msg);
void CandidateToProto(const planner::LayoutCandidate& c, int rank, v1::LayoutCandidate* out);

// Answers a PlanModelRequest with `planner` (built on the resolved `profile`).
// With `search` or `layout` set, the layout modes (candidates[]); else the
// variants plan of model.parallel.
// Errors: InvalidArgument "model.<field>: ...", "options.<field>: ...",
// "layout.<field>: ...", "search.<field>: ..." or "memory.<field>: ...";
// ResourceExhausted past a limit of planner/limits.h; DeadlineExceeded once
// `deadline` passes.
absl::Status AnswerPlanModel(const v1::PlanModelRequest& request, planner::ModelPlanner& planner,
                             const planner::ClusterProfile& profile, v1::PlanModelResponse* out,
                             planner::Deadline deadline = {});
// The same for a model already converted with ModelFromProto.
absl::Status AnswerPlanModel(const planner::ModelConfig& model, const v1::PlanModelRequest& request,
                             planner::ModelPlanner& planner, const planner::ClusterProfile& profile,
                             v1::PlanModelResponse* out, planner::Deadline deadline = {});

}  // namespace moeplan::proto
