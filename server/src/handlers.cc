// The Planner service's handlers (handlers.h): request validation, profile
// resolution, the plan cache, the limits on one request's work and the
// request log. No gRPC here; server.cc adapts its contexts.
#include "moeplan/requests/answer.h"
#include "moeplan/server/handlers.h"

#include <google/protobuf/util/message_differencer.h>
#include <spdlog/async.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <new>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_join.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/context_fit.h"
#include "moeplan/calibration/refit.h"
#include "moeplan/planner/limits.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/validate.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"

namespace moeplan::server {
namespace {

namespace p = ::moeplan::planner;
using Clock = std::chrono::steady_clock;

absl::Status Invalid(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

// Prefixes a field error with the request field it came from.
absl::Status Under(std::string_view prefix, const absl::Status& s) {
  if (s.code() != absl::StatusCode::kInvalidArgument &&
      s.code() != absl::StatusCode::kFailedPrecondition) {
    return s;
  }
  return absl::Status(s.code(), Cat(prefix, View(s.message())));
}

// One logfmt line per request on stderr, through spdlog's async queue so the
// handlers never wait on the terminal.
class RequestLog {
 public:
  explicit RequestLog(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    static std::once_flag once;
    std::call_once(once, [] { spdlog::init_thread_pool(1 << 16, 1); });
    logger_ = std::make_shared<spdlog::async_logger>(
        "moeplan-server-requests", std::make_shared<spdlog::sinks::stderr_sink_mt>(),
        spdlog::thread_pool(), spdlog::async_overflow_policy::block);
    logger_->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %v", spdlog::pattern_time_type::utc);
  }
  ~RequestLog() {
    if (logger_) logger_->flush();
  }
  void Log(std::string_view method, const absl::Status& s, Clock::time_point start,
           std::string_view cache, std::string_view profile) {
    if (!enabled_) return;
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
    // The profile name and the error come from requests: escaped (no newline
    // forges a line, no escape sequence reaches a terminal) and cut.
    std::string name = profile.empty() ? "-" : Printable(profile, 64);
    for (size_t i = name.find_first_of(" \"="); i != std::string::npos;
         i = name.find_first_of(" \"=", i)) {
      name.replace(i, 1, fmt::format("\\x{:02x}", static_cast<unsigned char>(name[i])));
    }
    if (s.ok()) {
      logger_->info("method={} code=OK latency_us={} cache={} profile={}", method, us.count(),
                    cache, name);
    } else {
      std::string msg = Printable(View(s.message()), 512);
      for (char& c : msg) {
        if (c == '"') c = '\'';
      }
      logger_->info("method={} code={} latency_us={} cache={} profile={} error=\"{}\"", method,
                    absl::StatusCodeToString(s.code()), us.count(), cache, name, msg);
    }
  }

 private:
  bool enabled_;
  std::shared_ptr<spdlog::async_logger> logger_;
};

absl::Status CheckDeadline(const CallContext& ctx) {
  if (ctx.IsCancelled()) return absl::CancelledError("the client cancelled the call");
  if (ctx.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError("the call's deadline passed before planning started");
  }
  return absl::OkStatus();
}

// A planner per thread, rebuilt when the thread plans against another profile
// entry (holding the entry keeps its cost model alive).
struct ThreadPlanner {
  std::shared_ptr<const ProfileEntry> entry;
  std::optional<p::LayerPlanner> planner;
  p::LayerPlanner& For(const std::shared_ptr<const ProfileEntry>& e) {
    if (entry != e) {
      planner.reset();
      entry = e;
      planner.emplace(e->cost);
    }
    return *planner;
  }
};

}  // namespace

class Handlers::Impl {
 public:
  Impl(ProfileStore* store, PlanCache* cache, const HandlerOptions& options)
      : store_(*store),
        cache_(*cache),
        options_(options),
        max_model_plans_(options.max_model_plans > 0
                             ? options.max_model_plans
                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
        log_(options.log_requests) {
    if (options_.refit_every > 0) refit_worker_ = std::thread([this] { RefitLoop(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    if (refit_worker_.joinable()) refit_worker_.join();
  }

  absl::Status PlanLayer(const CallContext& ctx, const v1::PlanLayerRequest* req,
                         v1::PlanLayerResponse* resp) {
    const auto start = Clock::now();
    std::string_view cache_state = "-";
    std::string profile_name;
    absl::Status s = Authorize(ctx, "PlanLayer", false);
    if (s.ok()) {
      s = Guard(resp, [&] { return DoPlanLayer(ctx, *req, resp, &cache_state, &profile_name); });
    }
    log_.Log("PlanLayer", s, start, cache_state, profile_name);
    return s;
  }

  absl::Status PlanModel(const CallContext& ctx, const v1::PlanModelRequest* req,
                         v1::PlanModelResponse* resp) {
    const auto start = Clock::now();
    std::string_view cache_state = "-";
    std::string profile_name;
    absl::Status s = Authorize(ctx, "PlanModel", false);
    if (s.ok()) {
      s = Guard(resp, [&] { return DoPlanModel(ctx, *req, resp, &cache_state, &profile_name); });
    }
    log_.Log("PlanModel", s, start, cache_state, profile_name);
    return s;
  }

  bool PlanModelCached(const CallContext& ctx, const v1::PlanModelRequest* req,
                       v1::PlanModelResponse* resp, absl::Status* status) {
    const auto start = Clock::now();
    std::string_view cache_state = "-";
    std::string profile_name;
    bool miss = false;
    absl::Status s = Authorize(ctx, "PlanModel", false);
    if (s.ok()) {
      s = Guard(resp,
                [&] { return DoPlanModel(ctx, *req, resp, &cache_state, &profile_name, &miss); });
    }
    if (miss && s.ok()) return false;
    log_.Log("PlanModel", s, start, cache_state, profile_name);
    *status = s;
    return true;
  }

  int model_plans_running() const { return model_plans_.load(); }

  absl::Status ListProfiles(const CallContext& ctx, const v1::ListProfilesRequest*,
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
    log_.Log("ListProfiles", s, start, "-", "");
    return s;
  }

  absl::Status GetProfile(const CallContext& ctx, const v1::GetProfileRequest* req,
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
    log_.Log("GetProfile", s, start, "-", req->name());
    return s;
  }

  absl::Status PutProfile(const CallContext& ctx, const v1::PutProfileRequest* req,
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
    log_.Log("PutProfile", s, start, "-", req->profile().name());
    return s;
  }

  absl::Status ReportMeasurement(const CallContext& ctx, const v1::ReportMeasurementRequest* req,
                                 v1::ReportMeasurementResponse* resp) {
    const auto start = Clock::now();
    absl::Status s = Authorize(ctx, "ReportMeasurement", true);
    if (s.ok()) s = Guard(resp, [&] { return DoReport(ctx, *req, resp); });
    log_.Log("ReportMeasurement", s, start, "-", req->profile_name());
    if (s.ok() && options_.refit_every > 0 && resp->stored() % options_.refit_every == 0) {
      {
        std::lock_guard<std::mutex> lock(queue_mu_);
        queue_.push_back(req->profile_name());
      }
      queue_cv_.notify_one();
    }
    return s;
  }

  absl::Status RefitProfile(const CallContext& ctx, const v1::RefitProfileRequest* req,
                            v1::RefitProfileResponse* resp) {
    const auto start = Clock::now();
    absl::Status s = Authorize(ctx, "RefitProfile", true);
    if (s.ok()) {
      s = Guard(resp, [&] {
        return DoRefit(req->profile_name(), "RefitProfile on moeplan-server", resp);
      });
    }
    log_.Log("RefitProfile", s, start, "-", req->profile_name());
    return s;
  }

  uint64_t background_refits() const { return background_refits_.load(); }
  uint64_t background_refit_failures() const { return background_refit_failures_.load(); }

 private:
  // The bearer token, where the server has one: writes always need it, reads
  // with token_for_reads. Compared in constant time (no early exit on the
  // first differing byte, nor on a shorter token).
  absl::Status Authorize(const CallContext& ctx, std::string_view method, bool write) const {
    if (options_.token.empty() || (!write && !options_.token_for_reads)) return absl::OkStatus();
    const std::string_view got = ctx.Authorization();
    constexpr std::string_view kBearer = "Bearer ";
    if (got.empty() || got.substr(0, kBearer.size()) != kBearer) {
      return absl::UnauthenticatedError(
          Cat(method,
              " needs the server's bearer token: call metadata 'authorization: Bearer "
              "<token>' (the clients' --token-file)"));
    }
    const std::string_view token = got.substr(kBearer.size());
    const std::string& want = options_.token;
    unsigned diff = token.size() == want.size() ? 0u : 1u;
    for (size_t i = 0; i < want.size(); ++i) {
      const unsigned char a = static_cast<unsigned char>(want[i]);
      const unsigned char b = i < token.size() ? static_cast<unsigned char>(token[i]) : 0u;
      diff |= static_cast<unsigned>(a ^ b);
    }
    if (diff != 0) {
      return absl::UnauthenticatedError(Cat(method, ": the bearer token is not the server's"));
    }
    return absl::OkStatus();
  }

  // No request's failure ends the process: an allocation that fails (a
  // request the limits did not foresee) fails the call, with nothing cached
  // or written, and the response is cleared.
  template <class F>
  static auto Guard(google::protobuf::Message* resp, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::bad_alloc&) {
      resp->Clear();
      return absl::ResourceExhaustedError(
          "the server ran out of memory answering this request; nothing was cached or stored");
    }
  }

  // A response the client could not receive is refused, and never cached.
  absl::Status CheckSize(const google::protobuf::Message& resp) const {
    const size_t bytes = resp.ByteSizeLong();
    if (bytes <= options_.max_response_bytes) return absl::OkStatus();
    return absl::ResourceExhaustedError(
        Cat("response: ", bytes, " bytes exceed the message limit of ", options_.max_response_bytes,
            " bytes (moeplan-server --max-message-mib); ask without include_timeline or for less"));
  }

  // The time one plan may take: the call's deadline or max_plan_time, the earlier.
  p::Deadline PlanDeadline(const CallContext& ctx) const {
    const auto now = std::chrono::system_clock::now();
    const auto left = ctx.deadline() == std::chrono::system_clock::time_point::max()
                          ? std::chrono::system_clock::duration::max()
                          : ctx.deadline() - now;
    const auto limit =
        std::chrono::duration_cast<std::chrono::system_clock::duration>(options_.max_plan_time);
    return p::Deadline{Clock::now() +
                       std::chrono::duration_cast<Clock::duration>(std::min(left, limit))};
  }

  // NOT_FOUND at any number of stored profiles: the message names at most
  // kListed of them (it travels in the status, whose size gRPC limits), and
  // the requested name is echoed escaped and cut.
  static constexpr size_t kListed = 16;
  absl::Status UnknownProfile(std::string_view field, std::string_view name) const {
    std::vector<std::string> names = store_.Names();
    const size_t more = names.size() > kListed ? names.size() - kListed : 0;
    names.resize(std::min(names.size(), kListed));
    return absl::NotFoundError(
        Cat(field, ": no profile named '", Printable(name, 64),
            "' (known: ", absl::StrJoin(names, ", "),
            more > 0 ? Cat(" and ", more, " more; ListProfiles lists them") : std::string(), ")"));
  }

  // The profile a plan request names or carries inline (then `inline_bytes`
  // holds its serialisation, for the cache key).
  template <class Request>
  absl::StatusOr<std::shared_ptr<const ProfileEntry>> ResolveProfile(const Request& req,
                                                                     std::string* profile_name,
                                                                     std::string* inline_bytes) {
    if (req.cluster_case() == Request::kProfileName) {
      *profile_name = req.profile_name();
      std::shared_ptr<const ProfileEntry> entry = store_.Get(req.profile_name());
      if (!entry) return UnknownProfile("profile_name", req.profile_name());
      return entry;
    }
    if (req.cluster_case() == Request::kProfile) {
      *profile_name = req.profile().name();
      absl::StatusOr<std::shared_ptr<const ProfileEntry>> e =
          MakeProfileEntry(req.profile(), false);
      if (!e.ok()) return Under("profile.", e.status());
      // A response is labelled with its profile's name: an inline profile
      // may not pass itself off as a stored one.
      if (std::shared_ptr<const ProfileEntry> stored = store_.Get(req.profile().name());
          stored &&
          !google::protobuf::util::MessageDifferencer::Equals(stored->message, req.profile())) {
        return Invalid(Cat("profile.name: '", Printable(req.profile().name(), 64),
                           "' is the name of a ", stored->builtin ? "built-in" : "stored",
                           " profile, and this inline profile differs from it; give it a name "
                           "of its own, or send profile_name to plan with the stored one"));
      }
      *inline_bytes = req.profile().SerializeAsString();
      return e;
    }
    return Invalid("profile_name: required (or an inline profile)");
  }

  // `defer` set: a miss returns OK at once with *defer true, planning nothing.
  absl::Status DoPlanModel(const CallContext& ctx, const v1::PlanModelRequest& req,
                           v1::PlanModelResponse* resp, std::string_view* cache_state,
                           std::string* profile_name, bool* defer = nullptr) {
    MOEPLAN_RETURN_IF_ERROR(CheckDeadline(ctx));
    std::string inline_bytes;
    MOEPLAN_ASSIGN_OR_RETURN(std::shared_ptr<const ProfileEntry> entry,
                             ResolveProfile(req, profile_name, &inline_bytes));
    if (!req.has_model()) return Invalid("model: required");
    absl::StatusOr<p::ModelConfig> model = proto::ModelFromProto(req.model());
    if (!model.ok()) return Under("model.", model.status());
    // Normalise before keying, so equivalent requests share a cache entry.
    v1::PlanModelRequest canonical;
    *canonical.mutable_model() = proto::ModelToProto(*model);
    canonical.mutable_model()->clear_name();  // a label, not an input
    *canonical.mutable_options() = req.options();
    canonical.set_include_timeline(req.include_timeline());
    if (req.has_search()) *canonical.mutable_search() = req.search();
    if (req.has_layout()) *canonical.mutable_layout() = req.layout();
    if (req.has_memory()) *canonical.mutable_memory() = req.memory();
    const std::string key = PlanCacheKey(
        entry->message.name(), entry->message.version(),
        Cat("model", std::string_view("\0", 1), canonical.SerializeAsString(), inline_bytes));
    if (PlanCache::Value hit = cache_.Get(key)) {
      *cache_state = "hit";
      resp->CopyFrom(*hit);
      return absl::OkStatus();
    }
    *cache_state = "miss";
    if (defer != nullptr) {
      *defer = true;
      return absl::OkStatus();
    }
    // Whole-model plans take milliseconds to seconds, and a search's memory
    // grows with its candidates: only max_model_plans run at once.
    const int running = model_plans_.fetch_add(1) + 1;
    absl::Cleanup release = [this] { model_plans_.fetch_sub(1); };
    if (running > max_model_plans_) {
      *cache_state = "busy";
      return absl::ResourceExhaustedError(
          Cat("server busy: ", max_model_plans_,
              " uncached model plans are running (moeplan-server --max-model-plans); retry later"));
    }
    // A planner per call keeps no per-thread state alive between them.
    p::ModelPlanner planner(entry->cost);
    absl::Status s =
        requests::AnswerPlanModel(*model, req, planner, entry->profile, resp, PlanDeadline(ctx));
    if (s.ok()) s = CheckDeadline(ctx);
    if (s.ok()) s = CheckSize(*resp);
    if (!s.ok()) {
      resp->Clear();
      return s;
    }
    cache_.Put(key, std::make_shared<const v1::PlanModelResponse>(*resp));
    return absl::OkStatus();
  }

  absl::Status DoPlanLayer(const CallContext& ctx, const v1::PlanLayerRequest& req,
                           v1::PlanLayerResponse* resp, std::string_view* cache_state,
                           std::string* profile_name) {
    MOEPLAN_RETURN_IF_ERROR(CheckDeadline(ctx));
    std::string inline_bytes;
    MOEPLAN_ASSIGN_OR_RETURN(std::shared_ptr<const ProfileEntry> entry,
                             ResolveProfile(req, profile_name, &inline_bytes));
    if (!req.has_layer()) return Invalid("layer: required");
    // Normalise before keying, so equivalent requests share a cache entry.
    absl::StatusOr<p::LayerConfig> layer = proto::LayerFromProto(req.layer());
    if (!layer.ok()) return Under("layer.", layer.status());
    v1::PlanLayerRequest canonical;
    *canonical.mutable_layer() = proto::LayerToProto(*layer);
    canonical.mutable_layer()->clear_name();  // a label, not an input
    if (req.schedules_size() == 0) {
      for (p::Schedule s : p::kAllSchedules) canonical.add_schedules(proto::ScheduleToProto(s));
    } else {
      *canonical.mutable_schedules() = req.schedules();
    }
    canonical.set_include_timeline(req.include_timeline());
    const std::string key = PlanCacheKey(
        entry->message.name(), entry->message.version(),
        Cat("layer", std::string_view("\0", 1), canonical.SerializeAsString(), inline_bytes));
    if (PlanCache::Value hit = cache_.Get(key)) {
      *cache_state = "hit";
      resp->CopyFrom(*hit);
      return absl::OkStatus();
    }
    *cache_state = "miss";
    thread_local ThreadPlanner tls;
    absl::Status s =
        inline_bytes.empty()
            ? requests::AnswerPlanLayer(*layer, canonical, tls.For(entry), entry->profile, resp)
            : [&] {
                p::LayerPlanner planner(entry->cost);
                return requests::AnswerPlanLayer(*layer, canonical, planner, entry->profile, resp);
              }();
    if (s.ok()) s = CheckSize(*resp);
    if (!s.ok()) {
      resp->Clear();
      return s;
    }
    cache_.Put(key, std::make_shared<const v1::PlanLayerResponse>(*resp));
    return absl::OkStatus();
  }

  // Measurements feed calibration and fill the disk: each names an op of the
  // plan it measured, at most once, with a duration of at most an hour.
  static constexpr double kMaxUs = 3.6e9;  // one hour

  // A layer's report: its schedule planned on the profile, every op one of it.
  absl::Status CheckLayerReport(const v1::ReportMeasurementRequest& req,
                                const ProfileEntry& entry) const {
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
    p::LayerPlan plan;
    const p::Schedule one[] = {*schedule};
    if (absl::Status s = planner.Plan(*layer, one, &plan); !s.ok()) {
      return Under("plan.layer.", s);
    }
    const p::OpGraph& graph = plan.candidates.front().graph();
    if (req.ops_size() > graph.size()) {
      return Invalid(Cat("ops: at most one entry per op of the plan (", graph.size(), " ops) (got ",
                         req.ops_size(), ")"));
    }
    absl::flat_hash_set<std::string> names;
    for (p::OpId id = 0; id < graph.size(); ++id) names.insert(graph.op(id).Name());
    return CheckOps(
        req, [&](const std::string& name) { return names.contains(name); },
        Cat("the plan's ", p::ScheduleName(*schedule), " schedule"));
  }

  // A model's report: the request plans on the profile and names the variant
  // it ran; every op is one of that plan's kinds (its name less block, step
  // and part: a plan made on an older version may split ranges otherwise).
  absl::Status CheckModelReport(const CallContext& ctx, const v1::ReportMeasurementRequest& req,
                                const ProfileEntry& entry) {
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
                                                PlanDeadline(ctx));
        !s.ok()) {
      return Under("model_plan.", s);
    }
    const v1::VariantPlan& v = planned.variants(0);
    // A differently partitioned plan has at most max_partitions pieces per op.
    const int max_ops = v.ops_size() * 8;
    if (req.ops_size() > max_ops) {
      return Invalid(Cat("ops: at most ", max_ops, " entries for this plan (", v.ops_size(),
                         " ops) (got ", req.ops_size(), ")"));
    }
    absl::flat_hash_set<std::string> kinds;
    for (const v1::OpTiming& op : v.ops())
      kinds.insert(std::string(calibration::OpBaseName(op.name())));
    return CheckOps(
        req,
        [&](const std::string& name) {
          const std::string_view kind = calibration::OpBaseName(name);
          return name.size() <= 256 && kinds.contains(absl::string_view(kind.data(), kind.size()));
        },
        Cat("the model's ", req.variant(), " plan"));
  }

  template <typename IsOp>
  absl::Status CheckOps(const v1::ReportMeasurementRequest& req, IsOp is_op,
                        std::string_view plan) const {
    absl::flat_hash_set<std::string> seen;
    for (int i = 0; i < req.ops_size(); ++i) {
      const v1::MeasuredOp& op = req.ops(i);
      if (op.name().empty()) return Invalid(Cat("ops[", i, "].name: required"));
      if (!is_op(op.name())) {
        return Invalid(Cat("ops[", i, "].name: not an op of ", plan, " (got '",
                           Printable(op.name(), 64), "')"));
      }
      if (!seen.insert(op.name()).second) {
        return Invalid(
            Cat("ops[", i, "].name: each op may be reported once (got '", op.name(), "' twice)"));
      }
      if (!std::isfinite(op.duration_us()) || op.duration_us() < 0 || op.duration_us() > kMaxUs) {
        return Invalid(Cat("ops[", i,
                           "].duration_us: must be finite, >= 0 and <= 3.6e9 (an hour) (got ",
                           op.duration_us(), ")"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status DoReport(const CallContext& ctx, const v1::ReportMeasurementRequest& req,
                        v1::ReportMeasurementResponse* resp) {
    if (req.profile_name().empty()) return Invalid("profile_name: required");
    std::shared_ptr<const ProfileEntry> entry = store_.Get(req.profile_name());
    if (!entry) return UnknownProfile("profile_name", req.profile_name());
    if (req.profile_version() < 1 || req.profile_version() > entry->message.version()) {
      return Invalid(Cat("profile_version: must be between 1 and the stored version ",
                         entry->message.version(), " (got ", req.profile_version(), ")"));
    }
    if (req.has_model_plan()) {
      if (req.has_plan())
        return Invalid("plan: give plan (a layer) or model_plan (a model), not both");
      MOEPLAN_RETURN_IF_ERROR(CheckModelReport(ctx, req, *entry));
    } else {
      MOEPLAN_RETURN_IF_ERROR(CheckLayerReport(req, *entry));
    }
    if (!std::isfinite(req.total_us()) || req.total_us() <= 0 || req.total_us() > kMaxUs) {
      return Invalid(
          Cat("total_us: must be finite, > 0 and <= 3.6e9 (an hour) (got ", req.total_us(), ")"));
    }
    proto::JsonStyle style;
    style.pretty = false;
    style.always_print_primitive_fields = false;
    absl::StatusOr<std::string> line = proto::ToJson(req, style);
    if (!line.ok()) return line.status();
    absl::StatusOr<uint64_t> n = store_.AppendMeasurement(req.profile_name(), *line);
    if (!n.ok()) return n.status();
    resp->set_stored(*n);
    return absl::OkStatus();
  }

  // Refits the stored profile `name` from its measurement log and stores the
  // next version; the old version's cached plans are dropped. One at a time:
  // each must see the version the last one stored.
  absl::Status DoRefit(const std::string& name, std::string_view source,
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
    MOEPLAN_ASSIGN_OR_RETURN(const std::vector<std::string> lines, store_.ReadMeasurements(name));
    if (lines.empty()) {
      return absl::FailedPreconditionError(
          Cat("profile_name: no measurements have been reported against '", name, "'"));
    }
    std::vector<v1::ReportMeasurementRequest> reports(lines.size());
    for (size_t i = 0; i < lines.size(); ++i) {
      // Stored by DoReport, so they parse; a line that does not is data loss.
      if (absl::Status s = proto::ParseJson(lines[i], &reports[i]); !s.ok()) {
        return absl::DataLossError(
            Cat("measurement ", i + 1, " of '", name, "' does not parse: ", View(s.message())));
      }
    }
    MOEPLAN_ASSIGN_OR_RETURN(
        calibration::RefitResult r,
        calibration::RefitFromReports(entry->message, reports, calibration::OpContextOptions{},
                                      Cat(source, ", ", lines.size(), " measurements")));
    absl::StatusOr<std::shared_ptr<const ProfileEntry>> stored = store_.Put(r.profile);
    if (!stored.ok()) return Under("profile.", stored.status());
    cache_.EraseProfile(name);
    *resp->mutable_profile() = (*stored)->message;
    resp->set_report(std::move(r.report));
    resp->set_measurements(lines.size());
    resp->set_used(static_cast<uint64_t>(r.used));
    return absl::OkStatus();
  }

  // The background refits of HandlerOptions::refit_every, in report order.
  void RefitLoop() {
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
      log_.Log("RefitProfile(background)", s, start, "-", name);
    }
  }

  ProfileStore& store_;
  PlanCache& cache_;
  const HandlerOptions options_;
  const int max_model_plans_;
  std::atomic<int> model_plans_{0};
  RequestLog log_;
  std::mutex refit_mu_;  // one refit at a time
  std::mutex queue_mu_;  // guards queue_ and stopping_
  std::condition_variable queue_cv_;
  std::deque<std::string> queue_;
  bool stopping_ = false;
  std::atomic<uint64_t> background_refits_{0}, background_refit_failures_{0};
  std::thread refit_worker_;  // started last, stopped first (~Impl)
};

Handlers::Handlers(ProfileStore* store, PlanCache* cache, const HandlerOptions& options)
    : options_(options), impl_(std::make_unique<Impl>(store, cache, options)) {}
Handlers::~Handlers() = default;

int Handlers::model_plans_running() const { return impl_->model_plans_running(); }
uint64_t Handlers::background_refits() const { return impl_->background_refits(); }
uint64_t Handlers::background_refit_failures() const { return impl_->background_refit_failures(); }
absl::Status Handlers::RefitProfile(const CallContext& ctx, const v1::RefitProfileRequest& req,
                                    v1::RefitProfileResponse* resp) {
  return impl_->RefitProfile(ctx, &req, resp);
}

bool Handlers::PlanModelCached(const CallContext& ctx, const v1::PlanModelRequest& req,
                               v1::PlanModelResponse* resp, absl::Status* status) {
  return impl_->PlanModelCached(ctx, &req, resp, status);
}

absl::Status Handlers::PlanLayer(const CallContext& ctx, const v1::PlanLayerRequest& req,
                                 v1::PlanLayerResponse* resp) {
  return impl_->PlanLayer(ctx, &req, resp);
}
absl::Status Handlers::PlanModel(const CallContext& ctx, const v1::PlanModelRequest& req,
                                 v1::PlanModelResponse* resp) {
  return impl_->PlanModel(ctx, &req, resp);
}
absl::Status Handlers::ListProfiles(const CallContext& ctx, const v1::ListProfilesRequest& req,
                                    v1::ListProfilesResponse* resp) {
  return impl_->ListProfiles(ctx, &req, resp);
}
absl::Status Handlers::GetProfile(const CallContext& ctx, const v1::GetProfileRequest& req,
                                  v1::ClusterProfile* resp) {
  return impl_->GetProfile(ctx, &req, resp);
}
absl::Status Handlers::PutProfile(const CallContext& ctx, const v1::PutProfileRequest& req,
                                  v1::PutProfileResponse* resp) {
  return impl_->PutProfile(ctx, &req, resp);
}
absl::Status Handlers::ReportMeasurement(const CallContext& ctx,
                                         const v1::ReportMeasurementRequest& req,
                                         v1::ReportMeasurementResponse* resp) {
  return impl_->ReportMeasurement(ctx, &req, resp);
}

}  // namespace moeplan::server
