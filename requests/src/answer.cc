// Answering PlanLayer and PlanModel requests (requests/README.md): convert,
// validate once, plan, fill the response.
#include "moeplan/requests/answer.h"

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/limits.h"
#include "moeplan/proto/convert.h"
#include "moeplan/requests/launcher_args.h"

namespace moeplan::requests {

namespace p = ::moeplan::planner;

absl::Status AnswerPlanLayer(const v1::PlanLayerRequest& request, p::LayerPlanner& planner,
                             const p::ClusterProfile& profile, v1::PlanLayerResponse* out) {
  if (!request.has_layer()) return absl::InvalidArgumentError("layer: required");
  absl::StatusOr<p::LayerConfig> layer = proto::LayerFromProto(request.layer());
  if (!layer.ok()) return absl::InvalidArgumentError(Cat("layer.", View(layer.status().message())));
  return AnswerPlanLayer(*layer, request, planner, profile, out);
}

absl::Status AnswerPlanLayer(const p::LayerConfig& layer, const v1::PlanLayerRequest& request,
                             p::LayerPlanner& planner, const p::ClusterProfile& profile,
                             v1::PlanLayerResponse* out, p::LayerPlan* kept) {
  std::vector<p::Schedule> schedules;
  schedules.reserve(request.schedules_size());
  for (int i = 0; i < request.schedules_size(); ++i) {
    absl::StatusOr<p::Schedule> s = proto::ScheduleFromProto(request.schedules(i));
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          Cat("schedules[", i, "]: must be SCHEDULE_DEFAULT, SCHEDULE_S1 or SCHEDULE_S2 (got ",
              static_cast<int>(request.schedules(i)), ")"));
    }
    schedules.push_back(*s);
  }
  p::LayerPlan plan;
  // 1-byte elements (FP8) run their GEMMs at the profile's FP8 peak.
  std::optional<p::CostModel> fp8;
  std::optional<p::LayerPlanner> fp8_planner;
  p::LayerPlanner* use = &planner;
  if (layer.bytes_per_element == 1 &&
      planner.cost().PeakTflops(1) != planner.cost().PeakTflops(2)) {
    fp8.emplace(planner.cost().AtElementBytes(1));
    fp8_planner.emplace(*fp8);
    use = &*fp8_planner;
  }
  if (absl::Status s = use->Plan(layer, schedules, &plan); !s.ok()) {
    if (s.code() != absl::StatusCode::kInvalidArgument) return s;
    const std::string_view msg = View(s.message());
    // Layer fields get the request's path; "schedules: ..." already is one.
    if (msg.rfind("schedules", 0) == 0) return s;
    return absl::InvalidArgumentError(Cat("layer.", msg));
  }
  proto::PlanToProto(plan, profile, request.include_timeline(), out);
  out->mutable_derived()->set_ranks(layer.parallel.TotalRanks());
  if (kept != nullptr) *kept = std::move(plan);
  return absl::OkStatus();
}

namespace {

std::string_view SearchPointKindName(p::SearchPoint::Kind k) {
  switch (k) {
    case p::SearchPoint::Kind::kOverMemory:
      return "over_memory";
    case p::SearchPoint::Kind::kSkipped:
      return "skipped";
    case p::SearchPoint::Kind::kBound:
      return "bound";
    case p::SearchPoint::Kind::kSimulated:
      return "simulated";
  }
  return "?";
}

// Option rules name options fields; layout, memory and search rules name
// theirs; everything else is a model field.
absl::Status UnderRequest(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kInvalidArgument) return s;
  const std::string_view msg = View(s.message());
  for (std::string_view own : {"layout", "memory.", "search."}) {
    if (msg.rfind(own, 0) == 0) return s;
  }
  for (std::string_view opt : {"schedules", "alltoall_algorithms", "variants", "bucket_bytes",
                               "max_partitions", "partition_groups", "max_span", "tutel_degrees"}) {
    if (msg.rfind(opt, 0) == 0) return absl::InvalidArgumentError(Cat("options.", msg));
  }
  return absl::InvalidArgumentError(Cat("model.", msg));
}

// The candidates, ranked, each with its launcher arguments. `out->model()`
// is the model planned.
void CandidatesToProto(std::span<const p::LayoutCandidate> cands, v1::PlanModelResponse* out) {
  const int64_t global_batch = out->global_batch_size();
  for (size_t i = 0; i < cands.size(); ++i) {
    v1::LayoutCandidate* o = out->add_candidates();
    proto::CandidateToProto(cands[i], static_cast<int>(i) + 1, o);
    FillLauncherArgs(out->model(), global_batch, o);
  }
}

// The layout modes (docs/layouts.md): one layout evaluated, or the search;
// the model's shape was checked by the caller.
absl::Status AnswerLayouts(const p::ModelConfig& model, const v1::PlanModelRequest& request,
                           const p::ModelPlanOptions& options, p::LayoutPlanner& lp,
                           v1::PlanModelResponse* out) {
  const p::MemoryOptions memory = proto::MemoryFromProto(request.memory());
  const bool timeline = request.include_timeline();
  if (request.has_layout()) {
    MOEPLAN_ASSIGN_OR_RETURN(p::Layout layout, proto::LayoutFromProto(request.layout()));
    p::LayoutCandidate c;
    MOEPLAN_RETURN_IF_ERROR(
        UnderRequest(lp.Evaluate(model, layout, options, memory, &c, timeline)));
    out->set_gpus(c.layout.Gpus());
    out->set_ranks(c.layout.Gpus());
    CandidatesToProto(std::span<const p::LayoutCandidate>(&c, 1), out);
    return absl::OkStatus();
  }
  MOEPLAN_ASSIGN_OR_RETURN(p::SearchOptions search, proto::SearchFromProto(request.search()));
  if (request.search().has_timeline_top() && !timeline) {
    return absl::InvalidArgumentError("search.timeline_top: only with include_timeline");
  }
  search.record_pipelines = !timeline                             ? 0
                            : request.search().has_timeline_top() ? search.record_pipelines
                                                                  : search.top;
  p::LayoutSearchResult r;
  const auto start = std::chrono::steady_clock::now();
  MOEPLAN_RETURN_IF_ERROR(UnderRequest(lp.Search(model, search, options, memory, &r)));
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  out->set_gpus(r.gpus);
  out->set_ranks(r.gpus);
  CandidatesToProto(r.candidates, out);
  v1::SearchStats* st = out->mutable_search_stats();
  st->set_enumerated(r.stats.enumerated);
  st->set_pruned_memory(r.stats.pruned_memory);
  st->set_over_limit(r.stats.over_limit);
  st->set_over_memory(r.stats.over_memory);
  st->set_pruned_bound(r.stats.pruned_bound);
  st->set_simulated(r.stats.simulated);
  st->set_stage_plans(r.stats.stage_plans);
  st->set_stage_cache_hits(r.stats.stage_cache_hits);
  st->set_elapsed_ms(elapsed_ms);
  const int64_t global_batch = model.GlobalBatch();
  for (const p::SearchPoint& pt : r.points) {
    v1::SearchPoint* o = out->add_search_points();
    const int64_t replicas = int64_t{pt.layout.dp} * std::max(pt.layout.microbatches, 1);
    *o->mutable_layout() =
        proto::LayoutToProto(pt.layout, replicas > 0 ? global_batch / replicas : 0);
    o->set_kind(std::string(SearchPointKindName(pt.kind)));
    o->set_memory_bytes_per_gpu(pt.memory_bytes);
    o->set_iteration_us(pt.iteration_us);
    o->set_tokens_per_s_per_gpu(pt.tokens_per_s_per_gpu);
  }
  return absl::OkStatus();
}

}  // namespace

// FP8 training (model.fp8_format) is the planner's: its linear layers' GEMMs
// at the FP8 peak, the rest at the profile's own.
absl::Status AnswerPlanModel(const p::ModelConfig& model, const v1::PlanModelRequest& request,
                             p::ModelPlanner& planner, const p::ClusterProfile& profile,
                             v1::PlanModelResponse* out, p::Deadline deadline, p::ModelPlan* kept) {
  if (kept != nullptr) *kept = p::ModelPlan();
  MOEPLAN_ASSIGN_OR_RETURN(p::ModelPlanOptions options,
                           proto::ModelOptionsFromProto(request.options()));
  options.deadline = deadline;
  if (request.has_search() && request.has_layout()) {
    return absl::InvalidArgumentError("search: give either search or layout, not both");
  }
  if (request.has_search() || request.has_layout()) {
    // The model's shape, once (the planner below trusts it), and first: the
    // response's summary fields read it.
    MOEPLAN_RETURN_IF_ERROR(UnderRequest(p::ValidateModelShape(model)));
    p::LayoutPlanner lp(planner.cost());
    out->Clear();
    out->set_profile_name(profile.name);
    out->set_profile_version(profile.version);
    *out->mutable_model() = proto::ModelToProto(model);
    out->set_moe_layers(model.NumMoeLayers());
    out->set_global_batch_size(static_cast<int32_t>(model.GlobalBatch()));
    proto::AccountingToProto(model, profile, out->mutable_accounting());
    return AnswerLayouts(model, request, options, lp, out);
  }
  // The variants plan: ModelPlanner::Plan checks the model (with parallel.*) once.
  p::ModelPlan plan;
  MOEPLAN_RETURN_IF_ERROR(UnderRequest(planner.Plan(model, options, &plan)));
  if (request.include_timeline()) {
    int64_t ops = 0;
    for (const p::VariantPlan& v : plan.variants) ops += v.graph.size();
    if (ops > p::kMaxTimelineOps) {
      return absl::ResourceExhaustedError(
          Cat("include_timeline: the timeline would hold ", ops, " op timings (",
              plan.variants.size(), " variants), over the limit of ", p::kMaxTimelineOps,
              " per response; plan without it or with fewer options.variants"));
    }
  }
  proto::ModelPlanToProto(plan, model, profile, request.include_timeline(), out);
  if (kept != nullptr) *kept = std::move(plan);
  return absl::OkStatus();
}

absl::Status AnswerPlanModel(const v1::PlanModelRequest& request, p::ModelPlanner& planner,
                             const p::ClusterProfile& profile, v1::PlanModelResponse* out,
                             p::Deadline deadline) {
  if (!request.has_model()) return absl::InvalidArgumentError("model: required");
  absl::StatusOr<p::ModelConfig> model = proto::ModelFromProto(request.model());
  if (!model.ok()) return absl::InvalidArgumentError(Cat("model.", View(model.status().message())));
  return AnswerPlanModel(*model, request, planner, profile, out, deadline);
}

}  // namespace moeplan::requests
