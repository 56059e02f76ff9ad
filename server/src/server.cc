// The gRPC translation unit of the server: the Planner service, health,
// reflection, start and shutdown. The handlers' logic (PlannerCore) is shared by
// two thin adapters: the callback API (default; handlers answer inline on gRPC's
// own pool: a cached plan is a copy, an uncached one ~10 us of planning) and the
// synchronous API, used when --threads caps the handler threads (gRPC 1.51's
// resource quota bounds only the synchronous server's threads).
#include "moeplan/server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/async.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_join.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/validate.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/v1/service.grpc.pb.h"

namespace moeplan::server {
namespace {

namespace p = ::moeplan::planner;
using Clock = std::chrono::steady_clock;

// absl and gRPC share the canonical status codes one to one.
grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status Invalid(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

// Prefixes a field error with the request field it came from.
absl::Status Under(std::string_view prefix, const absl::Status& s) {
  if (s.code() != absl::StatusCode::kInvalidArgument &&
      s.code() != absl::StatusCode::kFailedPrecondition) {
    return s;
  }
  return absl::Status(s.code(), Cat(prefix, View(s.message())));
}

const char* CodeName(absl::StatusCode c) {
  switch (c) {
    case absl::StatusCode::kOk:
      return "OK";
    case absl::StatusCode::kCancelled:
      return "CANCELLED";
    case absl::StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case absl::StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case absl::StatusCode::kNotFound:
      return "NOT_FOUND";
    case absl::StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case absl::StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case absl::StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case absl::StatusCode::kDataLoss:
      return "DATA_LOSS";
    case absl::StatusCode::kInternal:
      return "INTERNAL";
    case absl::StatusCode::kUnavailable:
      return "UNAVAILABLE";
    default:
      return "UNKNOWN";
  }
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
                    CodeName(s.code()), us.count(), cache, name, msg);
    }
  }

 private:
  bool enabled_;
  std::shared_ptr<spdlog::async_logger> logger_;
};

absl::Status CheckDeadline(grpc::ServerContextBase* ctx) {
  if (ctx->IsCancelled()) return absl::CancelledError("the client cancelled the call");
  if (ctx->deadline() <= std::chrono::system_clock::now()) {
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

class PlannerCore {
 public:
  PlannerCore(ProfileStore* store, PlanCache* cache, bool log_requests)
      : store_(*store), cache_(*cache), log_(log_requests) {}

  absl::Status PlanLayer(grpc::ServerContextBase* ctx, const v1::PlanLayerRequest* req,
                         v1::PlanLayerResponse* resp) {
    const auto start = Clock::now();
    std::string_view cache_state = "-";
    std::string profile_name;
    absl::Status s = DoPlanLayer(ctx, *req, resp, &cache_state, &profile_name);
    log_.Log("PlanLayer", s, start, cache_state, profile_name);
    return s;
  }

  absl::Status PlanModel(grpc::ServerContextBase* ctx, const v1::PlanModelRequest* req,
                         v1::PlanModelResponse* resp) {
    const auto start = Clock::now();
    std::string_view cache_state = "-";
    std::string profile_name;
    absl::Status s = DoPlanModel(ctx, *req, resp, &cache_state, &profile_name);
    log_.Log("PlanModel", s, start, cache_state, profile_name);
    return s;
  }

  absl::Status ListProfiles(const v1::ListProfilesRequest*, v1::ListProfilesResponse* resp) {
    const auto start = Clock::now();
    for (const auto& e : store_.List()) {
      v1::ProfileSummary* s = resp->add_profiles();
      s->set_name(e->message.name());
      s->set_version(e->message.version());
      s->set_source(e->message.source());
      s->set_nodes(e->message.nodes());
      s->set_gpus_per_node(e->message.gpus_per_node());
      s->set_comment(e->message.comment());
    }
    log_.Log("ListProfiles", absl::OkStatus(), start, "-", "");
    return absl::OkStatus();
  }

  absl::Status GetProfile(const v1::GetProfileRequest* req, v1::ClusterProfile* resp) {
    const auto start = Clock::now();
    absl::Status s;
    if (req->name().empty()) {
      s = Invalid("name: required");
    } else if (auto e = store_.Get(req->name())) {
      *resp = e->message;
    } else {
      s = UnknownProfile("name", req->name());
    }
    log_.Log("GetProfile", s, start, "-", req->name());
    return s;
  }

  absl::Status PutProfile(const v1::PutProfileRequest* req, v1::PutProfileResponse* resp) {
    const auto start = Clock::now();
    absl::Status s;
    if (!req->has_profile()) {
      s = Invalid("profile: required");
    } else {
      absl::StatusOr<std::shared_ptr<const ProfileEntry>> e = store_.Put(req->profile());
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

  absl::Status ReportMeasurement(const v1::ReportMeasurementRequest* req,
                                 v1::ReportMeasurementResponse* resp) {
    const auto start = Clock::now();
    absl::Status s = DoReport(*req, resp);
    log_.Log("ReportMeasurement", s, start, "-", req->profile_name());
    return s;
  }

 private:
  // NOT_FOUND at any number of stored profiles: the message names at most
  // kListed of them (it travels in the status, whose size gRPC limits), and
  // the requested name is echoed escaped and cut.
  static constexpr size_t kListed = 16;
  absl::Status UnknownProfile(std::string_view field, std::string_view name) const {
    std::vector<std::string> names = store_.Names();
    const size_t more = names.size() > kListed ? names.size() - kListed : 0;
    names.resize(std::min(names.size(), kListed));
    return absl::NotFoundError(
        Cat(field, ": no profile named '", Printable(name, 64), "' (known: ",
            absl::StrJoin(names, ", "),
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
      absl::StatusOr<std::shared_ptr<const ProfileEntry>> e = MakeProfileEntry(req.profile(), false);
      if (!e.ok()) return Under("profile.", e.status());
      *inline_bytes = req.profile().SerializeAsString();
      return e;
    }
    return Invalid("profile_name: required (or an inline profile)");
  }

  absl::Status DoPlanModel(grpc::ServerContextBase* ctx, const v1::PlanModelRequest& req,
                           v1::PlanModelResponse* resp, std::string_view* cache_state,
                           std::string* profile_name) {
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
    const std::string key =
        PlanCacheKey(entry->message.name(), entry->message.version(),
                     Cat("model", std::string_view("\0", 1),
                         canonical.SerializeAsString(), inline_bytes));
    if (PlanCache::Value hit = cache_.Get(key)) {
      *cache_state = "hit";
      resp->CopyFrom(*hit);
      return absl::OkStatus();
    }
    *cache_state = "miss";
    // Whole-model plans take milliseconds: a planner per call keeps no
    // per-thread state alive between them.
    p::ModelPlanner planner(entry->cost);
    MOEPLAN_RETURN_IF_ERROR(proto::AnswerPlanModel(*model, req, planner, entry->profile, resp));
    MOEPLAN_RETURN_IF_ERROR(CheckDeadline(ctx));
    cache_.Put(key, std::make_shared<const v1::PlanModelResponse>(*resp));
    return absl::OkStatus();
  }

  absl::Status DoPlanLayer(grpc::ServerContextBase* ctx, const v1::PlanLayerRequest& req,
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
    const std::string key =
        PlanCacheKey(entry->message.name(), entry->message.version(),
                     Cat("layer", std::string_view("\0", 1), canonical.SerializeAsString(),
                         inline_bytes));
    if (PlanCache::Value hit = cache_.Get(key)) {
      *cache_state = "hit";
      resp->CopyFrom(*hit);
      return absl::OkStatus();
    }
    *cache_state = "miss";
    thread_local ThreadPlanner tls;
    absl::Status s =
        inline_bytes.empty()
            ? proto::AnswerPlanLayer(*layer, canonical, tls.For(entry), entry->profile, resp)
            : [&] {
                p::LayerPlanner planner(entry->cost);
                return proto::AnswerPlanLayer(*layer, canonical, planner, entry->profile, resp);
              }();
    if (!s.ok()) return s;
    cache_.Put(key, std::make_shared<const v1::PlanLayerResponse>(*resp));
    return absl::OkStatus();
  }

  absl::Status DoReport(const v1::ReportMeasurementRequest& req,
                        v1::ReportMeasurementResponse* resp) {
    if (req.profile_name().empty()) return Invalid("profile_name: required");
    std::shared_ptr<const ProfileEntry> entry = store_.Get(req.profile_name());
    if (!entry) return UnknownProfile("profile_name", req.profile_name());
    if (req.profile_version() < 1 || req.profile_version() > entry->message.version()) {
      return Invalid(Cat("profile_version: must be between 1 and the stored version ",
                         entry->message.version(), " (got ", req.profile_version(), ")"));
    }
    if (!req.has_plan() || !req.plan().has_layer()) return Invalid("plan.layer: required");
    absl::StatusOr<p::LayerConfig> layer = proto::LayerFromProto(req.plan().layer());
    if (!layer.ok()) return Under("plan.layer.", layer.status());
    if (absl::Status s = p::ValidateLayer(*layer, entry->profile.shape); !s.ok()) {
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
    // Measurements feed calibration and fill the disk: each names an op of the
    // plan it measured, at most once, with a duration of at most an hour.
    p::LayerPlanner planner(entry->cost);
    p::LayerPlan plan;
    const p::Schedule one[] = {*schedule};
    if (absl::Status s = planner.Plan(*layer, one, &plan); !s.ok()) {
      return Under("plan.layer.", s);
    }
    const p::OpGraph& graph = plan.candidates.front().graph();
    if (req.ops_size() > graph.size()) {
      return Invalid(Cat("ops: at most one entry per op of the plan (", graph.size(),
                         " ops) (got ", req.ops_size(), ")"));
    }
    absl::flat_hash_set<std::string> names, seen;
    for (p::OpId id = 0; id < graph.size(); ++id) names.insert(graph.op(id).Name());
    constexpr double kMaxUs = 3.6e9;  // one hour
    for (int i = 0; i < req.ops_size(); ++i) {
      const v1::MeasuredOp& op = req.ops(i);
      if (op.name().empty()) return Invalid(Cat("ops[", i, "].name: required"));
      if (!names.contains(op.name())) {
        return Invalid(Cat("ops[", i, "].name: not an op of the plan's ",
                           p::ScheduleName(*schedule), " schedule (got '",
                           Printable(op.name(), 64), "')"));
      }
      if (!seen.insert(op.name()).second) {
        return Invalid(Cat("ops[", i, "].name: each op may be reported once (got '", op.name(),
                           "' twice)"));
      }
      if (!std::isfinite(op.duration_us()) || op.duration_us() < 0 ||
          op.duration_us() > kMaxUs) {
        return Invalid(Cat("ops[", i, "].duration_us: must be finite, >= 0 and <= 3.6e9 (an hour) (got ",
                           op.duration_us(), ")"));
      }
    }
    if (!std::isfinite(req.total_us()) || req.total_us() <= 0 || req.total_us() > kMaxUs) {
      return Invalid(Cat("total_us: must be finite, > 0 and <= 3.6e9 (an hour) (got ",
                         req.total_us(), ")"));
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

  ProfileStore& store_;
  PlanCache& cache_;
  RequestLog log_;
};

// The callback API: handlers run inline on gRPC's pool and finish at once.
class CallbackPlanner final : public v1::Planner::CallbackService {
 public:
  explicit CallbackPlanner(PlannerCore* core) : core_(*core) {}
  grpc::ServerUnaryReactor* PlanLayer(grpc::CallbackServerContext* ctx,
                                      const v1::PlanLayerRequest* req,
                                      v1::PlanLayerResponse* resp) override {
    return Finish(ctx, core_.PlanLayer(ctx, req, resp));
  }
  grpc::ServerUnaryReactor* PlanModel(grpc::CallbackServerContext* ctx,
                                      const v1::PlanModelRequest* req,
                                      v1::PlanModelResponse* resp) override {
    return Finish(ctx, core_.PlanModel(ctx, req, resp));
  }
  grpc::ServerUnaryReactor* ListProfiles(grpc::CallbackServerContext* ctx,
                                         const v1::ListProfilesRequest* req,
                                         v1::ListProfilesResponse* resp) override {
    return Finish(ctx, core_.ListProfiles(req, resp));
  }
  grpc::ServerUnaryReactor* GetProfile(grpc::CallbackServerContext* ctx,
                                       const v1::GetProfileRequest* req,
                                       v1::ClusterProfile* resp) override {
    return Finish(ctx, core_.GetProfile(req, resp));
  }
  grpc::ServerUnaryReactor* PutProfile(grpc::CallbackServerContext* ctx,
                                       const v1::PutProfileRequest* req,
                                       v1::PutProfileResponse* resp) override {
    return Finish(ctx, core_.PutProfile(req, resp));
  }
  grpc::ServerUnaryReactor* ReportMeasurement(grpc::CallbackServerContext* ctx,
                                              const v1::ReportMeasurementRequest* req,
                                              v1::ReportMeasurementResponse* resp) override {
    return Finish(ctx, core_.ReportMeasurement(req, resp));
  }

 private:
  static grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& s) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  PlannerCore& core_;
};

// The synchronous API: gRPC's thread manager, bounded by the resource quota.
class SyncPlanner final : public v1::Planner::Service {
 public:
  explicit SyncPlanner(PlannerCore* core) : core_(*core) {}
  grpc::Status PlanLayer(grpc::ServerContext* ctx, const v1::PlanLayerRequest* req,
                         v1::PlanLayerResponse* resp) override {
    return ToGrpc(core_.PlanLayer(ctx, req, resp));
  }
  grpc::Status PlanModel(grpc::ServerContext* ctx, const v1::PlanModelRequest* req,
                         v1::PlanModelResponse* resp) override {
    return ToGrpc(core_.PlanModel(ctx, req, resp));
  }
  grpc::Status ListProfiles(grpc::ServerContext*, const v1::ListProfilesRequest* req,
                            v1::ListProfilesResponse* resp) override {
    return ToGrpc(core_.ListProfiles(req, resp));
  }
  grpc::Status GetProfile(grpc::ServerContext*, const v1::GetProfileRequest* req,
                          v1::ClusterProfile* resp) override {
    return ToGrpc(core_.GetProfile(req, resp));
  }
  grpc::Status PutProfile(grpc::ServerContext*, const v1::PutProfileRequest* req,
                          v1::PutProfileResponse* resp) override {
    return ToGrpc(core_.PutProfile(req, resp));
  }
  grpc::Status ReportMeasurement(grpc::ServerContext*, const v1::ReportMeasurementRequest* req,
                                 v1::ReportMeasurementResponse* resp) override {
    return ToGrpc(core_.ReportMeasurement(req, resp));
  }

 private:
  PlannerCore& core_;
};

}  // namespace

absl::Status CheckListenAddress(const std::string& listen, bool allow_public) {
  if (listen.rfind("unix:", 0) == 0) return absl::OkStatus();
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == listen.size()) {
    return Invalid(Cat("--listen: must be host:port or unix:PATH (got '", listen, "')"));
  }
  const std::string port = listen.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      std::stoi(port) > 65535) {
    return Invalid(Cat("--listen: port must be 0..65535 (got '", port, "')"));
  }
  const std::string host = listen.substr(0, colon);
  const bool loopback = host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]";
  if (!loopback && !allow_public) {
    return Invalid(Cat("--listen: '", host,
                       "' is not a loopback address; pass --allow-public to serve beyond this "
                       "machine"));
  }
  return absl::OkStatus();
}

struct PlannerServer::Impl {
  std::unique_ptr<PlannerCore> core;
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<grpc::Server> server;
  std::once_flag shutdown_once;
};

absl::StatusOr<std::unique_ptr<PlannerServer>> PlannerServer::Start(
    const ServerOptions& options, ProfileStore::OpenReport* report) {
  MOEPLAN_RETURN_IF_ERROR(CheckListenAddress(options.listen, options.allow_public));
  if (options.threads < 0)
    return Invalid(Cat("--threads: must be >= 0 (got ", options.threads, ")"));
  std::unique_ptr<PlannerServer> out(new PlannerServer());
  absl::StatusOr<std::unique_ptr<ProfileStore>> store =
      ProfileStore::Open(options.data_dir, report);
  if (!store.ok()) return store.status();
  out->store_ = *std::move(store);
  out->cache_ = std::make_unique<PlanCache>(options.cache_entries, options.cache_bytes);
  out->impl_ = std::make_unique<Impl>();
  out->impl_->core =
      std::make_unique<PlannerCore>(out->store_.get(), out->cache_.get(), options.log_requests);
  if (options.threads > 0) {
    out->impl_->service = std::make_unique<SyncPlanner>(out->impl_->core.get());
  } else {
    out->impl_->service = std::make_unique<CallbackPlanner>(out->impl_->core.get());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &out->port_);
  builder.RegisterService(out->impl_->service.get());
  if (options.threads > 0) {
    // The synchronous thread manager keeps one thread polling: a call that
    // takes the last poller must start a replacement or is refused with
    // RESOURCE_EXHAUSTED. Counting the poller lets N calls run at once; with a
    // cap of exactly N, a sequential client was refused whenever the previous
    // call's thread had not yet returned to the pool (seen under TSan).
    grpc::ResourceQuota quota("moeplan-server");
    quota.SetMaxThreads(options.threads + 1);
    builder.SetResourceQuota(quota);
  }
  out->impl_->server = builder.BuildAndStart();
  if (!out->impl_->server || (out->port_ == 0 && options.listen.rfind("unix:", 0) != 0)) {
    return absl::UnavailableError(
        Cat("--listen: cannot listen on ", options.listen, " (address in use or not available)"));
  }
  if (grpc::HealthCheckServiceInterface* h = out->impl_->server->GetHealthCheckService()) {
    h->SetServingStatus(v1::Planner::service_full_name(), true);
  }
  out->address_ = options.listen.rfind("unix:", 0) == 0
                      ? options.listen
                      : Cat(options.listen.substr(0, options.listen.rfind(':')), ":", out->port_);
  return out;
}

PlannerServer::~PlannerServer() {
  if (impl_ && impl_->server) {
    Shutdown(std::chrono::milliseconds(0));
    impl_->server->Wait();
  }
}

void PlannerServer::Shutdown(std::chrono::milliseconds drain) {
  std::call_once(impl_->shutdown_once, [&] {
    if (grpc::HealthCheckServiceInterface* h = impl_->server->GetHealthCheckService()) {
      h->SetServingStatus(false);
    }
    impl_->server->Shutdown(std::chrono::system_clock::now() + drain);
  });
}

void PlannerServer::Wait() { impl_->server->Wait(); }

}  // namespace moeplan::server
