// The Planner service's handlers without gRPC: each takes its request proto and
// fills its response, so the server (server.cc adapts gRPC's contexts to
// CallContext) and the fuzz harness that feeds them arbitrary requests run the
// same code. Every request's work is bounded (docs/service.md, "Limits"): the
// planner's own limits on what one plan may build, a response-size limit
// checked before a response is cached or sent, a wall-clock limit on one plan
// and a cap on the uncached whole-model plans running at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "moeplan/server/metrics.h"
#include "moeplan/server/plan_cache.h"
#include "moeplan/server/profile_store.h"
#include "moeplan/v1/service.pb.h"

namespace moeplan::server {

// What a handler needs of its call.
class CallContext {
 public:
  virtual ~CallContext() = default;
  virtual bool IsCancelled() const = 0;
  virtual std::chrono::system_clock::time_point deadline() const = 0;
  // The call's "authorization" metadata ("Bearer <token>"), empty if none.
  virtual std::string_view Authorization() const { return {}; }
};

// A call that is never cancelled and has no deadline (tests, the fuzz harness).
class NoDeadline final : public CallContext {
 public:
  bool IsCancelled() const override { return false; }
  std::chrono::system_clock::time_point deadline() const override {
    return std::chrono::system_clock::time_point::max();
  }
};

// "Bearer <token>" with the server's token, compared in constant time (no
// early exit on the first differing byte, nor on a shorter token).
inline constexpr std::string_view kBearer = "Bearer ";
bool BearerTokenMatches(std::string_view authorization, std::string_view token);

struct HandlerOptions {
  // Largest response sent (and cached): gRPC's message limit on the server's
  // and the bundled clients' channels. A larger one is RESOURCE_EXHAUSTED.
  size_t max_response_bytes = size_t{64} << 20;
  // Uncached PlanModel calls (whole models, layouts, searches) running at once;
  // one more is refused RESOURCE_EXHAUSTED at once (clients back off and
  // retry). 0: the machine's hardware threads.
  int max_model_plans = 0;
  // Longest one plan may run; the call's own deadline applies when earlier.
  std::chrono::milliseconds max_plan_time{60000};
  bool log_requests = true;  // one structured line per request on stderr
  // Non-empty: PutProfile and ReportMeasurement (every RPC with
  // token_for_reads) need "authorization: Bearer <token>", compared in
  // constant time; without it, or with another, UNAUTHENTICATED, nothing written.
  std::string token;
  bool token_for_reads = false;
  // > 0: after every `refit_every`-th measurement reported against a stored
  // profile, that profile is refitted (as RefitProfile) on a background
  // thread; 0: only when asked.
  int refit_every = 0;
  // A refit fits on the newest `refit_window` reports of a profile's log (the
  // older ones stay stored): what bounds a refit's memory and time as the log
  // grows, and lets a changed cluster outgrow its old measurements.
  int refit_window = 1000;
};

class Handlers {
 public:
  Handlers(ProfileStore* store, PlanCache* cache, const HandlerOptions& options);
  ~Handlers();
  Handlers(const Handlers&) = delete;
  Handlers& operator=(const Handlers&) = delete;

  absl::Status PlanLayer(const CallContext& ctx, const v1::PlanLayerRequest& req,
                         v1::PlanLayerResponse* resp);
  absl::Status PlanModel(const CallContext& ctx, const v1::PlanModelRequest& req,
                         v1::PlanModelResponse* resp);
  // The plan RPCs on serialised messages, as the server receives and sends
  // them: `request` is the request's bytes as they arrived, `*response` the
  // cached serialisation of the response, shared and sent as it is. A request
  // whose exact bytes were answered from the cache before is found by them (the
  // cache's first level), parsing and serialising nothing; docs/service.md
  // "Plan cache".
  absl::Status PlanLayerBytes(const CallContext& ctx, std::string_view request,
                              PlanCache::Value* response);
  // `plan_miss` false: PlanModel's cheap part, which answers a cache hit or a
  // bad request and, on a miss, returns OK with `*response` null and plans
  // nothing. The server then calls again with true on its own threads, so
  // gRPC's stay free for cheap calls, passing `arrived` (the first call's
  // start): the call's latency counts from it, and the lookups the first half
  // counted are not counted again.
  absl::Status PlanModelBytes(
      const CallContext& ctx, std::string_view request, bool plan_miss, PlanCache::Value* response,
      std::optional<std::chrono::steady_clock::time_point> arrived = std::nullopt);
  // A call the server answered without the handlers (its planning queue
  // full, its bytes unreadable): counted and logged as any other.
  void Answered(Method m, const absl::Status& s, std::chrono::steady_clock::time_point arrived);
  absl::Status ListProfiles(const CallContext& ctx, const v1::ListProfilesRequest& req,
                            v1::ListProfilesResponse* resp);
  absl::Status GetProfile(const CallContext& ctx, const v1::GetProfileRequest& req,
                          v1::ClusterProfile* resp);
  absl::Status PutProfile(const CallContext& ctx, const v1::PutProfileRequest& req,
                          v1::PutProfileResponse* resp);
  absl::Status ReportMeasurement(const CallContext& ctx, const v1::ReportMeasurementRequest& req,
                                 v1::ReportMeasurementResponse* resp);
  // Refits a stored profile from its reported measurements and stores the
  // next version (docs/service.md "Refits"); one refit runs at a time.
  absl::Status RefitProfile(const CallContext& ctx, const v1::RefitProfileRequest& req,
                            v1::RefitProfileResponse* resp);
  // Background refits (HandlerOptions::refit_every) finished so far, and
  // those that failed (each logged with its reason).
  uint64_t background_refits() const;
  uint64_t background_refit_failures() const;

  const HandlerOptions& options() const { return options_; }
  // Uncached PlanModel calls running now.
  int model_plans_running() const;
  // What the handlers count (requests, latency, refusals, stored
  // measurements, refits); the server's --metrics endpoint renders it.
  Metrics& metrics();

 private:
  class Impl;
  HandlerOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::server
