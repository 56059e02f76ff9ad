#include "moeplan/client/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_split.h"
#include "moeplan/base/format.h"
#include "moeplan/proto/convert.h"

namespace moeplan::client {

using proto::ScheduleLabel;

namespace {

std::string SourceLabel(v1::ProfileSource s) {
  switch (s) {
    case v1::PROFILE_SOURCE_MEASURED:
      return "measured";
    case v1::PROFILE_SOURCE_SPEC:
      return "spec";
    default:
      return "unspecified";
  }
}

}  // namespace

std::string FormatPlanTable(const v1::LayerConfig& l, const v1::PlanLayerResponse& plan,
                            const v1::ClusterProfile& profile) {
  std::string out;
  auto w = std::back_inserter(out);
  const v1::ParallelLayout& p = l.parallel();
  const v1::DerivedShape& d = plan.derived();
  fmt::format_to(w, "layer {} on {} (v{}, {}; {} nodes x {} GPUs)\n",
                 l.name().empty() ? "(unnamed)" : l.name(), plan.profile_name(),
                 plan.profile_version(), SourceLabel(profile.source()), profile.nodes(),
                 profile.gpus_per_node());
  fmt::format_to(w,
                 "  B={} L={} M={} H={} E={} k={} f={} b={} skew={}{} | mp={} ep={} esp={} dp={} "
                 "pp={}\n",
                 l.batch_size(), l.seq_len(), l.model_dim(), l.hidden_dim(), l.num_experts(),
                 l.top_k(), l.capacity_factor(), l.bytes_per_element(), l.token_skew(),
                 l.dropless() ? " dropless" : "", p.mp(), p.ep(), p.esp(), p.dp(), p.pp());
  fmt::format_to(w, "  S={} tokens, capacity T={}, X={}, D={}\n\n", d.tokens(), d.capacity(),
                 FormatBytes(static_cast<double>(d.activation_bytes())),
                 FormatBytes(static_cast<double>(d.dispatch_bytes())));

  double default_total = 0.0;
  for (const v1::CandidatePlan& c : plan.candidates()) {
    if (c.schedule() == v1::SCHEDULE_DEFAULT) default_total = c.total_us();
  }
  fmt::format_to(w, "{:<9}{:>13}{:>13}{:>13}{:>12}{:>12}{:>12}{:>13}{:>11}\n", "schedule",
                 "forward_us", "backward_us", "total_us", "comm_us", "exposed_us", "hidden_us",
                 "inter_node", "vs_default");
  for (const v1::CandidatePlan& c : plan.candidates()) {
    const std::string vs = default_total > 0.0 && c.total_us() > 0.0
                               ? fmt::format("{:.2f}x", default_total / c.total_us())
                               : "-";
    fmt::format_to(
        w, "{:<9} {:>12.1f} {:>12.1f} {:>12.1f} {:>11.1f} {:>11.1f} {:>11.1f} {:>12} {:>10}\n",
        ScheduleLabel(c.schedule()), c.forward_us(), c.backward_us(), c.total_us(), c.comm_us(),
        c.exposed_comm_us(), c.hidden_comm_us(),
        FormatBytes(static_cast<double>(c.inter_node_bytes())), vs);
  }
  fmt::format_to(w, "\nbest: {}\n  {}\n", ScheduleLabel(plan.best_schedule()),
                 plan.decision().summary());

  for (const v1::CandidatePlan& c : plan.candidates()) {
    if (c.ops_size() == 0) continue;
    fmt::format_to(w, "\ntimeline of {} ({} ops; * = on the critical path)\n",
                   ScheduleLabel(c.schedule()), c.ops_size());
    // A space between the numbers: CPU layers run for seconds, and 1e8 us
    // fills the columns.
    fmt::format_to(w, "  {:>11} {:>11} {:>10}  {:<12}{:>11}  {}\n", "start_us", "end_us", "dur_us",
                   "resource", "bytes", "op");
    for (const v1::OpTiming& op : c.ops()) {
      fmt::format_to(w, "  {:>11.1f} {:>11.1f} {:>10.1f}  {:<12}{:>11}  {}{}\n", op.start_us(),
                     op.end_us(), op.end_us() - op.start_us(), op.resource(),
                     FormatBytes(static_cast<double>(op.bytes())), op.name(),
                     op.critical() ? " *" : "");
    }
  }
  return out;
}

namespace {

// One process of a Chrome trace: a timeline with one track per resource; an op
// holding several resources appears on each.
void AddTraceProcess(int pid, const std::string& label,
                     const google::protobuf::RepeatedPtrField<v1::OpTiming>& ops,
                     v1::ChromeTrace* trace) {
  static constexpr const char* kResources[] = {"compute", "intra", "inter"};
  auto meta = [&](int tid, const char* what, const std::string& value) {
    v1::TraceEvent* e = trace->add_trace_events();
    e->set_name(what);
    e->set_ph("M");
    e->set_pid(pid);
    e->set_tid(tid);
    (*e->mutable_args())["name"] = value;
  };
  meta(0, "process_name", label);
  v1::TraceEvent* sort = trace->add_trace_events();
  sort->set_name("process_sort_index");
  sort->set_ph("M");
  sort->set_pid(pid);
  (*sort->mutable_args())["sort_index"] = std::to_string(pid - 1);
  for (int r = 0; r < 3; ++r) meta(r + 1, "thread_name", kResources[r]);
  for (const v1::OpTiming& op : ops) {
    // op.resource() is the '+'-joined names of the held resources.
    const std::vector<absl::string_view> held = absl::StrSplit(op.resource(), '+');
    for (int r = 0; r < 3; ++r) {
      if (std::find(held.begin(), held.end(), kResources[r]) == held.end()) continue;
      v1::TraceEvent* e = trace->add_trace_events();
      e->set_name(op.name());
      e->set_cat(fmt::format("{},{}", op.kind(), op.phase() == v1::PHASE_FORWARD ? "fwd" : "bwd"));
      e->set_ph("X");
      e->set_ts(op.start_us());
      e->set_dur(op.end_us() - op.start_us());
      e->set_pid(pid);
      e->set_tid(r + 1);
      auto& args = *e->mutable_args();
      args["term"] = op.term();
      args["bytes"] = std::to_string(op.bytes());
      args["inter_node_bytes"] = std::to_string(op.inter_node_bytes());
      args["critical"] = op.critical() ? "true" : "false";
      args["resource"] = op.resource();
    }
  }
}

}  // namespace

v1::ChromeTrace BuildTrace(const v1::PlanLayerResponse& plan) {
  v1::ChromeTrace trace;
  trace.set_display_time_unit("ms");  // display only; ts and dur are microseconds
  for (int i = 0; i < plan.candidates_size(); ++i) {
    const v1::CandidatePlan& c = plan.candidates(i);
    AddTraceProcess(
        i + 1,
        fmt::format("{}{} — {:.1f} us", ScheduleLabel(c.schedule()),
                    c.schedule() == plan.best_schedule() ? " (best)" : "", c.total_us()),
        c.ops(), &trace);
  }
  return trace;
}

v1::ChromeTrace BuildModelTrace(const v1::PlanModelResponse& plan) {
  v1::ChromeTrace trace;
  trace.set_display_time_unit("ms");
  for (int i = 0; i < plan.variants_size(); ++i) {
    const v1::VariantPlan& v = plan.variants(i);
    AddTraceProcess(
        i + 1,
        fmt::format("{}{} — {}", v.name(), v.name() == plan.best_variant() ? " (best)" : "",
                    FormatDuration(v.iteration_us())),
        v.ops(), &trace);
  }
  return trace;
}

}  // namespace moeplan::client
