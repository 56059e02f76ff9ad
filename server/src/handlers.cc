// The Planner service's handlers (handlers.h, handlers_internal.h): the
// checks every RPC shares, the request log and the plan RPCs (request
// validation, profile resolution, the plan cache, the limits on one request's
// work). The profile store's RPCs are in handlers_profiles.cc. No gRPC here;
// server.cc adapts its contexts.
#include "moeplan/server/handlers.h"

#include <google/protobuf/util/message_differencer.h>
#include <spdlog/async.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_join.h"
#include "handlers_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/limits.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/requests/answer.h"

namespace moeplan::server {
namespace internal {

absl::Status Invalid(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

absl::Status Under(std::string_view prefix, const absl::Status& s) {
  if (s.code() != absl::StatusCode::kInvalidArgument &&
      s.code() != absl::StatusCode::kFailedPrecondition) {
    return s;
  }
  return absl::Status(s.code(), Cat(prefix, View(s.message())));
}

RequestLog::RequestLog(bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  static std::once_flag once;
  std::call_once(once, [] { spdlog::init_thread_pool(1 << 16, 1); });
  logger_ = std::make_shared<spdlog::async_logger>(
      "moeplan-server-requests", std::make_shared<spdlog::sinks::stderr_sink_mt>(),
      spdlog::thread_pool(), spdlog::async_overflow_policy::block);
  logger_->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %v", spdlog::pattern_time_type::utc);
}

RequestLog::~RequestLog() {
  if (logger_) logger_->flush();
}

void RequestLog::Log(std::string_view method, const absl::Status& s, Clock::time_point start,
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
    logger_->info("method={} code=OK latency_us={} cache={} profile={}", method, us.count(), cache,
                  name);
  } else {
    std::string msg = Printable(View(s.message()), 512);
    for (char& c : msg) {
      if (c == '"') c = '\'';
    }
    logger_->info("method={} code={} latency_us={} cache={} profile={} error=\"{}\"", method,
                  absl::StatusCodeToString(s.code()), us.count(), cache, name, msg);
  }
}

absl::Status CheckDeadline(const CallContext& ctx) {
  if (ctx.IsCancelled()) return absl::CancelledError("the client cancelled the call");
  if (ctx.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError("the call's deadline passed before planning started");
  }
  return absl::OkStatus();
}

}  // namespace internal

bool BearerTokenMatches(std::string_view authorization, std::string_view want) {
  if (authorization.substr(0, kBearer.size()) != kBearer) return false;
  const std::string_view token = authorization.substr(kBearer.size());
  unsigned diff = token.size() == want.size() ? 0u : 1u;
  for (size_t i = 0; i < want.size(); ++i) {
    const unsigned char a = static_cast<unsigned char>(want[i]);
    const unsigned char b = i < token.size() ? static_cast<unsigned char>(token[i]) : 0u;
    diff |= static_cast<unsigned>(a ^ b);
  }
  return diff == 0;
}

namespace {

namespace p = ::moeplan::planner;
using internal::CheckDeadline;
using internal::Clock;
using internal::Invalid;
using internal::Under;

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

Handlers::Impl::Impl(ProfileStore* store, PlanCache* cache, const HandlerOptions& options)
    : store_(*store),
      cache_(*cache),
      options_(options),
      max_model_plans_(options.max_model_plans > 0
                           ? options.max_model_plans
                           : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
      log_(options.log_requests) {
  if (options_.refit_every > 0) refit_worker_ = std::thread([this] { RefitLoop(); });
}

Handlers::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (refit_worker_.joinable()) refit_worker_.join();
}

absl::Status Handlers::Impl::Authorize(const CallContext& ctx, std::string_view method,
                                       bool write) const {
  if (options_.token.empty() || (!write && !options_.token_for_reads)) return absl::OkStatus();
  const std::string_view got = ctx.Authorization();
  if (got.substr(0, kBearer.size()) != kBearer) {
    return absl::UnauthenticatedError(
        Cat(method,
            " needs the server's bearer token: call metadata 'authorization: Bearer "
            "<token>' (the clients' --token-file)"));
  }
  if (!BearerTokenMatches(got, options_.token)) {
    return absl::UnauthenticatedError(Cat(method, ": the bearer token is not the server's"));
  }
  return absl::OkStatus();
}

void Handlers::Impl::Done(Method m, const absl::Status& s, Clock::time_point start,
                          std::string_view cache, std::string_view profile) {
  metrics_.Request(m, s.code(), Clock::now() - start);
  // The refusals no other site counts: only the token check answers
  // UNAUTHENTICATED, only a passed deadline DEADLINE_EXCEEDED.
  if (s.code() == absl::StatusCode::kUnauthenticated) metrics_.Refuse(Refusal::kUnauthenticated);
  if (s.code() == absl::StatusCode::kDeadlineExceeded) metrics_.Refuse(Refusal::kPlanDeadline);
  log_.Log(MethodName(m), s, start, cache, profile);
}

absl::Status Handlers::Impl::CheckSize(const google::protobuf::Message& resp) const {
  const size_t bytes = resp.ByteSizeLong();
  if (bytes <= options_.max_response_bytes) return absl::OkStatus();
  metrics_.Refuse(Refusal::kResponseTooLarge);
  return absl::ResourceExhaustedError(
      Cat("response: ", bytes, " bytes exceed the message limit of ", options_.max_response_bytes,
          " bytes (moeplan-server --max-message-mib); ask without include_timeline or for less"));
}

p::Deadline Handlers::Impl::PlanDeadline(const CallContext& ctx) const {
  const auto now = std::chrono::system_clock::now();
  const auto left = ctx.deadline() == std::chrono::system_clock::time_point::max()
                        ? std::chrono::system_clock::duration::max()
                        : ctx.deadline() - now;
  const auto limit =
      std::chrono::duration_cast<std::chrono::system_clock::duration>(options_.max_plan_time);
  return p::Deadline{Clock::now() +
                     std::chrono::duration_cast<Clock::duration>(std::min(left, limit))};
}

absl::Status Handlers::Impl::UnknownProfile(std::string_view field, std::string_view name) const {
  std::vector<std::string> names = store_.Names();
  const size_t more = names.size() > kListed ? names.size() - kListed : 0;
  names.resize(std::min(names.size(), kListed));
  return absl::NotFoundError(Cat(
      field, ": no profile named '", Printable(name, 64), "' (known: ", absl::StrJoin(names, ", "),
      more > 0 ? Cat(" and ", more, " more; ListProfiles lists them") : std::string(), ")"));
}

template <class Response, class Plan>
absl::Status Handlers::Impl::PlanTyped(const CallContext& ctx, Method m, Response* resp,
                                       Plan plan) {
  const std::string_view method = MethodName(m);
  const auto start = Clock::now();
  std::string_view cache_state = "-";
  std::string profile_name;
  absl::Status s = Authorize(ctx, method, false);
  if (s.ok()) {
    s = Guard(resp, [&]() -> absl::Status {
      MOEPLAN_ASSIGN_OR_RETURN(PlanCache::Value bytes, plan(&cache_state, &profile_name));
      if (!resp->ParseFromString(*bytes)) {
        return absl::InternalError(Cat(method, ": a cached response does not parse"));
      }
      return absl::OkStatus();
    });
  }
  if (!s.ok()) resp->Clear();
  Done(m, s, start, cache_state, profile_name);
  return s;
}

absl::Status Handlers::Impl::PlanLayer(const CallContext& ctx, const v1::PlanLayerRequest* req,
                                       v1::PlanLayerResponse* resp) {
  return PlanTyped(ctx, Method::kPlanLayer, resp,
                   [&](std::string_view* state, std::string* profile) {
                     return DoPlanLayer(ctx, *req, state, profile);
                   });
}

absl::Status Handlers::Impl::PlanModel(const CallContext& ctx, const v1::PlanModelRequest* req,
                                       v1::PlanModelResponse* resp) {
  return PlanTyped(ctx, Method::kPlanModel, resp,
                   [&](std::string_view* state, std::string* profile) {
                     return DoPlanModel(ctx, *req, state, profile);
                   });
}

template <class Request, class Plan>
absl::Status Handlers::Impl::PlanBytes(const CallContext& ctx, Method m, std::string_view request,
                                       PlanCache::Value* response, const Resume& resume,
                                       Plan plan) {
  const std::string_view method = MethodName(m);
  const Clock::time_point start = resume.resumed ? resume.arrived : Clock::now();
  std::string_view cache_state = "-";
  std::string profile_name;
  response->reset();
  absl::Status s = Authorize(ctx, method, false);
  if (s.ok()) s = CheckDeadline(ctx);
  if (!s.ok()) {
    Done(m, s, start, cache_state, profile_name);
    return s;
  }
  s = Guard(nullptr, [&]() -> absl::Status {
    // The method's name leads the key: the same bytes may parse as either
    // request. Large requests (inline profiles, padding) skip this level: a
    // key of their size would let a few of them flush the cache unplanned.
    const bool raw = request.size() <= kMaxRawRequestBytes;
    std::string key;
    if (raw) {
      key.reserve(method.size() + 1 + request.size());
      key.append(method).push_back('\0');
      key.append(request);
      *response = cache_.GetRaw(key, &profile_name, /*count=*/!resume.resumed);
      if (*response != nullptr) {
        cache_state = "hit";
        return absl::OkStatus();
      }
    }
    // Read before the profile is resolved: a profile put while this plan runs
    // keeps the plan from the first level (its key does not name the version).
    const uint64_t generation = cache_.generation();
    Request req;
    if (!req.ParseFromArray(request.data(), static_cast<int>(request.size()))) {
      return Invalid(Cat("request: not a serialised ", Request::descriptor()->name()));
    }
    MOEPLAN_ASSIGN_OR_RETURN(*response, plan(req, &cache_state, &profile_name));
    // Kept under these bytes once the plan is asked for again (found by its
    // canonical key): a request seen once, as every uncached one is, adds no
    // entry and evicts nothing for its bytes.
    if (raw && *response != nullptr && cache_state == "hit") {
      cache_.PutRaw(key, *response, profile_name, generation);
    }
    return absl::OkStatus();
  });
  if (!s.ok()) response->reset();
  if (!s.ok() || *response != nullptr) Done(m, s, start, cache_state, profile_name);
  return s;
}

absl::Status Handlers::Impl::PlanLayerBytes(const CallContext& ctx, std::string_view request,
                                            PlanCache::Value* response) {
  return PlanBytes<v1::PlanLayerRequest>(
      ctx, Method::kPlanLayer, request, response, Resume{},
      [&](const v1::PlanLayerRequest& req, std::string_view* state, std::string* profile) {
        return DoPlanLayer(ctx, req, state, profile);
      });
}

absl::Status Handlers::Impl::PlanModelBytes(const CallContext& ctx, std::string_view request,
                                            bool plan_miss, PlanCache::Value* response,
                                            std::optional<Clock::time_point> arrived) {
  const Resume resume{arrived.has_value(), arrived.value_or(Clock::time_point{})};
  return PlanBytes<v1::PlanModelRequest>(
      ctx, Method::kPlanModel, request, response, resume,
      [&](const v1::PlanModelRequest& req, std::string_view* state, std::string* profile) {
        return DoPlanModel(ctx, req, state, profile, !plan_miss, !resume.resumed);
      });
}

template <class Request>
absl::StatusOr<std::shared_ptr<const ProfileEntry>> Handlers::Impl::ResolveProfile(
    const Request& req, std::string* profile_name, std::string* inline_bytes) {
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

absl::StatusOr<PlanCache::Value> Handlers::Impl::DoPlanModel(const CallContext& ctx,
                                                             const v1::PlanModelRequest& req,
                                                             std::string_view* cache_state,
                                                             std::string* profile_name, bool defer,
                                                             bool count_lookup) {
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
  if (PlanCache::Value hit = cache_.Get(key, count_lookup)) {
    *cache_state = "hit";
    return hit;
  }
  *cache_state = "miss";
  if (defer) return PlanCache::Value();
  // Whole-model plans take milliseconds to seconds, and a search's memory
  // grows with its candidates: only max_model_plans run at once.
  const int running = model_plans_.fetch_add(1) + 1;
  absl::Cleanup release = [this] { model_plans_.fetch_sub(1); };
  if (running > max_model_plans_) {
    *cache_state = "busy";
    metrics_.Refuse(Refusal::kModelPlansBusy);
    return absl::ResourceExhaustedError(
        Cat("server busy: ", max_model_plans_,
            " uncached model plans are running (moeplan-server --max-model-plans); retry later"));
  }
  // A planner per call keeps no per-thread state alive between them.
  p::ModelPlanner planner(entry->cost);
  v1::PlanModelResponse resp;
  MOEPLAN_RETURN_IF_ERROR(
      requests::AnswerPlanModel(*model, req, planner, entry->profile, &resp, PlanDeadline(ctx)));
  MOEPLAN_RETURN_IF_ERROR(CheckDeadline(ctx));
  return Keep(key, resp);
}

absl::StatusOr<PlanCache::Value> Handlers::Impl::DoPlanLayer(const CallContext& ctx,
                                                             const v1::PlanLayerRequest& req,
                                                             std::string_view* cache_state,
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
    return hit;
  }
  *cache_state = "miss";
  thread_local ThreadPlanner tls;
  v1::PlanLayerResponse resp;
  if (inline_bytes.empty()) {
    MOEPLAN_RETURN_IF_ERROR(
        requests::AnswerPlanLayer(*layer, canonical, tls.For(entry), entry->profile, &resp));
  } else {
    p::LayerPlanner planner(entry->cost);
    MOEPLAN_RETURN_IF_ERROR(
        requests::AnswerPlanLayer(*layer, canonical, planner, entry->profile, &resp));
  }
  return Keep(key, resp);
}

absl::StatusOr<PlanCache::Value> Handlers::Impl::Keep(const std::string& key,
                                                      const google::protobuf::Message& resp) {
  MOEPLAN_RETURN_IF_ERROR(CheckSize(resp));
  PlanCache::Value bytes = SerializeDeterministic(resp);
  if (bytes == nullptr) return absl::InternalError("response: does not serialise");
  cache_.Put(key, bytes);
  return bytes;
}

Handlers::Handlers(ProfileStore* store, PlanCache* cache, const HandlerOptions& options)
    : options_(options), impl_(std::make_unique<Impl>(store, cache, options)) {}
Handlers::~Handlers() = default;

Metrics& Handlers::metrics() { return impl_->metrics(); }

int Handlers::model_plans_running() const { return impl_->model_plans_running(); }
uint64_t Handlers::background_refits() const { return impl_->background_refits(); }
uint64_t Handlers::background_refit_failures() const { return impl_->background_refit_failures(); }
absl::Status Handlers::RefitProfile(const CallContext& ctx, const v1::RefitProfileRequest& req,
                                    v1::RefitProfileResponse* resp) {
  return impl_->RefitProfile(ctx, &req, resp);
}

absl::Status Handlers::PlanLayerBytes(const CallContext& ctx, std::string_view request,
                                      PlanCache::Value* response) {
  return impl_->PlanLayerBytes(ctx, request, response);
}
absl::Status Handlers::PlanModelBytes(
    const CallContext& ctx, std::string_view request, bool plan_miss, PlanCache::Value* response,
    std::optional<std::chrono::steady_clock::time_point> arrived) {
  return impl_->PlanModelBytes(ctx, request, plan_miss, response, arrived);
}

void Handlers::Answered(Method m, const absl::Status& s,
                        std::chrono::steady_clock::time_point arrived) {
  impl_->Answered(m, s, arrived);
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
