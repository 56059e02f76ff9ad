#include "exec_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <unordered_map>

#include "moeplan/base/stats.h"
#include "moeplan/proto/convert.h"

namespace moeplan::exec {
namespace {

using proto::ScheduleLabel;

// Total length of the union of intervals, and of its intersection with `other`'s union.
struct Interval {
  double a, b;
};
std::vector<Interval> Union(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& x, const Interval& y) { return x.a < y.a; });
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!out.empty() && i.a <= out.back().b) {
      out.back().b = std::max(out.back().b, i.b);
    } else {
      out.push_back(i);
    }
  }
  return out;
}
double Length(const std::vector<Interval>& u) {
  double t = 0.0;
  for (const Interval& i : u) t += i.b - i.a;
  return t;
}
double Overlap(const std::vector<Interval>& x, const std::vector<Interval>& y) {
  double t = 0.0;
  for (const Interval& i : x) {
    for (const Interval& j : y) t += std::max(0.0, std::min(i.b, j.b) - std::max(i.a, j.a));
  }
  return t;
}

}  // namespace

v1::CandidatePlan MeasuredCandidate(v1::Schedule schedule, const std::vector<executor::OpTime>& ops,
                                    const std::vector<IterationTimes>& iterations,
                                    const v1::CandidatePlan* predicted) {
  v1::CandidatePlan c;
  c.set_schedule(schedule);
  std::unordered_map<std::string, const v1::OpTiming*> meta;
  if (predicted != nullptr) {
    for (const v1::OpTiming& op : predicted->ops()) meta.emplace(op.name(), &op);
  }
  std::vector<double> buf(iterations.size());
  std::vector<Interval> comm, compute;
  double compute_us = 0.0;
  for (size_t i = 0; i < ops.size(); ++i) {
    v1::OpTiming* op = c.add_ops();
    if (auto it = meta.find(ops[i].name); it != meta.end()) *op = *it->second;
    op->set_name(ops[i].name);
    op->set_phase(ops[i].phase == planner::Phase::kForward ? v1::PHASE_FORWARD
                                                           : v1::PHASE_BACKWARD);
    const bool is_comm = ops[i].kind == planner::OpKind::kComm;
    op->set_kind(is_comm ? "comm" : "compute");
    op->set_critical(false);
    for (size_t k = 0; k < iterations.size(); ++k) buf[k] = iterations[k].start_us[i];
    op->set_start_us(Median(buf));
    for (size_t k = 0; k < iterations.size(); ++k) buf[k] = iterations[k].end_us[i];
    op->set_end_us(std::max(op->start_us(), Median(buf)));
    (is_comm ? comm : compute).push_back({op->start_us(), op->end_us()});
    if (!is_comm) compute_us += op->end_us() - op->start_us();
  }
  for (size_t k = 0; k < iterations.size(); ++k) buf[k] = iterations[k].forward_us;
  c.set_forward_us(Median(buf));
  for (size_t k = 0; k < iterations.size(); ++k) buf[k] = iterations[k].total_us;
  c.set_total_us(Median(buf));
  c.set_backward_us(c.total_us() - c.forward_us());
  const std::vector<Interval> comm_u = Union(comm), compute_u = Union(compute);
  c.set_comm_us(Length(comm_u));
  c.set_hidden_comm_us(Overlap(comm_u, compute_u));
  c.set_exposed_comm_us(c.comm_us() - c.hidden_comm_us());
  c.set_compute_us(compute_us);
  if (predicted != nullptr) c.set_inter_node_bytes(predicted->inter_node_bytes());
  return c;
}

std::vector<std::string> MissingOps(const v1::CandidatePlan& a, const v1::CandidatePlan& b) {
  std::unordered_map<std::string, int> in_b;
  for (const v1::OpTiming& op : b.ops()) in_b[op.name()]++;
  std::vector<std::string> missing;
  for (const v1::OpTiming& op : a.ops()) {
    if (in_b[op.name()]-- <= 0) missing.push_back(op.name());
  }
  return missing;
}

std::string RenderTable(const v1::ExecReport& r) {
  std::string out;
  auto put = [&out](fmt::string_view format, auto&&... args) {
    fmt::vformat_to(std::back_inserter(out), format, fmt::make_format_args(args...));
  };
  const v1::LayerConfig& l = r.layer();
  const std::string routing = l.dropless()
                                  ? fmt::format("dropless token_skew={:.3g}", l.token_skew())
                                  : fmt::format("f={}", l.capacity_factor());
  put("layer {}: B={} L={} M={} H={} E={} k={} {} | mp={} ep={} esp={} dp={}\n",
      l.name().empty() ? "(unnamed)" : l.name(), l.batch_size(), l.seq_len(), l.model_dim(),
      l.hidden_dim(), l.num_experts(), l.top_k(), routing, l.parallel().mp(), l.parallel().ep(),
      l.parallel().esp(), l.parallel().dp());
  if (l.dropless()) {
    put("dropless: predicted at the measured heaviest EP rank's load (token_skew above)\n");
  }
  put("backend {} ({}), dtype {}, {} ranks on {} host(s), {} iterations after {} warm-up{}\n",
      r.backend(), r.versions(), r.dtype(), r.ranks(), r.hosts(), r.iters(), r.warmup(),
      r.interleaved() ? ", schedules interleaved" : "");
  if (r.skew_exponent() > 0.0) {
    put("gate biased by a Zipf law of exponent {:g} (--skew)\n", r.skew_exponent());
  }
  put("times: median over iterations of the max over ranks, microseconds\n");
  for (int i = 0; i < r.candidates_size(); ++i) {
    const v1::CandidatePlan& c = r.candidates(i);
    put("\n{}: total {:.1f} us (forward {:.1f}, backward {:.1f}); compute {:.1f}, comm {:.1f} "
        "({:.1f} hidden)\n",
        ScheduleLabel(c.schedule()), c.total_us(), c.forward_us(), c.backward_us(), c.compute_us(),
        c.comm_us(), c.hidden_comm_us());
    if (i < r.routing_size()) {
      const v1::ExecRouting& g = r.routing(i);
      put("  routing: heaviest EP rank {:.2f}x the mean (token_skew), heaviest expert {:.2f}x, "
          "{:.1f}% of choices dropped by capacity\n",
          g.rank_load_ratio(), g.expert_load_ratio(), g.dropped_pct());
    }
    if (i < r.replays_size() && r.replays(i).replayed_us() > 0.0) {
      const v1::Replay& rp = r.replays(i);
      put("  replay: the measured op durations on the plan compose to {:.1f} us ({:+.1f}% "
          "composition error); {} of {} ops measured\n",
          rp.replayed_us(), rp.composition_error_pct(), rp.ops() - rp.unmeasured_ops(), rp.ops());
    }
    put("  {:<36} {:>7} {:>12} {:>12} {:>12}\n", "op", "kind", "start", "end", "duration");
    for (const v1::OpTiming& op : c.ops()) {
      put("  {:<36} {:>7} {:>12.1f} {:>12.1f} {:>12.1f}\n", op.name(), op.kind(), op.start_us(),
          op.end_us(), op.end_us() - op.start_us());
    }
  }
  if (r.has_check()) {
    const v1::ExecCheck& ck = r.check();
    put("\ncheck against {} (tolerance {} of max |ref|): {}\n", ScheduleLabel(ck.reference()),
        ck.tolerance(), ck.passed() ? "PASSED" : "FAILED");
    for (int i = 0; i < ck.schedules_size(); ++i) {
      put("  dropped (token, choice) pairs, {}: {}\n",
          ScheduleLabel(static_cast<v1::Schedule>(ck.schedules(i))), ck.dropped(i));
    }
    for (const v1::TensorCheck& t : ck.tensors()) {
      put("  {:<8} {:<8} max|diff| {:<12.4g} max|ref| {:<12.4g} {}{}\n",
          ScheduleLabel(t.schedule()), t.tensor(), t.max_abs_diff(), t.max_abs_ref(),
          t.passed() ? "ok" : "MISMATCH", t.note().empty() ? "" : "  (" + t.note() + ")");
    }
  }
  return out;
}

}  // namespace moeplan::exec
