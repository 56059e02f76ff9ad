// Conversion between moeplan.v1 messages and planner types: the boundary where
// files and RPCs meet the pure planner. FromProto applies defaults for unset
// optional fields and the planner's validation; ToProto fills responses.
// Answering whole requests with these is the requests library's
// (moeplan/requests/answer.h).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/profile.h"
#include "moeplan/planner/types.h"
#include "moeplan/v1/layer.pb.h"
#include "moeplan/v1/model.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "moeplan/v1/profile.pb.h"

namespace moeplan::proto {

// Names are labels copied into every row, config and log line that mentions
// them: at most kMaxNameBytes, so that a name cannot multiply into gigabytes.
// InvalidArgument "name: ...".
inline constexpr size_t kMaxNameBytes = 256;
absl::Status CheckName(const std::string& name);

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
// The model's parameters and FLOPs (planner/accounting.h), MFU's peak from `profile`.
void AccountingToProto(const planner::ModelConfig& model, const planner::ClusterProfile& profile,
                       v1::ModelAccounting* out);
void ModelPlanToProto(const planner::ModelPlan& plan, const planner::ModelConfig& model,
                      const planner::ClusterProfile& profile, bool include_timeline,
                      v1::PlanModelResponse* out);

// Layouts (docs/layouts.md). Empty family / pipeline are inferred; errors
// "layout.<field>: ..." / "search.<field>: ...".
absl::StatusOr<planner::Layout> LayoutFromProto(const v1::Layout& msg);
// The --layout flag of plan-model and moeplan-exec:
// "dp=8,tp=4,pp=2,ep=8,esp=4[,microbatches=8,zero=1,family=..,pipeline=..,v=2,recompute=1]";
// errors name --layout and the key.
absl::StatusOr<v1::Layout> LayoutFromSpec(std::string_view spec);
// The inverse: the spec LayoutFromSpec reads back as `layout` (dp, tp, pp
// always; every other key where it is set; the pipeline layout last). What tools print for a user
// to pass as --layout.
std::string LayoutToSpec(const v1::Layout& layout);
v1::Layout LayoutToProto(const planner::Layout& layout, int64_t micro_batch_size);
planner::MemoryOptions MemoryFromProto(const v1::MemoryOptions& msg);
absl::StatusOr<planner::SearchOptions> SearchFromProto(const v1::SearchOptions& msg);
void CandidateToProto(const planner::LayoutCandidate& c, int rank, v1::LayoutCandidate* out);

}  // namespace moeplan::proto
