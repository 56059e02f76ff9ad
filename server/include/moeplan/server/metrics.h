// The server's Prometheus metrics (docs/service.md "Metrics"): what the
// handlers count as they answer (requests by method and status code, latency
// histograms, refusals by reason, measurements stored, refits) and, read at
// scrape time, what the cache, the store and the planning threads hold.
// Counting is lock-free and allocation-free (relaxed atomics in fixed arrays,
// indexed by method, code and bucket), so it costs a cached plan nothing it
// could measure; rendering the text exposition format is the scrape's work.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace moeplan::server {

class PlanCache;
class ProfileStore;

// The RPCs counted, in the order the metrics list them.
enum class Method : uint8_t {
  kPlanLayer,
  kPlanModel,
  kListProfiles,
  kGetProfile,
  kPutProfile,
  kReportMeasurement,
  kRefitProfile,
  kCount
};
std::string_view MethodName(Method m);

// Why the server refused work it would otherwise have done: its own limits,
// not the request's errors (docs/service.md "Limits").
enum class Refusal : uint8_t {
  kModelPlansBusy,    // --max-model-plans running and the queue full
  kResponseTooLarge,  // over --max-message-mib
  kPlanDeadline,      // the call's deadline or --max-plan-seconds passed
  kOutOfMemory,       // an allocation failed answering it
  kUnauthenticated,   // no bearer token, or another one
  kCount
};
std::string_view RefusalName(Refusal r);

// What is read at scrape time rather than counted.
struct MetricsSources {
  const PlanCache* cache = nullptr;
  const ProfileStore* store = nullptr;
  std::function<int()> model_plans_running;  // uncached model plans running now
  std::function<int()> model_plans_queued;   // waiting for a planning thread
  int max_model_plans = 0;
};

class Metrics {
 public:
  // The latency histogram's upper bounds, in seconds: 25 us (a cached plan)
  // to a minute (a large search); one more bucket, +Inf, above them.
  static constexpr std::array<double, 18> kLatencyBounds = {
      25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
      25e-3, 50e-3, 0.1,    0.25,   0.5,    1.0,  5.0,    15.0, 60.0};

  Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // One answered call: its method, status and latency.
  void Request(Method m, absl::StatusCode code, std::chrono::nanoseconds latency);
  void Refuse(Refusal r) { refusals_[static_cast<size_t>(r)].fetch_add(1, kRelaxed); }
  void MeasurementStored() { measurements_.fetch_add(1, kRelaxed); }
  // A refit asked for (RefitProfile) or run in the background (--refit-every).
  void Refit(bool background, bool ok);

  uint64_t requests(Method m, absl::StatusCode code) const;
  uint64_t refusals(Refusal r) const { return refusals_[static_cast<size_t>(r)].load(kRelaxed); }

  // The text exposition format (version 0.0.4), every family with HELP and
  // TYPE; what `sources` names is read now.
  std::string Render(const MetricsSources& sources) const;

 private:
  static constexpr auto kRelaxed = std::memory_order_relaxed;
  static constexpr size_t kMethods = static_cast<size_t>(Method::kCount);
  static constexpr size_t kCodes = 17;  // absl's canonical codes, 0..16
  static constexpr size_t kBuckets = kLatencyBounds.size() + 1;
  struct Latency {
    std::array<std::atomic<uint64_t>, kBuckets> buckets{};  // not cumulative
    std::atomic<uint64_t> sum_ns{0};
  };
  void RenderRequests(std::string* out) const;
  void RenderLatency(std::string* out) const;
  void RenderCounters(std::string* out) const;
  const std::chrono::system_clock::time_point started_;
  std::array<std::array<std::atomic<uint64_t>, kCodes>, kMethods> requests_{};
  std::array<Latency, kMethods> latency_{};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Refusal::kCount)> refusals_{};
  std::atomic<uint64_t> measurements_{0};
  std::array<std::atomic<uint64_t>, 4> refits_{};  // [background][ok]
};

}  // namespace moeplan::server
