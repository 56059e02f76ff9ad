// Pipelines (docs/layouts.md "Pipelines"): stage orders, the walk over all
// stages, and the pipeline simulated as an op graph.
#include "moeplan/planner/pipeline.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "moeplan/base/status.h"

namespace moeplan::planner {

std::vector<PipeStep> PipelineOrder(PipelineSchedule schedule, int p, int v, int m, int s) {
  std::vector<PipeStep> out;
  if (schedule == PipelineSchedule::kGpipe || p == 1) {
    if (p == 1 && schedule != PipelineSchedule::kGpipe) {
      // One stage: each micro-batch's backward right after its forward.
      for (int i = 0; i < m; ++i) {
        for (int c = 0; c < v; ++c) out.push_back({true, c, i});
        for (int c = v - 1; c >= 0; --c) out.push_back({false, c, i});
      }
      return out;
    }
    for (int i = 0; i < m; ++i) {
      for (int c = 0; c < v; ++c) out.push_back({true, c, i});
    }
    for (int i = 0; i < m; ++i) {
      for (int c = v - 1; c >= 0; --c) out.push_back({false, c, i});
    }
    return out;
  }
  if (schedule == PipelineSchedule::k1F1B || v == 1) {
    const int warm = std::min(p - s - 1, m);
    for (int i = 0; i < warm; ++i) out.push_back({true, 0, i});
    for (int i = 0; i < m - warm; ++i) {
      out.push_back({true, 0, warm + i});
      out.push_back({false, 0, i});
    }
    for (int i = m - warm; i < m; ++i) out.push_back({false, 0, i});
    return out;
  }
  // Megatron-LM's interleaved 1F1B: micro-steps k over m * v, in groups of p
  // micro-batches per chunk.
  const int n = m * v;
  const int warm = m == p ? n : std::min((p - s - 1) * 2 + (v - 1) * p, n);
  auto step = [&](int k, bool fwd) {
    const int in_group = k % (p * v);
    const int chunk = fwd ? in_group / p : v - 1 - in_group / p;
    return PipeStep{fwd, chunk, (k / (p * v)) * p + k % p};
  };
  for (int k = 0; k < warm; ++k) out.push_back(step(k, true));
  for (int i = 0; i < n - warm; ++i) {
    out.push_back(step(warm + i, true));
    out.push_back(step(i, false));
  }
  for (int k = n - warm; k < n; ++k) out.push_back(step(k, false));
  return out;
}

// The peak of PipelineOrder's held forwards in closed form (the search asks
// for every stage of every candidate: walking the order made enumerating a
// 1,024-stage search quadratic). Every order is `warm` forwards, then pairs of
// one forward and one backward, then the remaining backwards: the peak is
// `warm`, plus one when a pair follows. One stage runs each micro-batch's v
// chunks forward, then back; GPipe holds every forward.
double InFlightMicrobatches(PipelineSchedule schedule, int p, int v, int m, int s) {
  int64_t peak = 0;
  if (schedule == PipelineSchedule::kGpipe) {
    peak = int64_t{m} * v;
  } else if (p == 1) {
    peak = m > 0 ? v : 0;
  } else {
    const bool one = schedule == PipelineSchedule::k1F1B || v == 1;
    const int64_t n = one ? m : int64_t{m} * v;
    const int64_t warm = one        ? std::min<int64_t>(p - s - 1, m)
                         : m == p ? n
                                  : std::min<int64_t>(int64_t{p - s - 1} * 2 + int64_t{v - 1} * p, n);
    peak = warm + (n > warm ? 1 : 0);
  }
  return static_cast<double>(peak) / v;
}

absl::Status WalkPipeline(PipelineSchedule schedule, int p, int v, int m,
                          absl::FunctionRef<void(int stage, const PipeStep& step)> visit) {
  std::vector<std::vector<PipeStep>> order(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) order[static_cast<size_t>(s)] = PipelineOrder(schedule, p, v, m, s);
  auto idx = [&](int s, int c, int i, bool fwd) {
    return ((static_cast<size_t>(s) * v + c) * m + i) * 2 + (fwd ? 1 : 0);
  };
  std::vector<uint8_t> issued(static_cast<size_t>(p) * v * m * 2, 0);
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  size_t left = issued.size();
  while (left > 0) {
    bool progress = false;
    for (int s = 0; s < p; ++s) {
      auto& ns = next[static_cast<size_t>(s)];
      while (ns < order[static_cast<size_t>(s)].size()) {
        const PipeStep st = order[static_cast<size_t>(s)][ns];
        // The input: the previous chunk's forward, or the next one's backward
        // (the last chunk's backward: its own forward).
        const int c = st.chunk, i = st.mb;
        const bool ready = st.forward ? (s > 0   ? issued[idx(s - 1, c, i, true)] != 0
                                         : c > 0 ? issued[idx(p - 1, c - 1, i, true)] != 0
                                                 : true)
                                      : (s < p - 1   ? issued[idx(s + 1, c, i, false)] != 0
                                         : c < v - 1 ? issued[idx(0, c + 1, i, false)] != 0
                                                     : issued[idx(s, c, i, true)] != 0);
        if (!ready) break;
        visit(s, st);
        issued[idx(s, c, i, st.forward)] = 1;
        --left;
        ++ns;
        progress = true;
      }
    }
    if (!progress) return absl::InternalError("pipeline: the schedule deadlocks (a builder bug)");
  }
  return absl::OkStatus();
}

namespace {

// Where a pipeline's ops go as the walk issues them: into an op graph,
// simulated after (GraphSink), or timed on the spot (TimeSink).
struct GraphSink {
  OpGraph* g;
  void Begin(size_t steps, int stages) {
    g->Clear();
    g->Reserve(static_cast<int>(steps * 2 + static_cast<size_t>(stages)),
               static_cast<int>(steps * 4));
  }
  OpId Add(const Op& op, OpId a, OpId b = kNoOp) { return g->Add(op, {a, b}); }
};

// Each op timed by the simulator's rule (TimeOp) in issue order: its end
// and the latest end so far, as Simulator::Schedule computes them.
struct TimeSink {
  PipelineScratch* s;
  double makespan = 0.0;
  void Begin(size_t steps, int stages) {
    s->ends.clear();
    s->ends.reserve(steps * 2 + static_cast<size_t>(stages));
    s->free_at.assign(static_cast<size_t>(stages) * kNumResources, 0.0);
  }
  OpId Add(const Op& op, OpId a, OpId b = kNoOp) {
    double ready = 0.0;
    for (OpId d : {a, b}) {
      if (d != kNoOp) ready = std::max(ready, s->ends[static_cast<size_t>(d)]);
    }
    const double end = TimeOp(op.resources, op.cost_us, ready,
                              s->free_at.data() + static_cast<size_t>(op.device) * kNumResources);
    const OpId id = static_cast<OpId>(s->ends.size());
    s->ends.push_back(end);
    if (id == 0 || end > makespan) makespan = end;
    return id;
  }
};

// A pipeline's ops being issued into `Sink`: each step's op and the send
// after it, indexed ((s * v + c) * m + i) * 2 + fwd, and each stage's last op.
template <typename Sink>
class PipelineGraph {
 public:
  PipelineGraph(const PipelineSpec& spec, Sink* g)
      : spec_(spec),
        p_(spec.stages),
        v_(spec.chunks),
        m_(spec.microbatches),
        g_(g),
        op_of_(static_cast<size_t>(p_) * v_ * m_ * 2, kNoOp),
        send_of_(op_of_.size(), kNoOp),
        last_of_(static_cast<size_t>(p_), kNoOp),
        p2p_(p_ > 1 || v_ > 1 ? spec.p2p_us : 0.0) {
    g->Begin(op_of_.size(), p_);
  }

  // The step's compute op on its stage and, unless it ends the micro-batch's
  // pass, the send to the next chunk.
  void Step(int s, const PipeStep& st) {
    Op op;
    op.base = st.forward ? "pipe.fwd" : "pipe.bwd";
    op.block = static_cast<int16_t>(s);  // names read b<stage>.pipe.fwd.<mb>.p<chunk>
    op.step = st.mb;
    op.part = static_cast<int16_t>(st.chunk);
    op.device = static_cast<int16_t>(s);
    op.phase = st.forward ? Phase::kForward : Phase::kBackward;
    op.term = Term::kDense;
    op.resources = kCompute;
    const size_t cs = static_cast<size_t>(s) * v_ + st.chunk;
    op.cost_us = st.forward ? spec_.fwd_us[cs] : spec_.bwd_us[cs];
    const OpId own_fwd = st.forward ? kNoOp : op_of_[Idx(s, st.chunk, st.mb, true)];
    const OpId id = g_->Add(op, Input(s, st), own_fwd);
    op_of_[Idx(s, st.chunk, st.mb, st.forward)] = id;
    last_of_[static_cast<size_t>(s)] = id;
    const bool last_fwd = st.forward && s == p_ - 1 && st.chunk == v_ - 1;
    const bool first_bwd = !st.forward && s == 0 && st.chunk == 0;
    if (last_fwd || first_bwd) return;
    Op send;
    send.base = st.forward ? "pipe.send_fwd" : "pipe.send_bwd";
    send.block = op.block;
    send.step = op.step;
    send.part = op.part;
    send.device = op.device;
    send.kind = OpKind::kComm;
    send.phase = op.phase;
    send.term = Term::kSendRecv;
    send.resources = spec_.p2p_resource;
    send.cost_us = p2p_;
    send_of_[Idx(s, st.chunk, st.mb, st.forward)] = g_->Add(send, id);
  }

  // Each stage's tail after its last step.
  void Tails() {
    for (int s = 0; s < p_; ++s) {
      if (spec_.tail_us.empty()) break;
      Op tail;
      tail.base = "pipe.tail";
      tail.block = static_cast<int16_t>(s);
      tail.device = static_cast<int16_t>(s);
      tail.phase = Phase::kBackward;
      tail.term = Term::kOptimizer;
      tail.resources = 0;
      tail.cost_us = spec_.tail_us[static_cast<size_t>(s)];
      g_->Add(tail, last_of_[static_cast<size_t>(s)]);
    }
  }

  // Each stage's last step (its last backward).
  const std::vector<OpId>& last_of() const { return last_of_; }

 private:
  size_t Idx(int s, int c, int i, bool fwd) const {
    return ((static_cast<size_t>(s) * v_ + c) * m_ + i) * 2 + (fwd ? 1 : 0);
  }

  // The input: the previous chunk's send (forward) or the next one's
  // (backward); the last chunk's backward waits for its own forward.
  OpId Input(int s, const PipeStep& st) const {
    if (st.forward) {
      if (s > 0) return send_of_[Idx(s - 1, st.chunk, st.mb, true)];
      if (st.chunk > 0) return send_of_[Idx(p_ - 1, st.chunk - 1, st.mb, true)];
      return kNoOp;
    }
    if (s < p_ - 1) return send_of_[Idx(s + 1, st.chunk, st.mb, false)];
    if (st.chunk < v_ - 1) return send_of_[Idx(0, st.chunk + 1, st.mb, false)];
    return op_of_[Idx(s, st.chunk, st.mb, true)];
  }

  const PipelineSpec& spec_;
  const int p_, v_, m_;
  Sink* g_;
  std::vector<OpId> op_of_, send_of_, last_of_;
  const double p2p_;
};

// The pipeline's end, busiest stage and bubble from its times: the
// makespan and `end_of(id)`, an op's end.
template <typename EndOf>
void Summarize(const PipelineSpec& spec, double makespan, const std::vector<OpId>& bwd_last,
               EndOf end_of, PipelineResult* out) {
  const int p = spec.stages, v = spec.chunks, m = spec.microbatches;
  out->makespan_us = makespan;
  out->pipeline_end_us = 0.0;
  for (OpId id : bwd_last) out->pipeline_end_us = std::max(out->pipeline_end_us, end_of(id));
  double busiest = -1.0;
  for (int s = 0; s < p; ++s) {
    double busy = 0.0;
    for (int c = 0; c < v; ++c) {
      busy += m * (spec.fwd_us[static_cast<size_t>(s) * v + c] +
                   spec.bwd_us[static_cast<size_t>(s) * v + c]);
    }
    if (busy > busiest) {
      busiest = busy;
      out->busiest_stage = s;
    }
  }
  out->bubble_us = std::max(0.0, out->pipeline_end_us - busiest);
  out->bubble_fraction = out->pipeline_end_us > 0.0 ? out->bubble_us / out->pipeline_end_us : 0.0;
}

absl::Status CheckSpec(const PipelineSpec& spec) {
  const int p = spec.stages, v = spec.chunks, m = spec.microbatches;
  if (p < 1 || v < 1 || m < 1 || static_cast<int>(spec.fwd_us.size()) != p * v ||
      static_cast<int>(spec.bwd_us.size()) != p * v ||
      (!spec.tail_us.empty() && static_cast<int>(spec.tail_us.size()) != p)) {
    return absl::InvalidArgumentError("pipeline: costs must have stages * chunks entries");
  }
  return absl::OkStatus();
}

// The walk's steps issued into `sink`, then the tails.
template <typename Sink>
absl::Status Issue(const PipelineSpec& spec, PipelineGraph<Sink>& graph) {
  MOEPLAN_RETURN_IF_ERROR(WalkPipeline(spec.schedule, spec.stages, spec.chunks, spec.microbatches,
                                       [&](int s, const PipeStep& st) { graph.Step(s, st); }));
  graph.Tails();
  return absl::OkStatus();
}

}  // namespace

absl::Status SimulatePipeline(const PipelineSpec& spec, OpGraph* g, Simulator* sim,
                              SimResult* result, PipelineResult* out) {
  MOEPLAN_RETURN_IF_ERROR(CheckSpec(spec));
  GraphSink sink{g};
  PipelineGraph<GraphSink> graph(spec, &sink);
  MOEPLAN_RETURN_IF_ERROR(Issue(spec, graph));
  // Times only: the summary reads no critical path.
  MOEPLAN_RETURN_IF_ERROR(sim->Schedule(*g, result, 0, /*bindings=*/false));
  Summarize(
      spec, result->makespan_us, graph.last_of(),
      [&](OpId id) { return result->times[static_cast<size_t>(id)].end_us; }, out);
  return absl::OkStatus();
}

absl::Status TimePipeline(const PipelineSpec& spec, PipelineScratch* scratch, PipelineResult* out) {
  MOEPLAN_RETURN_IF_ERROR(CheckSpec(spec));
  TimeSink sink{scratch};
  PipelineGraph<TimeSink> graph(spec, &sink);
  MOEPLAN_RETURN_IF_ERROR(Issue(spec, graph));
  Summarize(
      spec, sink.makespan, graph.last_of(),
      [&](OpId id) { return scratch->ends[static_cast<size_t>(id)]; }, out);
  return absl::OkStatus();
}

}  // namespace moeplan::planner
