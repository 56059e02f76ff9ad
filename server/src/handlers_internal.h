// Handlers::Impl (handlers.h) and what its sources share; private to
// moeplan::handlers. No gRPC here either.
//
//   handlers.cc           the checks every RPC shares (token, response size, the
//                         plan's deadline, unknown profiles), the request log, the
//                         plan RPCs (profile resolution, the cache key, the cap on
//                         model plans) and Handlers' forwarding to Impl
//   handlers_profiles.cc  the profile store's RPCs: ListProfiles, GetProfile,
//                         PutProfile, ReportMeasurement (the checks on a report)
//                         and RefitProfile (one at a time; the --refit-every worker)
#pragma once

#include <google/protobuf/message.h>
#include <spdlog/async_logger.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/planner/limits.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/planner.h"
#include "moeplan/server/handlers.h"
#include "moeplan/server/metrics.h"
#include "moeplan/server/plan_cache.h"
#include "moeplan/server/profile_store.h"
#include "moeplan/v1/service.pb.h"

namespace moeplan::server {
namespace internal {

using Clock = std::chrono::steady_clock;

absl::Status Invalid(std::string msg);

// Prefixes a field error with the request field it came from.
absl::Status Under(std::string_view prefix, const absl::Status& s);

absl::Status CheckDeadline(const CallContext& ctx);

// One logfmt line per request on stderr, through spdlog's async queue so the
// handlers never wait on the terminal.
class RequestLog {
 public:
  explicit RequestLog(bool enabled);
  ~RequestLog();
  void Log(std::string_view method, const absl::Status& s, Clock::time_point start,
           std::string_view cache, std::string_view profile);

 private:
  bool enabled_;
  std::shared_ptr<spdlog::async_logger> logger_;
};

}  // namespace internal

class Handlers::Impl {
 public:
  Impl(ProfileStore* store, PlanCache* cache, const HandlerOptions& options);
  ~Impl();

  // handlers.cc
  absl::Status PlanLayer(const CallContext& ctx, const v1::PlanLayerRequest* req,
                         v1::PlanLayerResponse* resp);
  absl::Status PlanModel(const CallContext& ctx, const v1::PlanModelRequest* req,
                         v1::PlanModelResponse* resp);
  absl::Status PlanLayerBytes(const CallContext& ctx, std::string_view request,
                              PlanCache::Value* response);
  absl::Status PlanModelBytes(const CallContext& ctx, std::string_view request, bool plan_miss,
                              PlanCache::Value* response,
                              std::optional<internal::Clock::time_point> arrived);
  void Answered(Method m, const absl::Status& s, internal::Clock::time_point arrived) {
    Done(m, s, arrived, "-", "");
  }
  int model_plans_running() const { return model_plans_.load(); }
  Metrics& metrics() { return metrics_; }

  // handlers_profiles.cc
  absl::Status ListProfiles(const CallContext& ctx, const v1::ListProfilesRequest*,
                            v1::ListProfilesResponse* resp);
  absl::Status GetProfile(const CallContext& ctx, const v1::GetProfileRequest* req,
                          v1::ClusterProfile* resp);
  absl::Status PutProfile(const CallContext& ctx, const v1::PutProfileRequest* req,
                          v1::PutProfileResponse* resp);
  absl::Status ReportMeasurement(const CallContext& ctx, const v1::ReportMeasurementRequest* req,
                                 v1::ReportMeasurementResponse* resp);
  absl::Status RefitProfile(const CallContext& ctx, const v1::RefitProfileRequest* req,
                            v1::RefitProfileResponse* resp);
  uint64_t background_refits() const { return background_refits_.load(); }
  uint64_t background_refit_failures() const { return background_refit_failures_.load(); }

 private:
  // --- Shared by every RPC (handlers.cc) ---

  // The bearer token, where the server has one: writes always need it, reads
  // with token_for_reads. Compared in constant time (no early exit on the
  // first differing byte, nor on a shorter token).
  absl::Status Authorize(const CallContext& ctx, std::string_view method, bool write) const;

  // No request's failure ends the process: an allocation that fails (a
  // request the limits did not foresee) fails the call, with nothing cached
  // or written, and the response is cleared.
  template <class F>
  auto Guard(google::protobuf::Message* resp, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::bad_alloc&) {
      if (resp != nullptr) resp->Clear();
      metrics_.Refuse(Refusal::kOutOfMemory);
      return absl::ResourceExhaustedError(
          "the server ran out of memory answering this request; nothing was cached or stored");
    }
  }

  // An answered call: counted in the metrics and logged.
  void Done(Method m, const absl::Status& s, internal::Clock::time_point start,
            std::string_view cache, std::string_view profile);

  // A response the client could not receive is refused, and never cached.
  absl::Status CheckSize(const google::protobuf::Message& resp) const;

  // The time one plan may take: the call's deadline or max_plan_time, the earlier.
  planner::Deadline PlanDeadline(const CallContext& ctx) const;

  // NOT_FOUND at any number of stored profiles: the message names at most
  // kListed of them (it travels in the status, whose size gRPC limits), and
  // the requested name is echoed escaped and cut.
  static constexpr size_t kListed = 16;
  absl::Status UnknownProfile(std::string_view field, std::string_view name) const;

  // --- Plans (handlers.cc) ---

  // The profile a plan request names or carries inline (then `inline_bytes`
  // holds its serialisation, for the cache key).
  template <class Request>
  absl::StatusOr<std::shared_ptr<const ProfileEntry>> ResolveProfile(const Request& req,
                                                                     std::string* profile_name,
                                                                     std::string* inline_bytes);

  // The serialised response, from the cache or planned and cached. `defer`
  // set: a miss returns null at once, planning nothing. `count_lookup` false:
  // the cache lookup is not counted (a resumed call's first half counted it).
  absl::StatusOr<PlanCache::Value> DoPlanModel(const CallContext& ctx,
                                               const v1::PlanModelRequest& req,
                                               std::string_view* cache_state,
                                               std::string* profile_name, bool defer = false,
                                               bool count_lookup = true);
  absl::StatusOr<PlanCache::Value> DoPlanLayer(const CallContext& ctx,
                                               const v1::PlanLayerRequest& req,
                                               std::string_view* cache_state,
                                               std::string* profile_name);
  // Checks a planned response's size, serialises it and caches it under `key`.
  absl::StatusOr<PlanCache::Value> Keep(const std::string& key,
                                        const google::protobuf::Message& resp);
  // A plan RPC on a typed request: `plan` (a Do* above) into `resp`.
  template <class Response, class Plan>
  absl::Status PlanTyped(const CallContext& ctx, Method m, Response* resp, Plan plan);
  // A plan RPC on serialised bytes: the first-level cache by the raw bytes,
  // then the request parsed and `plan` (a Do* above); a response found by its
  // canonical key is kept under the raw bytes too. A resumed call (the second
  // half of a PlanModel the server deferred) counts from its arrival and does
  // not count its cache lookups again.
  struct Resume {
    bool resumed = false;
    internal::Clock::time_point arrived;
  };
  static constexpr size_t kMaxRawRequestBytes = 16 << 10;
  template <class Request, class Plan>
  absl::Status PlanBytes(const CallContext& ctx, Method m, std::string_view request,
                         PlanCache::Value* response, const Resume& resume, Plan plan);

  // --- Measurements and refits (handlers_profiles.cc) ---

  // Measurements feed calibration and fill the disk: each names an op of the
  // plan it measured, at most once, with a duration of at most an hour.
  static constexpr double kMaxUs = 3.6e9;  // one hour

  // The plan of a reported run, made once by its check and replayed once the
  // report is stored: a layer's or a model's, its op graph and makespan.
  struct ReportedPlan {
    planner::LayerPlan layer;
    planner::ModelPlan model;
    const planner::OpGraph* graph = nullptr;
    double predicted_us = 0.0;
  };
  // A layer's report: its schedule planned on the profile, every op one of it.
  absl::Status CheckLayerReport(const v1::ReportMeasurementRequest& req, const ProfileEntry& entry,
                                ReportedPlan* plan) const;
  // A model's report: the request plans on the profile and names the variant
  // it ran; every op is one of that plan's kinds (its name less block, step
  // and part: a plan made on an older version may split ranges otherwise).
  absl::Status CheckModelReport(const CallContext& ctx, const v1::ReportMeasurementRequest& req,
                                const ProfileEntry& entry, ReportedPlan* plan);
  template <typename IsOp>
  absl::Status CheckOps(const v1::ReportMeasurementRequest& req, IsOp is_op,
                        std::string_view plan) const;
  absl::Status DoReport(const CallContext& ctx, const v1::ReportMeasurementRequest& req,
                        v1::ReportMeasurementResponse* resp);

  // Refits the stored profile `name` from its measurement log and stores the
  // next version; the old version's cached plans are dropped. One at a time:
  // each must see the version the last one stored.
  absl::Status DoRefit(const std::string& name, std::string_view source,
                       v1::RefitProfileResponse* resp);
  // The background refits of HandlerOptions::refit_every, in report order.
  void RefitLoop();

  ProfileStore& store_;
  PlanCache& cache_;
  const HandlerOptions options_;
  const int max_model_plans_;
  std::atomic<int> model_plans_{0};
  internal::RequestLog log_;
  // Counted by const checks too (CheckSize): atomics, safe to count from any thread.
  mutable Metrics metrics_;
  std::mutex refit_mu_;  // one refit at a time
  std::mutex queue_mu_;  // guards queue_ and stopping_
  std::condition_variable queue_cv_;
  std::deque<std::string> queue_;
  bool stopping_ = false;
  std::atomic<uint64_t> background_refits_{0}, background_refit_failures_{0};
  std::thread refit_worker_;  // started last, stopped first (~Impl)
};

}  // namespace moeplan::server
