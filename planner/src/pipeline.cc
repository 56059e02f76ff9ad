// Pipelines (docs/layouts.md "Pipelines"): stage orders, the walk over all
// stages, and the pipeline simulated as an op graph.
#include "moeplan/planner/pipeline.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#include "moeplan/base/status.h"

namespace moeplan::planner {

namespace {

// A 1F1B-style order of n forwards f(i) and n backwards b(i): `warm`
// forwards, then one forward and one backward (run overlapped, with
// `overlap`), then the backwards left.
template <typename Fwd, typename Bwd>
std::vector<PipeStep> OneFOneB(int n, int warm, bool overlap, Fwd f, Bwd b) {
  std::vector<PipeStep> out;
  out.reserve(static_cast<size_t>(n) * 2);
  warm = std::min(warm, n);
  for (int i = 0; i < warm; ++i) out.push_back(f(i));
  for (int i = 0; i + warm < n; ++i) {
    out.push_back(f(warm + i));
    out.back().with_next = overlap;
    out.push_back(b(i));
  }
  for (int i = n - warm; i < n; ++i) out.push_back(b(i));
  return out;
}

// DeepSeek's DualPipe on stage s (half rank h = min(s, p-1-s)), its eight
// phases: chunk 0's warm-up forwards, both chunks' forwards, chunk 1's
// backward-forward steps, the main loop of overlapped pairs (chunk 0's
// forward with chunk 1's backward, then the reverse; the middle ranks run
// their first pair apart), chunk 1's backwards with pairs, then the
// backwards left. Its zero-bubble split of backwards into input and weight
// gradients is not modelled: each backward holds both.
std::vector<PipeStep> DualPipeOrder(int p, int m, int s) {
  const int half = p / 2, h = std::min(s, p - 1 - s), n = m / 2;
  std::array<int, 2> next_f{}, next_b{};
  std::vector<PipeStep> out;
  out.reserve(static_cast<size_t>(m) * 2);
  auto f = [&](int c, bool with_next = false) {
    out.push_back({true, c, next_f[static_cast<size_t>(c)]++, with_next});
  };
  auto b = [&](int c) { out.push_back({false, c, next_b[static_cast<size_t>(c)]++}); };
  for (int i = 0; i < (half - h - 1) * 2; ++i) f(0);
  for (int i = 0; i < h + 1; ++i) f(0), f(1);
  for (int i = 0; i < half - h - 1; ++i) b(1), f(1);
  for (int i = 0; i < n - p + h + 1; ++i) {
    f(0, !(i == 0 && h == half - 1)), b(1);
    f(1, true), b(0);
  }
  for (int i = 0; i < half - h - 1; ++i) b(1), f(1, true), b(0);
  for (int i = 0; i < h + 1; ++i) b(1), b(0);
  for (int i = 0; i < half - h - 1; ++i) b(0);
  return out;
}

}  // namespace

DualPipeChunk DualPipeChunkOf(int p, int s, int c) {
  const int h = std::min(s, p - 1 - s);
  const int segment = c == 0 ? h : p - 1 - h;
  return {segment == s ? 0 : 1, segment};
}

std::array<int, 2> DualPipeHeld(int p, int m, int s) {
  std::array<int, 2> held{}, peak{};
  for (const PipeStep& st : DualPipeOrder(p, m, s)) {
    int& h = held[static_cast<size_t>(st.chunk)];
    h += st.forward ? 1 : -1;
    peak[static_cast<size_t>(st.chunk)] = std::max(peak[static_cast<size_t>(st.chunk)], h);
  }
  return peak;
}

PipeFeed DualPipeFeedOf(int p, int s, const PipeStep& st) {
  // Segment k of direction d sits on stage k (d = 0) or p - 1 - k, as
  // chunk 0 when k < p / 2.
  const DualPipeChunk at = DualPipeChunkOf(p, s, st.chunk);
  const int k = at.segment + (st.forward ? -1 : 1);
  const bool last = st.forward ? at.segment == p - 1 : at.segment == 0;
  if (k < 0) return {0, 0, true, true, last};
  if (k >= p) return {s, st.chunk, true, false, last};
  return {at.direction == 0 ? k : p - 1 - k, k < p / 2 ? 0 : 1, st.forward, false, last};
}

std::vector<PipeStep> PipelineOrder(PipelineSchedule schedule, int p, int v, int m, int s,
                                    bool overlap) {
  if (schedule == PipelineSchedule::kDualPipe) return DualPipeOrder(p, m, s);
  std::vector<PipeStep> out;
  if (schedule == PipelineSchedule::kGpipe || (p == 1 && !overlap)) {
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
  // Each order is warm forwards, then forward-backward pairs, then the
  // backwards left (OneFOneB); overlapping adds one warm-up forward so that
  // a pair's two steps are different micro-batches.
  const int more = overlap ? 1 : 0;
  if (p == 1) {
    // One stage, overlapped: micro-batch i + 1's chunks forward with i's backward.
    return OneFOneB(
        m * v, v - 1 + more, overlap,
        [v](int k) {
          return PipeStep{true, k % v, k / v};
        },
        [v](int k) {
          return PipeStep{false, v - 1 - k % v, k / v};
        });
  }
  if (schedule == PipelineSchedule::k1F1B || v == 1) {
    return OneFOneB(
        m, std::min(p - s - 1, m) + more, overlap,
        [](int i) {
          return PipeStep{true, 0, i};
        },
        [](int i) {
          return PipeStep{false, 0, i};
        });
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
  return OneFOneB(
      n, warm + more, overlap, [&](int k) { return step(k, true); },
      [&](int k) { return step(k, false); });
}

// The peak of PipelineOrder's held forwards in closed form (the search asks
// for every stage of every candidate: walking the order made enumerating a
// 1,024-stage search quadratic). Every order is `warm` forwards, then pairs of
// one forward and one backward, then the remaining backwards: the peak is
// `warm`, plus one when a pair follows. One stage runs each micro-batch's v
// chunks forward, then back; GPipe holds every forward. DualPipe's order is
// walked (a schedule asked for by name, not enumerated).
double InFlightMicrobatches(PipelineSchedule schedule, int p, int v, int m, int s, bool overlap) {
  int64_t peak = 0;
  if (schedule == PipelineSchedule::kDualPipe) {
    int64_t held = 0;
    for (const PipeStep& st : DualPipeOrder(p, m, s)) {
      held += st.forward ? 1 : -1;
      peak = std::max(peak, held);
    }
    return static_cast<double>(peak) / 2.0;
  }
  if (schedule == PipelineSchedule::kGpipe) {
    peak = int64_t{m} * v;
  } else if (p == 1 && !overlap) {
    peak = m > 0 ? v : 0;
  } else {
    const bool one = schedule == PipelineSchedule::k1F1B || v == 1;
    const int64_t n = one && p > 1 ? m : int64_t{m} * v;
    const int64_t more = overlap ? 1 : 0;
    const int64_t warm = std::min<int64_t>(
        (p == 1   ? int64_t{v} - 1
         : one    ? std::min<int64_t>(p - s - 1, m)
         : m == p ? n
                  : std::min<int64_t>(int64_t{p - s - 1} * 2 + int64_t{v - 1} * p, n)) +
            more,
        n);
    peak = warm + (n > warm ? 1 : 0);
  }
  return static_cast<double>(peak) / v;
}

absl::Status WalkPipeline(PipelineSchedule schedule, int p, int v, int m,
                          absl::FunctionRef<void(int stage, const PipeStep& step)> visit,
                          bool overlap) {
  const bool dual = schedule == PipelineSchedule::kDualPipe;
  const int mbs = dual ? m / 2 : m;  // micro-batches per chunk
  std::vector<std::vector<PipeStep>> order(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    order[static_cast<size_t>(s)] = PipelineOrder(schedule, p, v, m, s, overlap);
  }
  auto idx = [&](int s, int c, int i, bool fwd) {
    return ((static_cast<size_t>(s) * v + c) * mbs + i) * 2 + (fwd ? 1 : 0);
  };
  std::vector<uint8_t> issued(static_cast<size_t>(p) * v * mbs * 2, 0);
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  size_t left = issued.size();
  auto ready = [&](int s, const PipeStep& st) {
    if (!dual) {
      // FeedOf's rule, inline: the search's bounds walk every candidate.
      const int c = st.chunk, i = st.mb;
      return st.forward ? (s > 0   ? issued[idx(s - 1, c, i, true)] != 0
                           : c > 0 ? issued[idx(p - 1, c - 1, i, true)] != 0
                                   : true)
                        : (s < p - 1   ? issued[idx(s + 1, c, i, false)] != 0
                           : c < v - 1 ? issued[idx(0, c + 1, i, false)] != 0
                                       : issued[idx(s, c, i, true)] != 0);
    }
    const PipeFeed in = DualPipeFeedOf(p, s, st);
    return in.none || issued[idx(in.stage, in.chunk, st.mb, in.forward)] != 0;
  };
  while (left > 0) {
    bool progress = false;
    for (int s = 0; s < p; ++s) {
      const std::vector<PipeStep>& os = order[static_cast<size_t>(s)];
      auto& ns = next[static_cast<size_t>(s)];
      while (ns < os.size()) {
        // A step, or an overlapped pair: both steps' inputs issued.
        const size_t n = os[ns].with_next && ns + 1 < os.size() ? 2 : 1;
        if (!ready(s, os[ns]) || (n == 2 && !ready(s, os[ns + 1]))) break;
        for (size_t k = 0; k < n; ++k) {
          const PipeStep& st = os[ns + k];
          visit(s, st);
          issued[idx(s, st.chunk, st.mb, st.forward)] = 1;
        }
        left -= n;
        ns += n;
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
  OpId Add(const Op& op, std::initializer_list<OpId> deps) { return g->Add(op, deps); }
  void Pair(const PipeStep&, const PipeStep&) {}
};

// Each op timed by the simulator's rule (TimeOp) in issue order: its end,
// the last op's start and the latest end so far, as Simulator::Schedule
// computes them.
struct TimeSink {
  PipelineScratch* s;
  double makespan = 0.0;
  double start = 0.0;
  void Begin(size_t steps, int stages) {
    s->ends.clear();
    s->ends.reserve(steps * 2 + static_cast<size_t>(stages));
    s->free_at.assign(static_cast<size_t>(stages) * kNumResources, 0.0);
  }
  OpId Add(const Op& op, std::initializer_list<OpId> deps) {
    double ready = 0.0;
    for (OpId d : deps) {
      if (d != kNoOp) ready = std::max(ready, s->ends[static_cast<size_t>(d)]);
    }
    const double end =
        TimeOp(op.resources, op.cost_us, ready,
               s->free_at.data() + static_cast<size_t>(op.device) * kNumResources, &start);
    const OpId id = static_cast<OpId>(s->ends.size());
    s->ends.push_back(end);
    if (id == 0 || end > makespan) makespan = end;
    return id;
  }
  void Pair(const PipeStep&, const PipeStep&) {}
};

// TimeSink's times kept as spans (TracePipeline), a pair's two ops one
// span, each from TimeOp's start (so a step starts at its predecessor's end
// exactly).
struct TraceSink : TimeSink {
  std::vector<PipeSpan>* spans;
  PipeStep fwd, bwd;  // the pair being issued
  size_t pair = 0;    // its span
  OpId Add(const Op& op, std::initializer_list<OpId> deps) {
    const OpId id = TimeSink::Add(op, deps);
    const double end = s->ends[static_cast<size_t>(id)];
    if (op.base == "pipe.fb_rest") {
      (*spans)[pair].end_us = end;
      return id;
    }
    PipeSpan span;
    span.stage = op.block;
    span.start_us = start;
    span.end_us = end;
    span.step = {op.phase == Phase::kForward, op.part, op.step, false};
    if (op.base == "pipe.fb") {
      span.kind = PipeSpan::Kind::kPair;
      span.step = fwd;
      span.paired = bwd;
      pair = spans->size();
    } else if (op.kind == OpKind::kComm) {
      span.kind = PipeSpan::Kind::kSend;
    } else if (op.term == Term::kOptimizer) {
      span.kind = PipeSpan::Kind::kTail;
      span.step = {};
    }
    spans->push_back(span);
    return id;
  }
  void Pair(const PipeStep& a, const PipeStep& b) {
    fwd = a.forward ? a : b;
    bwd = a.forward ? b : a;
    fwd.with_next = bwd.with_next = false;
  }
};

// A pipeline's ops being issued into `Sink`: each step's op (a pair's one
// op for both) and the send after it, indexed ((s * v + c) * mbs + i) * 2 +
// fwd, each stage's last op and the time its steps hold its device.
template <typename Sink>
class PipelineGraph {
 public:
  PipelineGraph(const PipelineSpec& spec, Sink* g)
      : spec_(spec),
        p_(spec.stages),
        v_(spec.chunks),
        mbs_(spec.schedule == PipelineSchedule::kDualPipe ? spec.microbatches / 2
                                                          : spec.microbatches),
        g_(g),
        op_of_(static_cast<size_t>(p_) * v_ * mbs_ * 2, kNoOp),
        send_of_(op_of_.size(), kNoOp),
        last_of_(static_cast<size_t>(p_), kNoOp),
        busy_(static_cast<size_t>(p_), 0.0),
        p2p_(p_ > 1 || v_ > 1 ? spec.p2p_us : 0.0) {
    g->Begin(op_of_.size(), p_);
    // Without pairs each chunk's m forwards and backwards; with them the
    // steps' own times, summed as they are issued.
    for (int s = 0; s < p_ && spec.pairs.empty(); ++s) {
      for (int c = 0; c < v_; ++c) {
        const size_t i = static_cast<size_t>(s) * v_ + c;
        busy_[static_cast<size_t>(s)] += mbs_ * (spec.fwd_us[i] + spec.bwd_us[i]);
      }
    }
  }

  // The step's compute op on its stage (a pair's first step waits for the
  // second) and, unless nothing downstream reads it, the send after it.
  void Step(int s, const PipeStep& st) {
    if (st.with_next && !spec_.pairs.empty() && !pending_) {
      pending_ = st;
      return;
    }
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
    const PipeFeed in = FeedOf(spec_.schedule, p_, v_, s, st);
    if (pending_) {
      // The pair: an op up to the first step's end (its send after it),
      // then one to the pair's end, waiting for both steps' inputs.
      const PipeStep f = *pending_;
      const PipeFeed f_in = FeedOf(spec_.schedule, p_, v_, s, f);
      pending_.reset();
      g_->Pair(f, st);
      const PairTime& t = spec_.pairs[(static_cast<size_t>(s) * v_ + f.chunk) * v_ + st.chunk];
      const bool fwd_first = t.fwd_end_us <= t.bwd_end_us;
      op.base = "pipe.fb";
      op.step = f.mb;
      op.part = static_cast<int16_t>(f.chunk);
      op.cost_us = std::min(t.fwd_end_us, t.bwd_end_us);
      const OpId first = g_->Add(op, {Input(s, f, f_in), Input(s, st, in), own_fwd});
      op.base = "pipe.fb_rest";
      op.cost_us = std::max(0.0, t.total_us - op.cost_us);
      const OpId rest = g_->Add(op, {first});
      busy_[static_cast<size_t>(s)] += t.total_us;
      Done(s, fwd_first ? f : st, first, (fwd_first ? f_in : in).last);
      Done(s, fwd_first ? st : f, rest, (fwd_first ? in : f_in).last);
      return;
    }
    const OpId id = g_->Add(op, {Input(s, st, in), own_fwd});
    if (!spec_.pairs.empty()) busy_[static_cast<size_t>(s)] += op.cost_us;
    Done(s, st, id, in.last);
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
      g_->Add(tail, {last_of_[static_cast<size_t>(s)]});
    }
  }

  // Each stage's last step (its last backward).
  const std::vector<OpId>& last_of() const { return last_of_; }
  // The time each stage's steps hold its device.
  const std::vector<double>& busy() const { return busy_; }

 private:
  size_t Idx(int s, int c, int i, bool fwd) const {
    return ((static_cast<size_t>(s) * v_ + c) * mbs_ + i) * 2 + (fwd ? 1 : 0);
  }

  // Step `st` ran as op `id`: the send after it, unless nothing reads it
  // (`last`).
  void Done(int s, const PipeStep& st, OpId id, bool last) {
    op_of_[Idx(s, st.chunk, st.mb, st.forward)] = id;
    last_of_[static_cast<size_t>(s)] = id;
    if (last) return;
    Op send;
    send.base = st.forward ? "pipe.send_fwd" : "pipe.send_bwd";
    send.block = static_cast<int16_t>(s);
    send.step = st.mb;
    send.part = static_cast<int16_t>(st.chunk);
    send.device = static_cast<int16_t>(s);
    send.kind = OpKind::kComm;
    send.phase = st.forward ? Phase::kForward : Phase::kBackward;
    send.term = Term::kSendRecv;
    send.resources = spec_.p2p_resource;
    send.cost_us = p2p_;
    send_of_[Idx(s, st.chunk, st.mb, st.forward)] = g_->Add(send, {id});
  }

  // The input: the send of the step feeding it (`in`, its FeedOf); the last
  // chunk's backward waits for its own forward.
  OpId Input(int s, const PipeStep& st, const PipeFeed& in) const {
    if (in.none) return kNoOp;
    if (in.stage == s && in.chunk == st.chunk && in.forward != st.forward) {
      return op_of_[Idx(s, st.chunk, st.mb, true)];
    }
    return send_of_[Idx(in.stage, in.chunk, st.mb, in.forward)];
  }

  const PipelineSpec& spec_;
  const int p_, v_, mbs_;
  Sink* g_;
  std::vector<OpId> op_of_, send_of_, last_of_;
  std::vector<double> busy_;
  std::optional<PipeStep> pending_;
  const double p2p_;
};

// The pipeline's end, busiest stage and bubble from its times: the
// makespan and `end_of(id)`, an op's end.
template <typename EndOf>
void Summarize(double makespan, const std::vector<OpId>& bwd_last, const std::vector<double>& busy,
               EndOf end_of, PipelineResult* out) {
  out->makespan_us = makespan;
  out->pipeline_end_us = 0.0;
  for (OpId id : bwd_last) out->pipeline_end_us = std::max(out->pipeline_end_us, end_of(id));
  double busiest = -1.0;
  for (size_t s = 0; s < busy.size(); ++s) {
    if (busy[s] > busiest) {
      busiest = busy[s];
      out->busiest_stage = static_cast<int>(s);
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
  if (!spec.pairs.empty() && spec.pairs.size() != static_cast<size_t>(p) * v * v) {
    return absl::InvalidArgumentError("pipeline: pairs must have stages * chunks^2 entries");
  }
  if (spec.schedule == PipelineSchedule::kDualPipe &&
      (v != 2 || p % 2 != 0 || m % 2 != 0 || m < 2 * p || spec.pairs.empty())) {
    return absl::InvalidArgumentError(
        "pipeline: dualpipe needs 2 chunks, even stages, an even number of micro-batches >= "
        "2 * stages and its pairs' times");
  }
  return absl::OkStatus();
}

// The walk's steps issued into `sink`, then the tails.
template <typename Sink>
absl::Status Issue(const PipelineSpec& spec, PipelineGraph<Sink>& graph) {
  MOEPLAN_RETURN_IF_ERROR(WalkPipeline(
      spec.schedule, spec.stages, spec.chunks, spec.microbatches,
      [&](int s, const PipeStep& st) { graph.Step(s, st); }, !spec.pairs.empty()));
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
      result->makespan_us, graph.last_of(), graph.busy(),
      [&](OpId id) { return result->times[static_cast<size_t>(id)].end_us; }, out);
  return absl::OkStatus();
}

namespace {

// The pipeline timed by a TimeSink (or one built on it) and summarised.
template <typename Sink>
absl::Status TimeWith(const PipelineSpec& spec, Sink& sink, PipelineResult* out) {
  MOEPLAN_RETURN_IF_ERROR(CheckSpec(spec));
  PipelineGraph<Sink> graph(spec, &sink);
  MOEPLAN_RETURN_IF_ERROR(Issue(spec, graph));
  Summarize(
      sink.makespan, graph.last_of(), graph.busy(),
      [&](OpId id) { return sink.s->ends[static_cast<size_t>(id)]; }, out);
  return absl::OkStatus();
}

}  // namespace

absl::Status TimePipeline(const PipelineSpec& spec, PipelineScratch* scratch, PipelineResult* out) {
  TimeSink sink{scratch};
  return TimeWith(spec, sink, out);
}

absl::Status TracePipeline(const PipelineSpec& spec, PipelineScratch* scratch,
                           std::vector<PipeSpan>* out, PipelineResult* summary) {
  out->clear();
  TraceSink sink;
  sink.s = scratch;
  sink.spans = out;
  return TimeWith(spec, sink, summary);
}

}  // namespace moeplan::planner
