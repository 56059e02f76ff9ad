// The profile store's RPCs (handlers_internal.h): ListProfiles, GetProfile,
// PutProfile, ReportMeasurement with the checks a report must pass before it
// is stored, and RefitProfile with the --refit-every worker. No gRPC here.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "handlers_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/context_fit.h"
#include "moeplan/calibration/refit.h"
#include "moeplan/calibration/report_bounds.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/validate.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"
#include "moeplan/requests/replay.h"

namespace moeplan::server {
namespace {

namespace p = ::moeplan::planner;
using internal::Clock;
using internal::Invalid;
using internal::Under;

}  // namespace

absl::Status Handlers::Impl::ListProfiles(const CallContext& ctx, const v1::ListProfilesRequest*,
                                          v1::ListProfilesResponse* resp) {
  const auto start = Clock::now();
  absl::Status s = Authorize(ctx, "ListProfiles", false);
  if (s.ok()) {
    for (const auto& e : store_.List()) {
      v1::ProfileSummary* p = resp->add_profiles();
      p->set_name(e->message.name());
      p->set_version(e->message.version());
      p->set_source(e->message.source());
      p->set_nodes(e->message.nodes());
      p->set_gpus_per_node(e->message.gpus_per_node());
      p->set_comment(e->message.comment());
    }
  }
  Done(Method::kListProfiles, s, start, "-", "");
  return s;
}

absl::Status Handlers::Impl::GetProfile(const CallContext& ctx, const v1::GetProfileRequest* req,
                                        v1::ClusterProfile* resp) {
  const auto start = Clock::now();
  absl::Status s = Authorize(ctx, "GetProfile", false);
  if (!s.ok()) {
  } else if (req->name().empty()) {
    s = Invalid("name: required");
  } else if (auto e = store_.Get(req->name())) {
    *resp = e->message;
  } else {
    s = UnknownProfile("name", req->name());
  }
  Done(Method::kGetProfile, s, start, "-", req->name());
  return s;
}

absl::Status Handlers::Impl::PutProfile(const CallContext& ctx, const v1::PutProfileRequest* req,
                                        v1::PutProfileResponse* resp) {
  const auto start = Clock::now();
  absl::Status s = Authorize(ctx, "PutProfile", true);
  if (!s.ok()) {
  } else if (!req->has_profile()) {
    s = Invalid("profile: required");
  } else {
    absl::StatusOr<std::shared_ptr<const ProfileEntry>> e =
        Guard(resp, [&] { return store_.Put(req->profile()); });
    if (e.ok()) {
      resp->set_name((*e)->message.name());
      resp->set_version((*e)->message.version());
      cache_.EraseProfile((*e)->message.name());
    } else {
      s = Under("profile.", e.status());
    }
  }
  Done(Method::kPutProfile, s, start, "-", req->profile().name());
  return s;
}

absl::Status Handlers::Impl::ReportMeasurement(const CallContext& ctx,
                                               const v1::ReportMeasurementRequest* req,
                                               v1::ReportMeasurementResponse* resp) {
  const auto start = Clock::now();
  absl::Status s = Authorize(ctx, "ReportMeasurement", true);
  if (s.ok()) s = Guard(resp, [&] { return DoReport(ctx, *req, resp); });
  if (s.ok()) metrics_.MeasurementStored();
  Done(Method::kReportMeasurement, s, start, "-", req->profile_name());
  if (s.ok() && options_.refit_every > 0 && resp->stored() % options_.refit_every == 0) {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      queue_.push_back(req->profile_name());
    }
    queue_cv_.notify_one();
  }
  return s;
}

absl::Status Handlers::Impl::RefitProfile(const CallContext& ctx,
                                          const v1::RefitProfileRequest* req,
                                          v1::RefitProfileResponse* resp) {
  const auto start = Clock::now();
  absl::Status s = Authorize(ctx, "RefitProfile", true);
  if (s.ok()) {
    s = Guard(resp,
              [&] { return DoRefit(req->profile_name(), "RefitProfile on moeplan-server", resp); });
  }
  if (s.code() != absl::StatusCode::kUnauthenticated) metrics_.Refit(/*background=*/false, s.ok());
  Done(Method::kRefitProfile, s, start, "-", req->profile_name());
  return s;
}

template <typename IsOp>
absl::Status Handlers::Impl::CheckOps(const v1::ReportMeasurementRequest& req, IsOp is_op,
                                      std::string_view plan) const {
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < req.ops_size(); ++i) {
    const v1::MeasuredOp& op = req.ops(i);
    if (op.name().empty()) return Invalid(Cat("ops[", i, "].name: required"));
    if (!is_op(op.name())) {
      return Invalid(
          Cat("ops[", i, "].name: not an op of ", plan, " (got '", Printable(op.name(), 64), "')"));
    }
    if (!seen.insert(op.name()).second) {
      return Invalid(
          Cat("ops[", i, "].name: each op may be reported once (got ", Quoted(op.name()), " twice)"));
    }
    if (!std::isfinite(op.duration_us()) || op.duration_us() < 0 || op.duration_us() > kMaxUs) {
      return Invalid(Cat("ops[", i,
                         "].duration_us: must be finite, >= 0 and <= 3.6e9 (an hour) (got ",
                         op.duration_us(), ")"));
    }
    if (op.has_start() &&
        (!std::isfinite(op.start_us()) || op.start_us() < 0 || op.start_us() > kMaxUs)) {
      return Invalid(Cat("ops[", i, "].start_us: must be finite, >= 0 and <= 3.6e9 (an hour) (got ",
                         op.start_us(), ")"));
    }
    if (!op.has_start() && op.start_us() != 0) {
      return Invalid(Cat("ops[", i, "].start_us: set has_start with it"));
    }
  }
  return absl::OkStatus();
}

absl::Status Handlers::Impl::CheckLayerReport(const v1::ReportMeasurementRequest& req,
                                              const ProfileEntry& entry, ReportedPlan* ran) const {
  if (!req.has_plan() || !req.plan().has_layer()) {
    return Invalid("plan.layer: required (or model_plan for a whole model)");
  }
  absl::StatusOr<p::LayerConfig> layer = proto::LayerFromProto(req.plan().layer());
  if (!layer.ok()) return Under("plan.layer.", layer.status());
  if (absl::Status s = p::ValidateLayer(*layer, entry.profile.shape); !s.ok()) {
    return Under("plan.layer.", s);
  }
  absl::StatusOr<p::Schedule> schedule = proto::ScheduleFromProto(req.schedule());
  if (!schedule.ok()) {
    return Invalid(Cat("schedule: must be SCHEDULE_DEFAULT, SCHEDULE_S1 or SCHEDULE_S2 (got ",
                       static_cast<int>(req.schedule()), ")"));
  }
  if (absl::Status s = p::ValidateForSchedule(*layer, *schedule); !s.ok()) {
    return Under("plan.layer.", s);
  }
  if (req.ops_size() == 0) return Invalid("ops: at least one measured op is required");
  p::LayerPlanner planner(entry.cost);
  const p::Schedule one[] = {*schedule};
  if (absl::Status s = planner.Plan(*layer, one, &ran->layer); !s.ok()) {
    return Under("plan.layer.", s);
  }
  const p::Candidate& planned = ran->layer.candidates.front();
  const p::OpGraph& graph = planned.graph();
  ran->graph = &graph;
  ran->predicted_us = planned.total_us();
  if (req.ops_size() > graph.size()) {
    return Invalid(Cat("ops: at most one entry per op of the plan (", graph.size(), " ops) (got ",
                       req.ops_size(), ")"));
  }
  std::map<std::string, std::string> resources;  // op -> the planner's resource
  for (p::OpId id = 0; id < graph.size(); ++id) {
    resources.emplace(graph.op(id).Name(), p::ResourceMaskName(graph.op(id).resources));
  }
  MOEPLAN_RETURN_IF_ERROR(CheckOps(
      req, [&](const std::string& name) { return resources.contains(name); },
      Cat("the plan's ", p::ScheduleName(*schedule), " schedule")));
  return calibration::CheckReportedTimes(req, calibration::MinOpUs(entry.message), resources);
}

absl::Status Handlers::Impl::CheckModelReport(const CallContext& ctx,
                                              const v1::ReportMeasurementRequest& req,
                                              const ProfileEntry& entry, ReportedPlan* ran) {
  const v1::PlanModelRequest& mp = req.model_plan();
  if (mp.has_search() || mp.has_layout()) {
    return Invalid("model_plan: a variants plan is reported, not a search or a layout");
  }
  absl::StatusOr<p::ModelConfig> model = proto::ModelFromProto(mp.model());
  if (!model.ok()) return Under("model_plan.model.", model.status());
  p::Variant variant;
  if (!p::ParseVariant(req.variant(), &variant)) {
    return Invalid(Cat("variant: must be none, tutel, dw, partition or lancet (got '",
                       Printable(req.variant(), 32), "')"));
  }
  if (req.ops_size() == 0) return Invalid("ops: at least one measured op is required");
  v1::PlanModelRequest request = mp;
  request.set_include_timeline(true);
  request.mutable_options()->clear_variants();
  request.mutable_options()->add_variants(proto::VariantToProto(variant));
  p::ModelPlanner planner(entry.cost);
  v1::PlanModelResponse planned;
  if (absl::Status s = requests::AnswerPlanModel(*model, request, planner, entry.profile, &planned,
                                                 PlanDeadline(ctx), &ran->model);
      !s.ok()) {
    return Under("model_plan.", s);
  }
  if (ran->model.variants.size() != 1 || planned.variants_size() != 1) {
    return absl::InternalError("model_plan: the check planned other than the one variant");
  }
  ran->graph = &ran->model.variants.front().graph;
  ran->predicted_us = ran->model.variants.front().iteration_us();
  const v1::VariantPlan& v = planned.variants(0);
  // A differently partitioned plan has at most max_partitions pieces per op.
  const int max_ops = v.ops_size() * 8;
  if (req.ops_size() > max_ops) {
    return Invalid(Cat("ops: at most ", max_ops, " entries for this plan (", v.ops_size(),
                       " ops) (got ", req.ops_size(), ")"));
  }
  absl::flat_hash_set<std::string> kinds;
  std::map<std::string, std::string> resources;  // op and its kind -> the planner's resource
  for (const v1::OpTiming& op : v.ops()) {
    kinds.insert(std::string(calibration::OpBaseName(op.name())));
    resources.emplace(op.name(), op.resource());
    resources.emplace(std::string(calibration::OpBaseName(op.name())), op.resource());
  }
  MOEPLAN_RETURN_IF_ERROR(CheckOps(
      req,
      [&](const std::string& name) {
        const std::string_view kind = calibration::OpBaseName(name);
        return name.size() <= 256 && kinds.contains(absl::string_view(kind.data(), kind.size()));
      },
      Cat("the model's ", req.variant(), " plan")));
  return calibration::CheckReportedTimes(req, calibration::MinOpUs(entry.message), resources);
}

absl::Status Handlers::Impl::DoReport(const CallContext& ctx,
                                      const v1::ReportMeasurementRequest& req,
                                      v1::ReportMeasurementResponse* resp) {
  if (req.profile_name().empty()) return Invalid("profile_name: required");
  std::shared_ptr<const ProfileEntry> entry = store_.Get(req.profile_name());
  if (!entry) return UnknownProfile("profile_name", req.profile_name());
  if (req.profile_version() < 1 || req.profile_version() > entry->message.version()) {
    return Invalid(Cat("profile_version: must be between 1 and the stored version ",
                       entry->message.version(), " (got ", req.profile_version(), ")"));
  }
  // The total first: the checks on the ops' times hold them against it.
  if (!std::isfinite(req.total_us()) || req.total_us() <= 0 || req.total_us() > kMaxUs) {
    return Invalid(
        Cat("total_us: must be finite, > 0 and <= 3.6e9 (an hour) (got ", req.total_us(), ")"));
  }
  ReportedPlan ran;
  if (req.has_model_plan()) {
    if (req.has_plan())
      return Invalid("plan: give plan (a layer) or model_plan (a model), not both");
    MOEPLAN_RETURN_IF_ERROR(CheckModelReport(ctx, req, *entry, &ran));
  } else {
    MOEPLAN_RETURN_IF_ERROR(CheckLayerReport(req, *entry, &ran));
  }
  // Stored lines are read back by ParseJson, which refuses control characters.
  MOEPLAN_RETURN_IF_ERROR(proto::CheckText(req));
  proto::JsonStyle style;
  style.pretty = false;
  style.always_print_primitive_fields = false;
  absl::StatusOr<std::string> line = proto::ToJson(req, style);
  if (!line.ok()) return line.status();
  absl::StatusOr<uint64_t> n = store_.AppendMeasurement(req.profile_name(), *line);
  if (!n.ok()) return n.status();
  resp->set_stored(*n);
  // The run's composition error on the plan the check made of it: an answer,
  // not a condition of storing.
  if (absl::Status r = requests::ReplayReport(req, *ran.graph, ran.predicted_us, resp); !r.ok()) {
    resp->clear_replay();
    resp->clear_predicted_us();
    resp->clear_cost_error_pct();
  }
  return absl::OkStatus();
}

absl::Status Handlers::Impl::DoRefit(const std::string& name, std::string_view source,
                                     v1::RefitProfileResponse* resp) {
  if (name.empty()) return Invalid("profile_name: required");
  std::lock_guard<std::mutex> refit_lock(refit_mu_);
  std::shared_ptr<const ProfileEntry> entry = store_.Get(name);
  if (!entry) return UnknownProfile("profile_name", name);
  if (entry->builtin) {
    return absl::FailedPreconditionError(
        Cat("profile_name: built-in profile '", name,
            "' is read-only: put a copy under another name (moeplan profiles put) and report "
            "against that"));
  }
  MOEPLAN_ASSIGN_OR_RETURN(
      ProfileStore::Measurements log,
      store_.ReadMeasurements(name, static_cast<size_t>(std::max(1, options_.refit_window))));
  if (log.lines.empty()) {
    return absl::FailedPreconditionError(
        Cat("profile_name: no measurements have been reported against '", name, "'"));
  }
  const uint64_t first = log.total - log.lines.size() + 1;  // 1-based line of lines[0]
  std::vector<v1::ReportMeasurementRequest> reports(log.lines.size());
  for (size_t i = 0; i < log.lines.size(); ++i) {
    // Stored by DoReport, so they parse; a line that does not is data loss.
    if (absl::Status s = proto::ParseJson(log.lines[i], &reports[i]); !s.ok()) {
      return absl::DataLossError(Cat("measurement ", first + i, " of '", name,
                                     "' does not parse: ", View(s.message())));
    }
    std::string().swap(log.lines[i]);  // the parsed report is all a refit needs
  }
  const std::string fitted_on =
      log.lines.size() == log.total
          ? Cat(log.total, " measurements")
          : Cat("the newest ", log.lines.size(), " of ", log.total, " measurements (--refit-window)");
  MOEPLAN_ASSIGN_OR_RETURN(
      calibration::RefitResult r,
      calibration::RefitFromReports(entry->message, std::move(reports),
                                    calibration::OpContextOptions{},
                                    Cat(source, ", ", fitted_on)));
  absl::StatusOr<std::shared_ptr<const ProfileEntry>> stored = store_.Put(r.profile);
  if (!stored.ok()) return Under("profile.", stored.status());
  cache_.EraseProfile(name);
  *resp->mutable_profile() = (*stored)->message;
  resp->set_report(std::move(r.report));
  resp->set_measurements(log.total);
  resp->set_used(static_cast<uint64_t>(r.used));
  return absl::OkStatus();
}

void Handlers::Impl::RefitLoop() {
  for (;;) {
    std::string name;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      name = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto start = Clock::now();
    v1::RefitProfileResponse resp;
    absl::Status s =
        DoRefit(name, Cat("moeplan-server --refit-every ", options_.refit_every), &resp);
    (s.ok() ? background_refits_ : background_refit_failures_).fetch_add(1);
    metrics_.Refit(/*background=*/true, s.ok());
    log_.Log("RefitProfile(background)", s, start, "-", name);
  }
}

}  // namespace moeplan::server
