#include "moeplan/server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "moeplan/server/plan_cache.h"
#include "moeplan/server/profile_store.h"

#ifndef MOEPLAN_VERSION
#define MOEPLAN_VERSION "unknown"
#endif

namespace moeplan::server {
namespace {

// A family's HELP and TYPE lines.
void Family(std::string* out, std::string_view name, std::string_view type, std::string_view help) {
  fmt::format_to(std::back_inserter(*out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

template <class T>
void Sample(std::string* out, std::string_view name, std::string_view labels, T value) {
  if (labels.empty()) {
    fmt::format_to(std::back_inserter(*out), "{} {}\n", name, value);
  } else {
    fmt::format_to(std::back_inserter(*out), "{}{{{}}} {}\n", name, labels, value);
  }
}

// A gauge or counter of one sample, with its HELP and TYPE.
template <class T>
void One(std::string* out, std::string_view name, std::string_view type, std::string_view help,
         T value) {
  Family(out, name, type, help);
  Sample(out, name, "", value);
}

}  // namespace

std::string_view MethodName(Method m) {
  static constexpr std::array<std::string_view, static_cast<size_t>(Method::kCount)> kNames = {
      "PlanLayer",  "PlanModel",         "ListProfiles", "GetProfile",
      "PutProfile", "ReportMeasurement", "RefitProfile"};
  return kNames[static_cast<size_t>(m)];
}

std::string_view RefusalName(Refusal r) {
  static constexpr std::array<std::string_view, static_cast<size_t>(Refusal::kCount)> kNames = {
      "model_plans_busy", "response_too_large", "plan_deadline", "out_of_memory",
      "unauthenticated"};
  return kNames[static_cast<size_t>(r)];
}

Metrics::Metrics() : started_(std::chrono::system_clock::now()) {}

void Metrics::Request(Method m, absl::StatusCode code, std::chrono::nanoseconds latency) {
  const size_t method = static_cast<size_t>(m);
  const size_t c = std::min(static_cast<size_t>(code), kCodes - 1);
  requests_[method][c].fetch_add(1, kRelaxed);
  const double s = std::chrono::duration<double>(latency).count();
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(kLatencyBounds.begin(), kLatencyBounds.end(), s) - kLatencyBounds.begin());
  latency_[method].buckets[bucket].fetch_add(1, kRelaxed);
  latency_[method].sum_ns.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, latency.count())),
                                    kRelaxed);
}

void Metrics::Refit(bool background, bool ok) {
  refits_[(background ? 2 : 0) + (ok ? 1 : 0)].fetch_add(1, kRelaxed);
}

uint64_t Metrics::requests(Method m, absl::StatusCode code) const {
  return requests_[static_cast<size_t>(m)][std::min(static_cast<size_t>(code), kCodes - 1)].load(
      kRelaxed);
}

void Metrics::RenderRequests(std::string* out) const {
  constexpr std::string_view kName = "moeplan_requests_total";
  Family(out, kName, "counter", "Calls answered, by method and gRPC status code.");
  for (size_t m = 0; m < kMethods; ++m) {
    for (size_t c = 0; c < kCodes; ++c) {
      const uint64_t n = requests_[m][c].load(kRelaxed);
      // Every method's OK is listed, at zero too; other codes once they occur.
      if (n == 0 && c != 0) continue;
      const std::string code = absl::StatusCodeToString(static_cast<absl::StatusCode>(c));
      Sample(out, kName,
             fmt::format("method=\"{}\",code=\"{}\"", MethodName(static_cast<Method>(m)), code), n);
    }
  }
}

void Metrics::RenderLatency(std::string* out) const {
  constexpr std::string_view kName = "moeplan_request_duration_seconds";
  Family(out, kName, "histogram",
         "Time from a call's arrival at the handlers to its answer, by method.");
  for (size_t m = 0; m < kMethods; ++m) {
    const std::string_view method = MethodName(static_cast<Method>(m));
    uint64_t cumulative = 0;
    for (size_t b = 0; b < kBuckets; ++b) {
      cumulative += latency_[m].buckets[b].load(kRelaxed);
      const std::string le =
          b < kLatencyBounds.size() ? fmt::format("{}", kLatencyBounds[b]) : std::string("+Inf");
      Sample(out, fmt::format("{}_bucket", kName),
             fmt::format("method=\"{}\",le=\"{}\"", method, le), cumulative);
    }
    const std::string labels = fmt::format("method=\"{}\"", method);
    Sample(out, fmt::format("{}_sum", kName), labels,
           static_cast<double>(latency_[m].sum_ns.load(kRelaxed)) * 1e-9);
    Sample(out, fmt::format("{}_count", kName), labels, cumulative);
  }
}

void Metrics::RenderCounters(std::string* out) const {
  constexpr std::string_view kRefused = "moeplan_refusals_total";
  Family(out, kRefused, "counter",
         "Calls refused by the server's own limits (not the request's errors), by reason.");
  for (size_t r = 0; r < refusals_.size(); ++r) {
    Sample(out, kRefused, fmt::format("reason=\"{}\"", RefusalName(static_cast<Refusal>(r))),
           refusals_[r].load(kRelaxed));
  }
  One(out, "moeplan_measurements_stored_total", "counter",
      "Measurements accepted by ReportMeasurement and stored since the server started.",
      measurements_.load(kRelaxed));
  constexpr std::string_view kRefits = "moeplan_refits_total";
  Family(out, kRefits, "counter",
         "Profile refits, by trigger (RefitProfile or --refit-every) and result.");
  for (size_t i = 0; i < refits_.size(); ++i) {
    Sample(out, kRefits,
           fmt::format("trigger=\"{}\",result=\"{}\"", i >= 2 ? "background" : "rpc",
                       i % 2 == 1 ? "ok" : "failed"),
           refits_[i].load(kRelaxed));
  }
}

std::string Metrics::Render(const MetricsSources& sources) const {
  std::string out;
  out.reserve(16 << 10);
  Family(&out, "moeplan_build_info", "gauge", "The server's version; always 1.");
  Sample(&out, "moeplan_build_info", fmt::format("version=\"{}\"", MOEPLAN_VERSION), 1);
  One(&out, "process_start_time_seconds", "gauge",
      "Start time of the process since the Unix epoch, in seconds.",
      std::chrono::duration_cast<std::chrono::seconds>(started_.time_since_epoch()).count());
  RenderRequests(&out);
  RenderLatency(&out);
  RenderCounters(&out);
  if (const PlanCache* c = sources.cache) {
    const PlanCache::Stats st = c->stats();  // one instant: no derived counter goes down
    constexpr std::string_view kHits = "moeplan_plan_cache_hits_total";
    Family(&out, kHits, "counter",
           "Plans answered from the cache, by level: the request's raw bytes, or its "
           "normalised form.");
    Sample(&out, kHits, "level=\"raw\"", st.raw_hits);
    Sample(&out, kHits, "level=\"canonical\"", st.hits - st.raw_hits);
    One(&out, "moeplan_plan_cache_misses_total", "counter",
        "Plan requests the cache did not hold (then planned).", st.misses);
    One(&out, "moeplan_plan_cache_evictions_total", "counter",
        "Cache entries dropped to stay within the entry and byte bounds.", st.evictions);
    One(&out, "moeplan_plan_cache_entries", "gauge", "Entries the plan cache holds (both levels).",
        st.entries);
    One(&out, "moeplan_plan_cache_bytes", "gauge", "Bytes the plan cache counts against its bound.",
        st.bytes);
    One(&out, "moeplan_plan_cache_capacity_bytes", "gauge", "The plan cache's bound in bytes.",
        c->capacity_bytes());
  }
  if (sources.model_plans_running) {
    One(&out, "moeplan_model_plans_running", "gauge", "Uncached model plans running now.",
        sources.model_plans_running());
  }
  if (sources.model_plans_queued) {
    One(&out, "moeplan_model_plans_queued", "gauge",
        "Uncached model plans and refits waiting for a planning thread.",
        sources.model_plans_queued());
  }
  One(&out, "moeplan_model_plans_max", "gauge", "Uncached model plans that may run at once.",
      sources.max_model_plans);
  if (const ProfileStore* s = sources.store) {
    int builtin = 0, stored = 0;
    for (const std::string& name : s->Names()) {
      if (std::shared_ptr<const ProfileEntry> e = s->Get(name)) (e->builtin ? builtin : stored)++;
    }
    constexpr std::string_view kProfiles = "moeplan_profiles";
    Family(&out, kProfiles, "gauge", "Cluster profiles the server plans with, by kind.");
    Sample(&out, kProfiles, "kind=\"builtin\"", builtin);
    Sample(&out, kProfiles, "kind=\"stored\"", stored);
  }
  return out;
}

}  // namespace moeplan::server
