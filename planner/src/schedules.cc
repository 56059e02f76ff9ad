#include "moeplan/planner/schedules.h"

#include <algorithm>
#include <cmath>

#include "graph_builder.h"
#include "moeplan/base/status.h"
#include "moeplan/planner/validate.h"

namespace moeplan::planner {

GroupShape ShapeOfGroup(int size, int stride, int gpus_per_node) {
  if (size <= 1) return {1, 1};
  if (stride >= gpus_per_node) return {size, size};  // consecutive members >= G apart
  const int64_t last = int64_t{size - 1} * stride;
  return {size, static_cast<int>(last / gpus_per_node + 1)};
}

Topology MakeTopology(const ParallelLayout& p, const ClusterShape& c) {
  Topology t;
  const int g = c.gpus_per_node;
  t.mp = ShapeOfGroup(p.mp, 1, g);
  t.esp = ShapeOfGroup(p.esp, 1, g);
  t.ep = ShapeOfGroup(p.ep, p.esp, g);
  t.ep_ranks_per_node = p.esp >= g ? 1 : std::min(p.ep, g / p.esp);
  return t;
}

namespace {

// Compute-op costs shared by all schedules. Sizes in elements, b bytes each.
class Kernels {
 public:
  explicit Kernels(const LayerContext& ctx) : l_(*ctx.layer), c_(*ctx.cost) {
    b_ = l_.bytes_per_element;
  }

  // Gate: logits GEMM [S x M]·[M x E], then softmax and top-k over S x E
  // (read logits, write probabilities, read them for top-k: 3 S E b bytes).
  double GateBytes(int64_t s) const { return 3.0 * s * l_.num_experts * b_; }
  double GateFwd(int64_t s) const {
    return c_.GemmUs(s, l_.num_experts, l_.model_dim) + c_.RouteUs(GateBytes(s));
  }
  // dX = dL·Wg^T and dWg = X^T·dL, plus the softmax backward (charged like
  // the forward's softmax and top-k: the same small per-token kernels).
  double GateBwd(int64_t s) const {
    return c_.GemmUs(s, l_.model_dim, l_.num_experts) + c_.GemmUs(l_.model_dim, l_.num_experts, s) +
           c_.RouteUs(GateBytes(s));
  }
  // Order / i-order: scatter S tokens into the (E, T, M) buffer or gather back.
  double OrderBytes(int64_t s, int64_t t) const {
    return static_cast<double>(s) * l_.model_dim * b_ +
           static_cast<double>(l_.num_experts) * t * l_.model_dim * b_;
  }
  // Scatter (fwd.order) and gather (fwd.iorder; bwd.order gathers the
  // dispatch gradient back).
  double Scatter(int64_t s, int64_t t) const { return c_.OrderUs(OrderBytes(s, t), false); }
  double Gather(int64_t s, int64_t t) const { return c_.OrderUs(OrderBytes(s, t), true); }
  // bwd.iorder scatters the output gradient like fwd.order and also reads the
  // combined expert outputs for the gate weights' gradient (one dot product
  // per routed row): the dispatch buffer is touched twice.
  double UnrouteBytes(int64_t s, int64_t t) const {
    return OrderBytes(s, t) + static_cast<double>(l_.num_experts) * t * l_.model_dim * b_;
  }
  double Unroute(int64_t s, int64_t t) const { return c_.OrderUs(UnrouteBytes(s, t), false); }
  // A local split copies its slice: read + write.
  double Split(double slice_bytes) const { return c_.MemoryBoundUs(2.0 * slice_bytes); }

  // Expert FFN shard on `rows` tokens per local expert: [rows x M]·[M x H'] and
  // [rows x H']·[H' x M] for each of E / ep local experts, plus the activation.
  int64_t LocalExperts() const { return l_.num_experts / l_.parallel.ep; }
  int64_t Shard() const { return l_.hidden_dim / l_.parallel.esp; }
  double ActBytes(int64_t rows) const {
    return static_cast<double>(LocalExperts()) * rows * Shard() * b_;
  }
  double ExpertFwd(int64_t rows) const {
    const int64_t h = Shard(), m = l_.model_dim;
    return LocalExperts() * (c_.GemmUs(rows, h, m) + c_.GemmUs(rows, m, h)) +
           c_.ActivationUs(2.0 * ActBytes(rows), /*backward=*/false);
  }
  // Input gradients: the two GEMMs transposed, and the activation backward.
  double ExpertDx(int64_t rows) const {
    const int64_t h = Shard(), m = l_.model_dim;
    return LocalExperts() * (c_.GemmUs(rows, h, m) + c_.GemmUs(rows, m, h)) +
           c_.ActivationUs(3.0 * ActBytes(rows), /*backward=*/true);
  }
  // Weight gradients: dW2 = A^T·dY [H' x M], dW1 = X^T·dA [M x H'], reducing over rows.
  double ExpertDw(int64_t rows) const {
    const int64_t h = Shard(), m = l_.model_dim;
    return LocalExperts() * (c_.GemmUs(h, m, rows) + c_.GemmUs(m, h, rows));
  }
  double ExpertBytes(int64_t rows) const {
    return static_cast<double>(LocalExperts()) * rows * l_.model_dim * b_ * 2.0 +
           2.0 * ActBytes(rows);
  }
  // Dropless token skew scales the heaviest rank's expert-side rows (a padded
  // buffer holds T rows however the tokens were routed).
  int64_t Skewed(int64_t rows) const {
    return static_cast<int64_t>(std::ceil(static_cast<double>(rows) * ExpertSkew(l_) - 1e-9));
  }

 private:
  const LayerConfig& l_;
  const CostModel& c_;
  int b_;
};

constexpr Phase F = Phase::kForward;
constexpr Phase B = Phase::kBackward;

using internal::Builder;
using internal::Deps;
using A2aNames = Builder::A2aNames;

// The four EP AlltoAll sites, linear and hierarchical names.
constexpr A2aNames kFwdDispatch{"fwd.ep_alltoall_dispatch", "fwd.ep_alltoall_dispatch.2dh_intra",
                                "fwd.ep_alltoall_dispatch.2dh_reorder",
                                "fwd.ep_alltoall_dispatch.2dh_inter"};
constexpr A2aNames kFwdCombine{"fwd.ep_alltoall_combine", "fwd.ep_alltoall_combine.2dh_intra",
                               "fwd.ep_alltoall_combine.2dh_reorder",
                               "fwd.ep_alltoall_combine.2dh_inter"};
constexpr A2aNames kBwdCombine{"bwd.ep_alltoall_combine", "bwd.ep_alltoall_combine.2dh_intra",
                               "bwd.ep_alltoall_combine.2dh_reorder",
                               "bwd.ep_alltoall_combine.2dh_inter"};
constexpr A2aNames kBwdDispatch{"bwd.ep_alltoall_dispatch", "bwd.ep_alltoall_dispatch.2dh_intra",
                                "bwd.ep_alltoall_dispatch.2dh_reorder",
                                "bwd.ep_alltoall_dispatch.2dh_inter"};

// Each schedule is written once, as five sections (schedules.h MoeSection);
// a single layer chains them, a whole model interleaves other ops between them.
// The expert backward is dX then dW; with detach_dw the dW op hangs off the
// chain (its inputs are dX's) instead of preceding the next op.
Deps ExpertBackward(Builder& b, const LayerContext& ctx, const Kernels& k, int64_t rows, Deps x) {
  const Deps dx =
      b.Compute("bwd.expert_dx", B, Term::kExpert, k.ExpertDx(rows), k.ExpertBytes(rows), x);
  const Deps dw = b.Compute("bwd.expert_dw", B, Term::kExpert, k.ExpertDw(rows),
                            k.ExpertBytes(rows), ctx.detach_dw ? x : dx, kWeightGrad);
  return ctx.detach_dw ? dx : dw;
}

// The bytes an EP AlltoAll is charged for: a dropless layer's heaviest rank
// receives token_skew times its balanced share, which costs as an even
// AlltoAll of the profile's skewed size on the EP shape (CostModel::
// SkewedAllToAllBytes); padded layers move `balanced` however they route.
double SkewedA2a(const LayerContext& ctx, double balanced) {
  return ctx.cost->SkewedAllToAllBytes(ctx.topo.ep, balanced, ExpertSkew(*ctx.layer));
}

// A dropless layer's dispatch is irregular: first every EP rank learns how many
// rows each peer will send it, an AlltoAll of one int64 count per expert (what
// dropless MoE systems exchange before their AlltoAllv).
constexpr std::string_view kCountsOp = "fwd.ep_alltoall_counts";
constexpr int kCountBytes = 8;
Deps DroplessCounts(Builder& b, const LayerContext& ctx, Deps x) {
  const LayerConfig& l = *ctx.layer;
  if (!l.dropless) return x;
  return b.Coll(kCountsOp, F, Collective::kAllToAll, ctx.topo.ep,
                static_cast<double>(kCountBytes) * l.num_experts, x);
}

Deps SectionDefault(MoeSection sec, const LayerContext& ctx, Builder& b, Deps x) {
  const LayerConfig& l = *ctx.layer;
  const Topology& t = ctx.topo;
  const Kernels k(ctx);
  const DerivedShape d = Derive(l);
  const int64_t s = d.tokens, cap = d.capacity;
  const double n = static_cast<double>(d.dispatch_bytes) * ExpertSkew(l);  // expert side
  const double a2a = SkewedA2a(ctx, static_cast<double>(d.dispatch_bytes));
  const int64_t rows = k.Skewed(int64_t{l.parallel.ep} * cap);  // per local expert
  const int q = t.ep_ranks_per_node;
  switch (sec) {
    case MoeSection::kFwdRoute:
      x = b.Compute("fwd.gate", F, Term::kGate, k.GateFwd(s), k.GateBytes(s), x);
      return b.Compute("fwd.order", F, Term::kOrder, k.Scatter(s, cap), k.OrderBytes(s, cap), x);
    case MoeSection::kFwdExchange:
      x = DroplessCounts(b, ctx, x);
      x = b.AllToAll(kFwdDispatch, F, ctx.a2a, t.ep, q, a2a, x);
      x = b.Compute("fwd.expert", F, Term::kExpert, k.ExpertFwd(rows), k.ExpertBytes(rows), x);
      x = b.Coll("fwd.esp_allreduce", F, Collective::kAllReduce, t.esp, n, x);
      x = b.AllToAll(kFwdCombine, F, ctx.a2a, t.ep, q, a2a, x);
      return b.Compute("fwd.iorder", F, Term::kOrder, k.Gather(s, cap), k.OrderBytes(s, cap), x);
    case MoeSection::kBwdUnroute:
      return b.Compute("bwd.iorder", B, Term::kOrder, k.Unroute(s, cap), k.UnrouteBytes(s, cap), x);
    case MoeSection::kBwdExchange:
      x = b.AllToAll(kBwdCombine, B, ctx.a2a, t.ep, q, a2a, x);
      // The output gradient is replicated over the ESP group, so the forward
      // AllReduce's dual is the sum of the shards' partial input gradients,
      // after the expert.
      x = ExpertBackward(b, ctx, k, rows, x);
      x = b.Coll("bwd.esp_allreduce", B, Collective::kAllReduce, t.esp, n, x);
      return b.AllToAll(kBwdDispatch, B, ctx.a2a, t.ep, q, a2a, x);
    case MoeSection::kBwdRoute:
      x = b.Compute("bwd.order", B, Term::kOrder, k.Gather(s, cap), k.OrderBytes(s, cap), x);
      return b.Compute("bwd.gate", B, Term::kGate, k.GateBwd(s), k.GateBytes(s), x);
  }
  return x;
}

Deps SectionS1(MoeSection sec, const LayerContext& ctx, Builder& b, Deps x) {
  const LayerConfig& l = *ctx.layer;
  const Topology& t = ctx.topo;
  const Kernels k(ctx);
  const int n = l.parallel.mp;
  const DerivedShape d = Derive(l);
  const int64_t s1 = d.tokens / n;            // tokens per rank after the MP split
  const int64_t cap1 = RouteCapacity(l, s1);  // per rank
  const double d1 = static_cast<double>(l.num_experts) * cap1 * l.model_dim * l.bytes_per_element;
  const double x1 = static_cast<double>(d.activation_bytes) / n;
  const double skew = ExpertSkew(l);
  const double a2a = SkewedA2a(ctx, d1);
  const int64_t rows = k.Skewed(int64_t{n} * l.parallel.ep * cap1);
  const double gate_grad = static_cast<double>(l.model_dim) * l.num_experts * l.bytes_per_element;
  const int q = t.ep_ranks_per_node;
  switch (sec) {
    case MoeSection::kFwdRoute:
      x = b.Compute("fwd.mp_split", F, Term::kSplit, k.Split(x1), 2.0 * x1, x);
      x = b.Compute("fwd.gate", F, Term::kGate, k.GateFwd(s1), k.GateBytes(s1), x);
      return b.Compute("fwd.order", F, Term::kOrder, k.Scatter(s1, cap1), k.OrderBytes(s1, cap1),
                       x);
    case MoeSection::kFwdExchange:
      x = DroplessCounts(b, ctx, x);
      x = b.AllToAll(kFwdDispatch, F, ctx.a2a, t.ep, q, a2a, x);
      x = b.Coll("fwd.esp_allgather", F, Collective::kAllGather, t.esp, d1 * skew, x);
      x = b.Compute("fwd.expert", F, Term::kExpert, k.ExpertFwd(rows), k.ExpertBytes(rows), x);
      x = b.Coll("fwd.esp_reducescatter", F, Collective::kReduceScatter, t.esp, d1 * skew, x);
      x = b.AllToAll(kFwdCombine, F, ctx.a2a, t.ep, q, a2a, x);
      x = b.Compute("fwd.iorder", F, Term::kOrder, k.Gather(s1, cap1), k.OrderBytes(s1, cap1), x);
      return b.Coll("fwd.mp_allgather", F, Collective::kAllGather, t.mp, x1, x);
    // Backward: the dual of each op in reverse (MP-AllGather -> local split,
    // AllGather <-> ReduceScatter, AlltoAll -> AlltoAll, split -> AllGather).
    case MoeSection::kBwdUnroute:
      x = b.Compute("bwd.mp_split", B, Term::kSplit, k.Split(x1), 2.0 * x1, x);
      return b.Compute("bwd.iorder", B, Term::kOrder, k.Unroute(s1, cap1), k.UnrouteBytes(s1, cap1),
                       x);
    case MoeSection::kBwdExchange:
      x = b.AllToAll(kBwdCombine, B, ctx.a2a, t.ep, q, a2a, x);
      x = b.Coll("bwd.esp_allgather", B, Collective::kAllGather, t.esp, d1 * skew, x);
      x = ExpertBackward(b, ctx, k, rows, x);
      x = b.Coll("bwd.esp_reducescatter", B, Collective::kReduceScatter, t.esp, d1 * skew, x);
      return b.AllToAll(kBwdDispatch, B, ctx.a2a, t.ep, q, a2a, x);
    case MoeSection::kBwdRoute:
      x = b.Compute("bwd.order", B, Term::kOrder, k.Gather(s1, cap1), k.OrderBytes(s1, cap1), x);
      x = b.Compute("bwd.gate", B, Term::kGate, k.GateBwd(s1), k.GateBytes(s1), x);
      // The gate weights saw only S/N tokens per rank: their gradient is summed
      // over MP (a side branch: only the optimizer waits for it).
      b.Coll("bwd.mp_allreduce_gate", B, Collective::kAllReduce, t.mp, gate_grad, x);
      return b.Coll("bwd.mp_allgather", B, Collective::kAllGather, t.mp, x1, x);
  }
  return x;
}

Deps SectionS2(MoeSection sec, const LayerContext& ctx, Builder& b, Deps x) {
  const LayerConfig& l = *ctx.layer;
  const Topology& t = ctx.topo;
  const Kernels k(ctx);
  const int n = l.parallel.mp;
  const DerivedShape d = Derive(l);
  const int64_t s = d.tokens;
  // Routing and dropping are exactly the default's at capacity T; the (E, T, M)
  // buffer is split along T, padded to a multiple of N with empty slots.
  const int64_t cap2 = (d.capacity + n - 1) / n * n;
  const double dn = static_cast<double>(l.num_experts) * cap2 * l.model_dim * l.bytes_per_element /
                    n;  // per rank after the split
  const double skew = ExpertSkew(l);
  const double a2a = SkewedA2a(ctx, dn);  // the SAA exchanges' bytes
  const int64_t rows = k.Skewed(int64_t{l.parallel.ep} * cap2);
  const int q = t.ep_ranks_per_node;
  const int w = l.parallel.ep;
  switch (sec) {
    case MoeSection::kFwdRoute:
      x = b.Compute("fwd.gate", F, Term::kGate, k.GateFwd(s), k.GateBytes(s), x);
      x = b.Compute("fwd.order", F, Term::kOrder, k.Scatter(s, cap2), k.OrderBytes(s, cap2), x);
      return b.Compute("fwd.mp_split", F, Term::kSplit, k.Split(dn), 2.0 * dn, x);
    case MoeSection::kFwdExchange:
      x = DroplessCounts(b, ctx, x);
      // SAA dispatch: EP-AlltoAll(D/N) fused with ESP-AllGather (expert side: skewed).
      x = b.SaaGather("fwd.saa_dispatch.alltoall", "fwd.saa_dispatch.allgather", F, t.ep, q, t.esp,
                      a2a, dn * skew / w, x);
      x = b.Compute("fwd.expert", F, Term::kExpert, k.ExpertFwd(rows), k.ExpertBytes(rows), x);
      x = b.Coll("fwd.esp_reducescatter", F, Collective::kReduceScatter, t.esp, dn * skew, x);
      // SAA combine: EP-AlltoAll(D/N) fused with MP-AllGather (token side).
      x = b.SaaGather("fwd.saa_combine.alltoall", "fwd.saa_combine.allgather", F, t.ep, q, t.mp,
                      a2a, dn / w, x);
      return b.Compute("fwd.iorder", F, Term::kOrder, k.Gather(s, cap2), k.OrderBytes(s, cap2), x);
    // Backward. The combine's MP-AllGather has a local split as dual; the
    // AlltoAll that follows it feeds the dual of the forward ESP-ReduceScatter
    // (an ESP-AllGather), so the pair is again an SAA. The dispatch's dual is
    // the ReduceScatter pipelined with the AlltoAll, then the dual of the
    // forward MP-split (an MP-AllGather of D/N).
    case MoeSection::kBwdUnroute:
      x = b.Compute("bwd.iorder", B, Term::kOrder, k.Unroute(s, cap2), k.UnrouteBytes(s, cap2), x);
      return b.Compute("bwd.mp_split", B, Term::kSplit, k.Split(dn), 2.0 * dn, x);
    case MoeSection::kBwdExchange:
      x = b.SaaGather("bwd.saa_combine.alltoall", "bwd.saa_combine.allgather", B, t.ep, q, t.esp,
                      a2a, dn * skew / w, x);
      x = ExpertBackward(b, ctx, k, rows, x);
      return b.SaaScatter("bwd.saa_dispatch.reducescatter", "bwd.saa_dispatch.alltoall", B, t.ep, q,
                          t.esp, a2a, dn * skew / w, x);
    case MoeSection::kBwdRoute:
      x = b.Coll("bwd.mp_allgather", B, Collective::kAllGather, t.mp, dn, x);
      x = b.Compute("bwd.order", B, Term::kOrder, k.Gather(s, cap2), k.OrderBytes(s, cap2), x);
      return b.Compute("bwd.gate", B, Term::kGate, k.GateBwd(s), k.GateBytes(s), x);
  }
  return x;
}

// PPMoE: every MP rank holds the layer's tokens (replicated by Megatron TP)
// and E/ep experts, each sharded esp ways (ep * esp = mp). A rank gates all S
// tokens, index-selects the capacity-T rows of its local experts, runs them,
// scatter-adds the weighted outputs into a partial [S x M], and the MP group
// AllReduces it. Backward: the output gradient is already replicated (the
// AllReduce's dual is the identity); the input gradient is partial per rank
// and is AllReduced over MP, as Megatron's TP MLP does.
Deps SectionLocal(MoeSection sec, const LayerContext& ctx, Builder& b, Deps x) {
  const LayerConfig& l = *ctx.layer;
  const Topology& t = ctx.topo;
  const Kernels k(ctx);
  const DerivedShape d = Derive(l);
  const int64_t s = d.tokens, cap = d.capacity;
  const int64_t rows = k.Skewed(cap);  // per local expert
  const double x_bytes = static_cast<double>(d.activation_bytes);
  const double rows_bytes =
      static_cast<double>(k.LocalExperts()) * cap * l.model_dim * l.bytes_per_element;
  const double select = x_bytes + rows_bytes;
  const double unroute = select + rows_bytes;  // + the rows read for the gate weights' gradient
  switch (sec) {
    case MoeSection::kFwdRoute:
      x = b.Compute("fwd.gate", F, Term::kGate, k.GateFwd(s), k.GateBytes(s), x);
      return b.Compute("fwd.index_select", F, Term::kOrder, ctx.cost->OrderUs(select, false),
                       select, x);
    case MoeSection::kFwdExchange:
      x = b.Compute("fwd.expert", F, Term::kExpert, k.ExpertFwd(rows), k.ExpertBytes(rows), x);
      x = b.Compute("fwd.iorder", F, Term::kOrder, ctx.cost->OrderUs(select, true), select, x);
      return b.Coll("fwd.mp_allreduce_combine", F, Collective::kAllReduce, t.mp, x_bytes, x);
    case MoeSection::kBwdUnroute:
      return b.Compute("bwd.iorder", B, Term::kOrder, ctx.cost->OrderUs(unroute, false), unroute,
                       x);
    case MoeSection::kBwdExchange:
      return ExpertBackward(b, ctx, k, rows, x);
    case MoeSection::kBwdRoute:
      x = b.Compute("bwd.index_select", B, Term::kOrder, ctx.cost->OrderUs(select, true), select,
                    x);
      x = b.Compute("bwd.gate", B, Term::kGate, k.GateBwd(s), k.GateBytes(s), x);
      return b.Coll("bwd.mp_allreduce", B, Collective::kAllReduce, t.mp, x_bytes, x);
  }
  return x;
}

}  // namespace

OpId AppendSaa(const CostModel& cost, GroupShape a2a, int a2a_ranks_per_node, GroupShape gather,
               double a2a_bytes, double gather_chunk_bytes, Phase phase, OpId dep, OpGraph* graph) {
  Builder b(cost, graph);
  const Deps out = b.SaaGather("saa.alltoall", "saa.allgather", phase, a2a, a2a_ranks_per_node,
                               gather, a2a_bytes, gather_chunk_bytes, Deps{dep});
  return out.a;
}

Frontier AppendSection(Schedule schedule, MoeSection section, const LayerContext& ctx,
                       OpGraph* graph, Frontier in) {
  Builder b(*ctx.cost, graph);
  b.Stamp(ctx.block, ctx.block >= 0 ? kMoeScope : 0);
  Deps x{in.a, in.b};
  if (ctx.local_dispatch) {
    x = SectionLocal(section, ctx, b, x);
    return {x.a, x.b};
  }
  switch (schedule) {
    case Schedule::kDefault:
      x = SectionDefault(section, ctx, b, x);
      break;
    case Schedule::kS1:
      x = SectionS1(section, ctx, b, x);
      break;
    case Schedule::kS2:
      x = SectionS2(section, ctx, b, x);
      break;
  }
  return {x.a, x.b};
}

absl::Status BuildSchedule(Schedule schedule, const LayerContext& ctx, OpGraph* graph) {
  MOEPLAN_RETURN_IF_ERROR(ValidateForSchedule(*ctx.layer, schedule));
  if (schedule != Schedule::kDefault && schedule != Schedule::kS1 && schedule != Schedule::kS2) {
    return absl::InvalidArgumentError("schedule: unknown schedule");
  }
  Frontier x;
  for (MoeSection s : kMoeSections) x = AppendSection(schedule, s, ctx, graph, x);
  return absl::OkStatus();
}

}  // namespace moeplan::planner
