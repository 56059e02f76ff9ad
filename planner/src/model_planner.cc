// The whole-model planner of docs/model.md: the forward as a list of units
// (one dense op, or one section of an MoE schedule), emitted whole or split
// into k micro-batches per range; the backward in reverse with dX and dW ops;
// DDP gradient buckets and the optimizer step; then Lancet's two passes
// (operator partition, dW placement) and Tutel's pipelining as variants.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "graph_builder.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/schedules.h"
#include "moeplan/planner/validate.h"

namespace moeplan::planner {
namespace {

using internal::Builder;
using internal::Deps;
constexpr Phase F = Phase::kForward;
constexpr Phase B = Phase::kBackward;
constexpr double kInf = std::numeric_limits<double>::infinity();

enum class UnitKind : uint8_t {
  kEmbed,
  kLn1,
  kQkv,
  kAttnScore,
  kSoftmax,
  kAttnCtx,
  kProj,
  kProjAllReduce,
  kResidual1,
  kLn2,
  kFc1,
  kGelu,
  kFc2,
  kFc2AllReduce,
  kResidual2,
  kMoeRoute,
  kSharedFc1,
  kSharedAct,
  kSharedFc2,
  kSharedAllReduce,
  kMoeExchange,
  kLnF,
  kLmHead,
  kLoss,
};

bool IsMoeUnit(UnitKind k) { return k >= UnitKind::kMoeRoute && k <= UnitKind::kMoeExchange; }
// The shared expert's dense units, inside an MoE block's scope.
bool IsSharedExpertUnit(UnitKind k) {
  return k >= UnitKind::kSharedFc1 && k <= UnitKind::kSharedAllReduce;
}
// The routed experts' units: the MoE schedule's sections.
bool IsRoutedUnit(UnitKind k) { return IsMoeUnit(k) && !IsSharedExpertUnit(k); }
bool IsAttention(UnitKind k) {
  return k == UnitKind::kAttnScore || k == UnitKind::kSoftmax || k == UnitKind::kAttnCtx;
}

// One forward unit; inputs are earlier unit indices (-1: none).
struct Unit {
  UnitKind kind;
  int16_t block;
  int in_a = -1;
  int in_b = -1;
};

// Units [begin, end) split into k micro-batches.
struct Range {
  int begin = 0, end = 0, k = 1;
  double us = 0.0;
};

// A parameter's gradient: the op that completes it, its bytes, and whether it
// is an expert's (synchronised over the expert replicas, not the dense DP group).
struct Param {
  double bytes;
  OpId producer;
  bool expert = false;
};

// One backward AlltoAll (a linear collective, the ops of a hierarchical one,
// or an SAA's steps): where dW ops may go.
struct Slot {
  std::string name;
  OpId first = kNoOp;
  OpId last = kNoOp;
  std::vector<OpId> ops;
};

// "bwd.ep_alltoall_combine.2dh_intra" -> "bwd.ep_alltoall_combine"; "bwd.saa_combine.alltoall" ->
// "bwd.saa_combine".
std::string_view Site(std::string_view base) {
  const size_t first = base.find('.');
  const size_t second = base.find('.', first + 1);
  return second == std::string_view::npos ? base : base.substr(0, second);
}

std::string NameWithoutPart(Op op) {
  op.part = -1;
  return op.Name();
}

// What the dense ops compute (op_exec.h): shapes only, on scratch memory.
OpExec DenseMemory(double bytes, double bytes_per_element) {
  return {.kind = ExecKind::kDenseMemory, .count = internal::Bytes(bytes / bytes_per_element)};
}
// `groups` x `reps` GEMMs of m x n x k.
OpExec DenseGemm(int64_t m, int64_t n, int64_t k, int64_t groups = 1, int reps = 1) {
  return {.kind = ExecKind::kDenseGemm,
          .parts = reps,
          .groups = static_cast<int32_t>(groups),
          .tokens = m,
          .rows = n,
          .count = k};
}
OpExec DenseColl(ExecKind kind, ExecGroup group, double bytes, double bytes_per_element) {
  return {.kind = kind, .group = group, .count = internal::Bytes(bytes / bytes_per_element)};
}
constexpr OpExec kJoin = {.kind = ExecKind::kNop};

}  // namespace

struct ModelPlanner::Impl {
  explicit Impl(const CostModel& c) : cost(c) {}

  const CostModel& cost;
  // ---- Per plan ----
  const ModelConfig* m = nullptr;
  ModelPlanOptions opt;
  StageOptions st;
  int first_block = 0, end_block = 0;
  GroupShape edp_shape;
  LayerConfig moe_layer;
  Topology topo;
  GroupShape mp_shape, dp_shape;
  std::vector<Unit> units;
  std::vector<int> bounds;  // segment boundaries, unit indices, 0 ... units.size()
  int max_span = 1;
  // ---- Per (schedule, algorithm) ----
  Schedule sched = Schedule::kDefault;
  AllToAllAlgo algo = AllToAllAlgo::kLinear;
  uint64_t combo_salt = 0;
  uint64_t context_salt = 0;  // the model, layout and stage a range's costs depend on
  // ---- Scratch ----
  OpGraph scratch, range_graph, g0, final_graph;
  Simulator simulator;
  SimResult range_sim, sim0, final_sim;
  std::vector<OpId> map, dep_buf;
  std::vector<int> piece_begin, piece_k;
  std::vector<int16_t> layer_of;  // EmitRange: each piece's MoE layer instance
  std::vector<std::array<OpId, 2>> piece_out;
  std::vector<Param> params;
  std::vector<Slot> slots;
  std::vector<OpId> dw_ops;
  std::vector<OpId> range_first, range_last;
  absl::flat_hash_map<uint64_t, double> p_cache;
  std::vector<uint32_t> key_buf;
  Reachability reach;

  int64_t Tokens(int k) const { return (m->micro_batch_size * m->seq_length + k - 1) / k; }
  int64_t Seqs(int k) const { return (m->micro_batch_size + k - 1) / k; }

  LayerContext MoeContext(const LayerConfig* layer, int block, bool detach) const {
    LayerContext ctx;
    ctx.layer = layer;
    ctx.cost = &cost;
    ctx.topo = topo;
    ctx.a2a = algo;
    ctx.detach_dw = detach;
    ctx.block = block;
    ctx.local_dispatch = st.local_dispatch;
    return ctx;
  }

  // ---------------- Forward ----------------

  void BuildUnits() {
    units.clear();
    const int t = m->parallel.mp;
    auto add = [&](UnitKind k, int block, int in_a, int in_b = -1) {
      units.push_back({k, static_cast<int16_t>(block), in_a, in_b});
      return static_cast<int>(units.size()) - 1;
    };
    int prev = -1;
    auto chain = [&](UnitKind k, int block) { return prev = add(k, block, prev); };
    if (m->vocab_size > 0 && st.embed) chain(UnitKind::kEmbed, -1);
    for (int blk = first_block; blk < end_block; ++blk) {
      for (UnitKind k : {UnitKind::kLn1, UnitKind::kQkv, UnitKind::kAttnScore, UnitKind::kSoftmax,
                         UnitKind::kAttnCtx, UnitKind::kProj}) {
        chain(k, blk);
      }
      if (t > 1) chain(UnitKind::kProjAllReduce, blk);
      chain(UnitKind::kResidual1, blk);
      const int ln2 = chain(UnitKind::kLn2, blk);
      if (m->IsMoeBlock(blk)) {
        const int route = chain(UnitKind::kMoeRoute, blk);
        int shared = -1;
        if (m->moe.shared_expert_ffn_hidden_size > 0) {
          prev = ln2;  // the shared expert reads the layer input, beside the routed experts
          chain(UnitKind::kSharedFc1, blk);
          chain(UnitKind::kSharedAct, blk);
          shared = chain(UnitKind::kSharedFc2, blk);
          if (t > 1) shared = chain(UnitKind::kSharedAllReduce, blk);
        }
        prev = route;
        const int exchange = chain(UnitKind::kMoeExchange, blk);
        prev = add(UnitKind::kResidual2, blk, exchange, shared);
      } else {
        for (UnitKind k : {UnitKind::kFc1, UnitKind::kGelu, UnitKind::kFc2}) chain(k, blk);
        if (t > 1) chain(UnitKind::kFc2AllReduce, blk);
        chain(UnitKind::kResidual2, blk);
      }
    }
    if (m->vocab_size > 0 && st.head) {
      chain(UnitKind::kLnF, -1);
      chain(UnitKind::kLmHead, -1);
      chain(UnitKind::kLoss, -1);
    }
  }

  // Appends a unit's ops for a micro-batch of k pieces' size after `x`.
  Deps BuildUnit(const Unit& u, int k, Builder& b, Deps x, LayerConfig* piece_layer) {
    const ModelConfig& mm = *m;
    const int64_t s = Tokens(k), q = Seqs(k);
    const int64_t M = mm.hidden_size, L = mm.seq_length, t = mm.parallel.mp;
    const int64_t hp = mm.num_attention_heads / t, d = M / mm.num_attention_heads;
    const int64_t f = mm.ffn_hidden_size / t, fs = mm.moe.shared_expert_ffn_hidden_size / t;
    const int64_t v = mm.vocab_size / t;
    const double e = mm.bytes_per_element;
    const double sm = static_cast<double>(s) * M * e;  // one activation, bytes
    const CostModel& c = cost;
    auto mem = [&](std::string_view name, double bytes) {
      return b.Compute(name, F, Term::kDense, c.MemoryBoundUs(bytes), bytes, x, 0,
                       DenseMemory(bytes, e));
    };
    auto gemm = [&](std::string_view name, int64_t mm_, int64_t nn, int64_t kk) {
      return b.Compute(name, F, Term::kDense, c.GemmUs(mm_, nn, kk),
                       e * static_cast<double>(mm_ * kk + kk * nn + mm_ * nn), x, 0,
                       DenseGemm(mm_, nn, kk));
    };
    auto allreduce = [&](std::string_view name) {
      return b.Coll(name, F, Collective::kAllReduce, mp_shape, sm, x,
                    DenseColl(ExecKind::kAllReduce, ExecGroup::kMp, sm, e));
    };
    switch (u.kind) {
      case UnitKind::kEmbed:
        return mem("fwd.embed", 3.0 * sm);
      case UnitKind::kLn1:
        return mem("fwd.ln1", 2.0 * sm);
      case UnitKind::kQkv:
        return gemm("fwd.qkv", s, 3 * M / t, M);
      case UnitKind::kAttnScore:
        return b.Compute("fwd.attn_score", F, Term::kDense, c.BatchedGemmUs(q * hp, L, L, d),
                         e * q * hp * (2.0 * L * d + L * L), x, 0, DenseGemm(L, L, d, q * hp));
      case UnitKind::kSoftmax:
        return mem("fwd.softmax", 2.0 * e * q * hp * L * L);
      case UnitKind::kAttnCtx:
        return b.Compute("fwd.attn_ctx", F, Term::kDense, c.BatchedGemmUs(q * hp, L, d, L),
                         e * q * hp * (2.0 * L * d + L * L), x, 0, DenseGemm(L, d, L, q * hp));
      case UnitKind::kProj:
        return gemm("fwd.proj", s, M, M / t);
      case UnitKind::kProjAllReduce:
        return allreduce("fwd.proj_allreduce");
      case UnitKind::kResidual1:
        return mem("fwd.residual1", 3.0 * sm);
      case UnitKind::kLn2:
        return mem("fwd.ln2", 2.0 * sm);
      case UnitKind::kFc1:
        return gemm("fwd.fc1", s, f, M);
      case UnitKind::kGelu:
        return mem("fwd.gelu", 2.0 * e * s * f);
      case UnitKind::kFc2:
        return gemm("fwd.fc2", s, M, f);
      case UnitKind::kFc2AllReduce:
        return allreduce("fwd.fc2_allreduce");
      case UnitKind::kResidual2:
        return mem("fwd.residual2", 3.0 * sm);
      case UnitKind::kSharedFc1:
        return gemm("fwd.shared_fc1", s, fs, M);
      case UnitKind::kSharedAct:
        return mem("fwd.shared_act", 2.0 * e * s * fs);
      case UnitKind::kSharedFc2:
        return gemm("fwd.shared_fc2", s, M, fs);
      case UnitKind::kSharedAllReduce:
        return allreduce("fwd.shared_allreduce");
      case UnitKind::kMoeRoute:
      case UnitKind::kMoeExchange: {
        *piece_layer = moe_layer;
        piece_layer->batch_size = 1;
        piece_layer->seq_len = s;
        const LayerContext ctx = MoeContext(piece_layer, -1, false);
        const Frontier out = AppendSection(
            sched, u.kind == UnitKind::kMoeRoute ? MoeSection::kFwdRoute : MoeSection::kFwdExchange,
            ctx, b.graph(), {x.a, x.b});
        return {out.a, out.b};
      }
      case UnitKind::kLnF:
        return mem("fwd.ln_f", 2.0 * sm);
      case UnitKind::kLmHead:
        return gemm("fwd.lm_head", s, v, M);
      case UnitKind::kLoss:
        return mem("fwd.loss", 3.0 * e * s * v);
    }
    return x;
  }

  void AppendInputs(const Unit& u, int range_begin, int p, bool standalone) {
    for (int in : {u.in_a, u.in_b}) {
      if (in < 0) continue;
      if (in >= range_begin) {
        const auto& o = piece_out[static_cast<size_t>(piece_begin[in] + p)];
        dep_buf.push_back(o[0]);
        dep_buf.push_back(o[1]);
      } else if (!standalone) {
        for (int r = 0; r < piece_k[in]; ++r) {
          const auto& o = piece_out[static_cast<size_t>(piece_begin[in] + r)];
          dep_buf.push_back(o[0]);
          dep_buf.push_back(o[1]);
        }
      }
    }
  }

  // Emits units [u0, u1) split k ways: for each unit, its ops in order, each op
  // for every piece before the next op ("stages in order, pieces in index
  // order within a stage"), piece p depending on piece p of its inputs.
  // `standalone`: inputs outside the range are ready at 0 (the DP's P).
  void EmitRange(int u0, int u1, int k, OpGraph* g, bool standalone) {
    LayerConfig piece_layer;
    for (int j = u0; j < u1; ++j) {
      const Unit& u = units[static_cast<size_t>(j)];
      const Deps gather = u.kind == UnitKind::kLn1 ? ZeroGather(g, u.block, F) : Deps{};
      scratch.Clear();
      Builder sb(cost, &scratch);
      const Deps lf = BuildUnit(u, k, sb, Deps{}, &piece_layer);
      const int n = scratch.size();
      map.assign(static_cast<size_t>(n) * k, kNoOp);
      piece_begin[static_cast<size_t>(j)] = static_cast<int>(piece_out.size());
      piece_k[static_cast<size_t>(j)] = k;
      const bool moe = IsRoutedUnit(u.kind);
      if (moe) {
        for (BufAlias a : scratch.aliases()) {
          a.block = u.block;
          g->Alias(a);
        }
      }
      // The routed experts' ops use the buffers of their block's instance for
      // their piece (a whole micro-batch: part -1).
      layer_of.assign(static_cast<size_t>(k), 0);
      for (int p = 0; moe && p < k; ++p) {
        layer_of[static_cast<size_t>(p)] =
            g->AddLayer({u.block, static_cast<int16_t>(k > 1 ? p : -1), Tokens(k)});
      }
      for (int l = 0; l < n; ++l) {
        Op op = scratch.op(l);
        op.block = u.block;
        if (IsMoeUnit(u.kind)) op.flags |= kMoeScope;
        OpExec exec = scratch.exec(l);
        const auto local = scratch.deps(l);
        for (int p = 0; p < k; ++p) {
          if (k > 1) op.part = static_cast<int16_t>(p);
          exec.layer = layer_of[static_cast<size_t>(p)];
          dep_buf.clear();
          if (local.empty()) {
            AppendInputs(u, u0, p, standalone);
            dep_buf.push_back(gather.a);
            dep_buf.push_back(gather.b);
          } else {
            for (OpId dl : local) dep_buf.push_back(map[static_cast<size_t>(dl) * k + p]);
          }
          map[static_cast<size_t>(l) * k + p] = g->Add(op, dep_buf, exec);
        }
      }
      for (int p = 0; p < k; ++p) {
        auto at = [&](OpId lo) {
          return lo == kNoOp ? kNoOp : map[static_cast<size_t>(lo) * k + p];
        };
        piece_out.push_back({at(lf.a), at(lf.b)});
      }
    }
  }

  void ResetPieces() {
    piece_out.clear();
    piece_begin.assign(units.size(), 0);
    piece_k.assign(units.size(), 1);
  }

  // ZeRO-3: a block's parameters are gathered over their DP groups before its
  // forward and again before its backward. The gathers depend on nothing, so
  // they run ahead on the link as far as its FIFO allows (prefetch).
  Deps ZeroGather(OpGraph* g, int block, Phase phase) {
    if (st.zero_stage < 3) return {};
    Builder b(cost, g);
    b.Stamp(block, kPrefetch);
    const double e = m->bytes_per_element;
    const bool moe = m->IsMoeBlock(block);
    const RankParams params = BlockParams(*m, block);
    const double dense = params.dense * e;
    Deps out;
    const char* name = phase == F ? "fwd.zero_param_allgather" : "bwd.zero_param_allgather";
    if (dp_shape.ranks > 1) {
      out.a = b.Coll(name, phase, Collective::kAllGather, dp_shape, dense / dp_shape.ranks, {},
                     DenseColl(ExecKind::kAllGather, ExecGroup::kDp, dense / dp_shape.ranks, e))
                  .a;
    }
    if (moe && edp_shape.ranks > 1) {
      const char* ename = phase == F ? "fwd.zero_expert_allgather" : "bwd.zero_expert_allgather";
      out.b = b.Coll(ename, phase, Collective::kAllGather, edp_shape,
                     params.expert * e / edp_shape.ranks, {},
                     DenseColl(ExecKind::kAllGather, ExecGroup::kEdp,
                               params.expert * e / edp_shape.ranks, e))
                  .a;
    }
    return out;
  }

  // ---------------- Backward ----------------

  // Appends the backward after `fwd_end` into g0; records params, slots, dW ops.
  void EmitBackward(Deps x, bool detach) {
    const ModelConfig& mm = *m;
    const int64_t S = mm.micro_batch_size * mm.seq_length, Bq = mm.micro_batch_size;
    const int64_t M = mm.hidden_size, L = mm.seq_length, t = mm.parallel.mp;
    const int64_t hp = mm.num_attention_heads / t, d = M / mm.num_attention_heads;
    const int64_t f = mm.ffn_hidden_size / t, fs = mm.moe.shared_expert_ffn_hidden_size / t;
    const int64_t v = mm.vocab_size / t;
    const double e = mm.bytes_per_element;
    const double sm = static_cast<double>(S) * M * e;
    const CostModel& c = cost;
    Builder b(cost, &g0);
    auto mem = [&](std::string_view name, double bytes, Deps in) {
      return b.Compute(name, B, Term::kDense, c.MemoryBoundUs(bytes), bytes, in, 0,
                       DenseMemory(bytes, e));
    };
    auto gemm = [&](std::string_view name, int64_t mm_, int64_t nn, int64_t kk, Deps in,
                    uint8_t flags = 0) {
      return b.Compute(name, B, Term::kDense, c.GemmUs(mm_, nn, kk),
                       e * static_cast<double>(mm_ * kk + kk * nn + mm_ * nn), in, flags,
                       DenseGemm(mm_, nn, kk));
    };
    auto allreduce = [&](std::string_view name, Deps in) {
      return b.Coll(name, B, Collective::kAllReduce, mp_shape, sm, in,
                    DenseColl(ExecKind::kAllReduce, ExecGroup::kMp, sm, e));
    };
    auto join = [&](std::string_view name, Deps in) {
      return b.Compute(name, B, Term::kDense, 0.0, 0.0, in, 0, kJoin);
    };
    auto param = [&](double elements, Deps producer) {
      params.push_back({elements * e, producer.a});
    };
    // A weight GEMM's backward: dX, then dW (off the chain when detached).
    auto linear = [&](std::string_view dx_name, std::string_view dw_name, int64_t in_f,
                      int64_t out_f, double param_elements, Deps in) {
      const Deps dx = gemm(dx_name, S, in_f, out_f, in);
      const Deps dw = gemm(dw_name, out_f, in_f, S, detach ? in : dx, kWeightGrad);
      dw_ops.push_back(dw.a);
      param(param_elements, dw);
      return detach ? dx : dw;
    };

    if (mm.vocab_size > 0 && st.head) {
      b.Stamp(-1, 0);
      x = mem("bwd.loss", 3.0 * e * S * v, x);
      // The tied embedding's gradient completes at bwd.embed (below); a last
      // stage without the embedding holds its own copy (Megatron-LM).
      const Deps dx = gemm("bwd.lm_head_dx", S, M, v, x);
      const Deps dw = gemm("bwd.lm_head_dw", v, M, S, detach ? x : dx, kWeightGrad);
      dw_ops.push_back(dw.a);
      if (!st.embed) param(static_cast<double>(v) * M, dw);
      x = detach ? dx : dw;
      if (t > 1) x = allreduce("bwd.lm_head_allreduce", x);
      x = mem("bwd.ln_f", 3.0 * sm, x);
      param(2.0 * M, x);
    }
    for (int blk = end_block - 1; blk >= first_block; --blk) {
      if (st.zero_stage == 3) {
        const Deps gather = ZeroGather(&g0, blk, B);
        if (gather.a != kNoOp || gather.b != kNoOp) {
          b.Stamp(blk, 0);
          x = join("bwd.zero_wait", {x.a, gather.a});
          if (gather.b != kNoOp) x = join("bwd.zero_wait", {x.a, gather.b});
        }
      }
      b.Stamp(blk, 0);
      const Deps out_grad = x;
      if (mm.IsMoeBlock(blk)) {
        const LayerContext ctx = MoeContext(&moe_layer, blk, detach);
        // The routed experts' backward ops use the block's whole-micro-batch instance.
        const int16_t instance = g0.AddLayer({static_cast<int16_t>(blk), -1, S});
        auto stamp = [&](OpId from) {
          for (OpId id = from; id < g0.size(); ++id) g0.SetExecLayer(id, instance);
        };
        const OpId unroute = g0.size();
        Frontier y = AppendSection(sched, MoeSection::kBwdUnroute, ctx, &g0, {x.a, x.b});
        stamp(unroute);
        Deps shared = {};
        if (fs > 0) {
          b.Stamp(blk, kMoeScope);
          Deps z = linear("bwd.shared_fc2_dx", "bwd.shared_fc2_dw", fs, M,
                          static_cast<double>(fs) * M, out_grad);
          z = mem("bwd.shared_act", 3.0 * e * S * fs, z);
          z = linear("bwd.shared_fc1_dx", "bwd.shared_fc1_dw", M, fs, static_cast<double>(M) * fs,
                     z);
          if (t > 1) z = allreduce("bwd.shared_allreduce", z);
          shared = z;
          b.Stamp(blk, 0);
        }
        const OpId before = g0.size();
        y = AppendSection(sched, MoeSection::kBwdExchange, ctx, &g0, y);
        stamp(before);
        RecordSlots(before, blk);
        int expert_dw = 0;
        for (OpId id = before; id < g0.size(); ++id) {
          if (g0.op(id).flags & kWeightGrad) ++expert_dw;
        }
        for (OpId id = before; id < g0.size(); ++id) {
          if (!(g0.op(id).flags & kWeightGrad)) continue;
          dw_ops.push_back(id);
          params.push_back({BlockParams(mm, blk).expert * e / expert_dw, id, true});
        }
        const OpId route = g0.size();
        y = AppendSection(sched, MoeSection::kBwdRoute, ctx, &g0, y);
        stamp(route);
        OpId gate = kNoOp;
        for (OpId id = route; id < g0.size(); ++id) {
          const std::string_view base = g0.op(id).base;
          if (base == "bwd.gate" || base == "bwd.mp_allreduce_gate") gate = id;
        }
        params.push_back({static_cast<double>(M) * mm.moe.num_experts * e, gate});
        x = mem("bwd.ln2", 3.0 * sm, Deps{y.a, shared.a});
        if (y.b != kNoOp) x = join("bwd.ln2_join", {x.a, y.b});
      } else {
        x = linear("bwd.fc2_dx", "bwd.fc2_dw", f, M, static_cast<double>(f) * M + M, x);
        x = mem("bwd.gelu", 3.0 * e * S * f, x);
        x = linear("bwd.fc1_dx", "bwd.fc1_dw", M, f, static_cast<double>(M) * f + f, x);
        if (t > 1) x = allreduce("bwd.fc1_allreduce", x);
        x = mem("bwd.ln2", 3.0 * sm, x);
      }
      param(2.0 * M, x);
      x = mem("bwd.residual2", 3.0 * sm, Deps{x.a, out_grad.a});
      const Deps mid = x;
      x = linear("bwd.proj_dx", "bwd.proj_dw", M / t, M, static_cast<double>(M) * M / t + M, x);
      // Two batched GEMMs of equal work (L x L x d and L x d x L): run as two
      // of the first shape.
      x = b.Compute("bwd.attn_ctx", B, Term::kDense,
                    c.BatchedGemmUs(Bq * hp, L, L, d) + c.BatchedGemmUs(Bq * hp, L, d, L),
                    2.0 * e * Bq * hp * (2.0 * L * d + L * L), x, 0,
                    DenseGemm(L, L, d, Bq * hp, 2));
      x = mem("bwd.softmax", 3.0 * e * Bq * hp * L * L, x);
      x = b.Compute("bwd.attn_score", B, Term::kDense, 2.0 * c.BatchedGemmUs(Bq * hp, L, d, L),
                    2.0 * e * Bq * hp * (2.0 * L * d + L * L), x, 0,
                    DenseGemm(L, d, L, Bq * hp, 2));
      x = linear("bwd.qkv_dx", "bwd.qkv_dw", M, 3 * M / t, 3.0 * M * M / t + 3.0 * M / t, x);
      if (t > 1) x = allreduce("bwd.qkv_allreduce", x);
      x = mem("bwd.ln1", 3.0 * sm, x);
      param(2.0 * M, x);
      x = mem("bwd.residual1", 3.0 * sm, Deps{x.a, mid.a});
    }
    if (mm.vocab_size > 0 && st.embed) {
      b.Stamp(-1, 0);
      x = mem("bwd.embed", 3.0 * sm, x);
      param(static_cast<double>(v) * M + static_cast<double>(L) * M, x);
    }
  }

  void RecordSlots(OpId begin, int blk) {
    for (OpId id = begin; id < g0.size(); ++id) {
      const Op& op = g0.op(id);
      if (op.kind != OpKind::kComm || op.term != Term::kAllToAll) continue;
      const std::string_view site = Site(op.base);
      if (!slots.empty() && slots.back().first >= begin &&
          Site(g0.op(slots.back().first).base) == site) {
        slots.back().ops.push_back(id);
        slots.back().last = id;
        continue;
      }
      Slot s;
      s.name = Cat("b", blk, ".moe.", site);
      s.first = s.last = id;
      s.ops.push_back(id);
      slots.push_back(std::move(s));
    }
  }

  // ---------------- One whole graph ----------------

  struct Built {
    std::vector<PartitionRange> partitions;
    std::vector<DwPlacement> dw;
  };

  // Builds forward (split per `ranges`) + backward into g0, places dW ops when
  // `schedule_dw`, then writes the issue order with gradient buckets and the
  // optimizer into final_graph and simulates it.
  absl::Status Evaluate(const std::vector<Range>& ranges, bool schedule_dw, Built* built) {
    g0.Clear();
    params.clear();
    slots.clear();
    dw_ops.clear();
    ResetPieces();
    range_first.clear();
    range_last.clear();
    for (const Range& r : ranges) {
      range_first.push_back(g0.size());
      EmitRange(r.begin, r.end, r.k, &g0, false);
      range_last.push_back(g0.size() - 1);
    }
    // The loss (or last block) may end in k pieces: the backward starts after all.
    const int last = static_cast<int>(units.size()) - 1;
    Deps x;
    if (piece_k[static_cast<size_t>(last)] == 1 &&
        piece_out[static_cast<size_t>(piece_begin[static_cast<size_t>(last)])][1] == kNoOp) {
      x = {piece_out[static_cast<size_t>(piece_begin[static_cast<size_t>(last)])][0]};
    } else {
      dep_buf.clear();
      for (int p = 0; p < piece_k[static_cast<size_t>(last)]; ++p) {
        const auto& o = piece_out[static_cast<size_t>(piece_begin[static_cast<size_t>(last)] + p)];
        dep_buf.push_back(o[0]);
        dep_buf.push_back(o[1]);
      }
      Op join;
      join.base = "fwd.join";
      join.term = Term::kDense;
      x = {g0.Add(join, dep_buf, kJoin)};
    }
    const OpId bwd_begin = g0.size();
    EmitBackward(x, schedule_dw);

    built->partitions.clear();
    for (size_t i = 0; i < ranges.size(); ++i) {
      if (ranges[i].k == 1) continue;
      built->partitions.push_back({NameWithoutPart(g0.op(range_first[i])),
                                   NameWithoutPart(g0.op(range_last[i])), ranges[i].k,
                                   ranges[i].us});
    }

    // Issue order: natural, with placed dW ops moved right after their AlltoAll.
    std::vector<std::vector<int>> picks;
    built->dw.clear();
    if (schedule_dw && !slots.empty() && !dw_ops.empty()) {
      MOEPLAN_RETURN_IF_ERROR(simulator.Run(g0, &sim0));
      reach.Compute(g0, bwd_begin);
      std::vector<double> slot_us, dw_us;
      for (const Slot& s : slots) {
        slot_us.push_back(sim0.times[static_cast<size_t>(s.last)].end_us -
                          sim0.times[static_cast<size_t>(s.first)].start_us);
      }
      for (OpId d : dw_ops) dw_us.push_back(g0.op(d).cost_us);
      picks = BestFitDw(slot_us, dw_us, [&](int s, int d) {
        const OpId dw = dw_ops[static_cast<size_t>(d)];
        const Slot& slot = slots[static_cast<size_t>(s)];
        if (dw >= slot.first) return false;  // only delayed, never hoisted
        for (OpId o : slot.ops) {
          if (!reach.Independent(dw, o)) return false;
        }
        return true;
      });
      for (size_t s = 0; s < slots.size(); ++s) {
        DwPlacement pl;
        pl.alltoall = slots[s].name;
        pl.alltoall_us = slot_us[s];
        for (int d : picks[s]) {
          pl.dw_ops.push_back(g0.op(dw_ops[static_cast<size_t>(d)]).Name());
          pl.dw_us += dw_us[static_cast<size_t>(d)];
        }
        built->dw.push_back(std::move(pl));
      }
    }
    std::vector<OpId> order;
    order.reserve(static_cast<size_t>(g0.size()));
    std::vector<std::vector<OpId>> after(static_cast<size_t>(g0.size()));
    std::vector<bool> moved(static_cast<size_t>(g0.size()), false);
    for (size_t s = 0; s < picks.size(); ++s) {
      for (int d : picks[s]) {
        const OpId dw = dw_ops[static_cast<size_t>(d)];
        moved[static_cast<size_t>(dw)] = true;
        after[static_cast<size_t>(slots[s].last)].push_back(dw);
      }
    }
    for (OpId v = 0; v < g0.size(); ++v) {
      if (!moved[static_cast<size_t>(v)]) order.push_back(v);
      for (OpId dw : after[static_cast<size_t>(v)]) order.push_back(dw);
    }
    MOEPLAN_RETURN_IF_ERROR(Finalize(order));
    return simulator.Run(final_graph, &final_sim);
  }

  // A lower bound on any variant's forward and backward of this schedule and
  // algorithm (docs/layouts.md "Search"): each resource runs its ops one at a
  // time, so a phase lasts at least the busiest resource's sum of that
  // phase's ops. Every forward op ends by the forward's end and every
  // backward op descends from the loss; gradient buckets and ZeRO-3 gathers
  // (prefetched, depending on nothing) are left out. Ops are unsplit: with
  // alpha-beta costs and GEMM efficiency that does not fall with size, k
  // pieces never cost less than the whole.
  void PhaseBound(double (&busy)[2][kNumResources]) {
    g0.Clear();
    params.clear();
    slots.clear();
    dw_ops.clear();
    ResetPieces();
    EmitRange(0, static_cast<int>(units.size()), 1, &g0, false);
    const auto& o = piece_out[static_cast<size_t>(piece_begin[units.size() - 1])];
    EmitBackward(Deps{o[0], o[1]}, false);
    for (auto& phase : busy) std::fill(std::begin(phase), std::end(phase), 0.0);
    for (OpId id = 0; id < g0.size(); ++id) {
      const Op& op = g0.op(id);
      if (op.flags & (kGradSync | kPrefetch)) continue;
      for (int r = 0; r < kNumResources; ++r) {
        if (op.resources & (1u << r)) busy[op.phase == F ? 0 : 1][r] += op.cost_us;
      }
    }
  }

  // What Finalize's buckets cost at least, per resource, by ZeRO class (0;
  // 1-2; 3): with alpha-beta costs the buckets of a group cost no less than
  // one collective of all of them. ZeRO 1-2 add the parameter AllGather after
  // the step; ZeRO-3's per-block gathers are left out. Reads `params` (g0's).
  void SyncBound(std::array<std::array<double, kNumResources>, 3>* out) const {
    double bytes[2] = {0.0, 0.0};  // dense, expert
    for (const Param& p : params) bytes[p.expert ? 1 : 0] += p.bytes;
    for (int z = 0; z < 3; ++z) {
      auto& a = (*out)[static_cast<size_t>(z)];
      a.fill(0.0);
      for (int grp = 0; grp < 2; ++grp) {
        const GroupShape shape = grp ? edp_shape : dp_shape;
        if (shape.ranks <= 1 || bytes[grp] <= 0.0) continue;
        const double shard = bytes[grp] / shape.ranks;
        const ResourceMask mask = internal::ResourcesOf(shape);
        // One collective of every bucket's bytes, corrected in context like
        // each bucket's (offset + scale x: below the sum over the buckets).
        const bool e = grp == 1;
        double us =
            z == 0 ? cost.InContextUs(e ? "bwd.expert_grad_allreduce" : "bwd.grad_allreduce", mask,
                                      cost.CollectiveUs(Collective::kAllReduce, shape, bytes[grp]))
                   : cost.InContextUs(
                         e ? "bwd.expert_grad_reducescatter" : "bwd.grad_reducescatter", mask,
                         cost.CollectiveUs(Collective::kReduceScatter, shape, shard));
        if (z == 1) {
          us +=
              cost.InContextUs(e ? "optimizer.expert_param_allgather" : "optimizer.param_allgather",
                               mask, cost.CollectiveUs(Collective::kAllGather, shape, shard));
        }
        for (int r = 0; r < kNumResources; ++r) {
          if (mask & (1u << r)) a[static_cast<size_t>(r)] += us;
        }
      }
    }
  }

  // Copies g0 in `order` into final_graph, issuing each DDP bucket's
  // collective as soon as its last gradient is issued (AllReduce; ZeRO >= 1:
  // ReduceScatter), dense parameters over the DP group and expert ones over
  // their replicas, then the optimizer step after every op nothing else waits
  // for (ZeRO 1-2: then the updated parameters are AllGathered per bucket).
  absl::Status Finalize(const std::vector<OpId>& order) {
    final_graph.Clear();
    final_graph.Reserve(g0.size() + 64, g0.size() * 2);
    final_graph.CopyTables(g0);
    // Buckets per group, in the order gradients are produced (reverse layer order).
    struct Bucket {
      double bytes = 0.0;
      int left = 0;
      bool expert = false;
      int index = 0;  // within its group
      std::vector<OpId> deps;
    };
    std::vector<Bucket> buckets;
    std::vector<int> bucket_of(params.size());
    int open[2] = {-1, -1};
    int count[2] = {0, 0};
    for (size_t i = 0; i < params.size(); ++i) {
      const int grp = params[i].expert ? 1 : 0;
      if (open[grp] < 0 ||
          buckets[static_cast<size_t>(open[grp])].bytes >= static_cast<double>(opt.bucket_bytes)) {
        buckets.push_back({});
        buckets.back().expert = params[i].expert;
        buckets.back().index = count[grp]++;
        open[grp] = static_cast<int>(buckets.size()) - 1;
      }
      bucket_of[i] = open[grp];
      buckets[static_cast<size_t>(open[grp])].bytes += params[i].bytes;
      buckets[static_cast<size_t>(open[grp])].left += 1;
    }
    absl::flat_hash_map<OpId, std::vector<int>> params_of;
    for (size_t i = 0; i < params.size(); ++i) {
      params_of[params[i].producer].push_back(static_cast<int>(i));
    }
    const bool sharded = st.zero_stage >= 1;
    auto sync_op = [&](const Bucket& bk, std::string_view base, Collective c) {
      const GroupShape shape = bk.expert ? edp_shape : dp_shape;
      // AllReduce: n is the bucket; ReduceScatter / AllGather: a rank's shard.
      const double n = c == Collective::kAllReduce ? bk.bytes : bk.bytes / shape.ranks;
      Op op;
      op.base = base;
      op.kind = OpKind::kComm;
      op.phase = B;
      op.flags = kGradSync;
      op.term = internal::TermOf(c);
      op.resources = internal::ResourcesOf(shape);
      op.cost_us = cost.InContextUs(base, op.resources, cost.CollectiveUs(c, shape, n));
      op.bytes = internal::Bytes(n);
      op.inter_node_bytes = internal::Bytes(internal::InterNodeBytes(c, shape, n));
      return op;
    };
    auto sync_exec = [&](const Bucket& bk, Collective c) {
      const GroupShape shape = bk.expert ? edp_shape : dp_shape;
      const double n = c == Collective::kAllReduce ? bk.bytes : bk.bytes / shape.ranks;
      const ExecKind kind = c == Collective::kAllReduce       ? ExecKind::kAllReduce
                            : c == Collective::kReduceScatter ? ExecKind::kReduceScatter
                                                              : ExecKind::kAllGather;
      return DenseColl(kind, bk.expert ? ExecGroup::kEdp : ExecGroup::kDp, n, m->bytes_per_element);
    };
    std::vector<OpId> new_id(static_cast<size_t>(g0.size()), kNoOp);
    for (OpId v : order) {
      dep_buf.clear();
      for (OpId d : g0.deps(v)) {
        if (new_id[static_cast<size_t>(d)] == kNoOp) {
          return absl::InternalError(Cat("model graph: ", g0.op(v).Name(),
                                         " issued before its dependency ", g0.op(d).Name()));
        }
        dep_buf.push_back(new_id[static_cast<size_t>(d)]);
      }
      const OpId id = final_graph.Add(g0.op(v), dep_buf, g0.exec(v));
      new_id[static_cast<size_t>(v)] = id;
      auto it = params_of.find(v);
      if (it == params_of.end()) continue;
      for (int pi : it->second) {
        Bucket& bk = buckets[static_cast<size_t>(bucket_of[static_cast<size_t>(pi)])];
        bk.deps.push_back(id);
        if (--bk.left > 0) continue;
        if ((bk.expert ? edp_shape : dp_shape).ranks <= 1) continue;
        Op op =
            sharded
                ? sync_op(bk,
                          bk.expert ? "bwd.expert_grad_reducescatter" : "bwd.grad_reducescatter",
                          Collective::kReduceScatter)
                : sync_op(bk, bk.expert ? "bwd.expert_grad_allreduce" : "bwd.grad_allreduce",
                          Collective::kAllReduce);
        op.step = bk.index;
        final_graph.Add(
            op, bk.deps,
            sync_exec(bk, sharded ? Collective::kReduceScatter : Collective::kAllReduce));
      }
    }
    // The optimizer waits for every sink (gradients, buckets, side branches).
    std::vector<bool> consumed(static_cast<size_t>(final_graph.size()), false);
    for (OpId v = 0; v < final_graph.size(); ++v) {
      for (OpId d : final_graph.deps(v)) consumed[static_cast<size_t>(d)] = true;
    }
    dep_buf.clear();
    for (OpId v = 0; v < final_graph.size(); ++v) {
      if (!consumed[static_cast<size_t>(v)]) dep_buf.push_back(v);
    }
    Op step;
    step.base = "optimizer.step";
    step.phase = B;
    step.term = Term::kOptimizer;
    step.cost_us = OptimizerStepUs(sharded, &step.bytes);
    const OpId step_id = final_graph.Add(
        step, dep_buf, DenseMemory(static_cast<double>(step.bytes), m->bytes_per_element));
    if (st.zero_stage == 1 || st.zero_stage == 2) {
      for (size_t i = 0; i < buckets.size(); ++i) {
        if ((buckets[i].expert ? edp_shape : dp_shape).ranks <= 1) continue;
        Op op = sync_op(
            buckets[i],
            buckets[i].expert ? "optimizer.expert_param_allgather" : "optimizer.param_allgather",
            Collective::kAllGather);
        op.step = buckets[i].index;
        final_graph.Add(op, {step_id}, sync_exec(buckets[i], Collective::kAllGather));
      }
    }
    return absl::OkStatus();
  }

  // The optimizer step: each rank updates its shard (`sharded`: ZeRO >= 1
  // divides the states by the group), reading and writing fp32 states and the weights.
  double OptimizerStepUs(bool sharded, int64_t* bytes_out = nullptr) const {
    const double shard = sharded ? static_cast<double>(DenseParamsPerRank()) / dp_shape.ranks +
                                       static_cast<double>(ExpertParamsPerRank()) / edp_shape.ranks
                                 : static_cast<double>(ParamsPerRank());
    const double bytes = shard * (24.0 + 2.0 * m->bytes_per_element);
    if (bytes_out != nullptr) *bytes_out = internal::Bytes(bytes);
    return cost.InContextUs("optimizer.step", kCompute, cost.MemoryBoundUs(bytes));
  }

  StageOptions Stage() const {
    StageOptions o = st;
    o.first_block = first_block;
    o.end_block = end_block;
    return o;
  }
  int64_t DenseParamsPerRank() const {
    return static_cast<int64_t>(StageParams(*m, Stage()).dense);
  }
  int64_t ExpertParamsPerRank() const {
    return static_cast<int64_t>(StageParams(*m, Stage()).expert);
  }
  int64_t ParamsPerRank() const { return DenseParamsPerRank() + ExpertParamsPerRank(); }

  // ---------------- Operator partition ----------------

  // Segment boundaries: around every MoE section (the shared expert is one
  // segment) and `partition_groups` groups of equal time in each dense stretch.
  void BuildBounds() {
    bounds.clear();
    bounds.push_back(0);
    std::vector<double> us(units.size(), 0.0);
    LayerConfig piece_layer;
    for (size_t j = 0; j < units.size(); ++j) {
      if (IsMoeUnit(units[j].kind)) continue;
      scratch.Clear();
      Builder sb(cost, &scratch);
      BuildUnit(units[j], 1, sb, Deps{}, &piece_layer);
      for (OpId o = 0; o < scratch.size(); ++o) us[j] += scratch.op(o).cost_us;
    }
    size_t j = 0;
    const size_t n = units.size();
    while (j < n) {
      if (IsMoeUnit(units[j].kind)) {
        size_t e = j + 1;
        const bool shared = IsSharedExpertUnit(units[j].kind);
        while (shared && e < n && IsSharedExpertUnit(units[e].kind)) ++e;
        bounds.push_back(static_cast<int>(e));
        j = e;
        continue;
      }
      size_t e = j;
      double total = 0.0;
      while (e < n && !IsMoeUnit(units[e].kind)) total += us[e++];
      double acc = 0.0;
      int next = 1;
      for (size_t i = j; i < e; ++i) {
        acc += us[i];
        if (i + 1 < e && next < opt.partition_groups &&
            acc >= total * next / opt.partition_groups) {
          bounds.push_back(static_cast<int>(i + 1));
          while (next < opt.partition_groups && acc >= total * next / opt.partition_groups) ++next;
        }
      }
      bounds.push_back(static_cast<int>(e));
      j = e;
    }
    // The default span: from one MoE layer's route to the next one's.
    max_span = opt.max_span;
    if (max_span == 0) {
      int first = -1, second = -1;
      for (size_t b = 0; b + 1 < bounds.size(); ++b) {
        if (units[static_cast<size_t>(bounds[b])].kind != UnitKind::kMoeRoute) continue;
        if (first < 0) {
          first = static_cast<int>(b);
        } else {
          second = static_cast<int>(b);
          break;
        }
      }
      max_span =
          second > first && first >= 0 ? second - first : static_cast<int>(bounds.size()) - 1;
    }
  }

  // P(i, j, k) of segments [i, j): the range simulated alone, split k ways;
  // < 0 where k is not allowed. Cached by the range's structure.
  double RangeCost(int i, int j, int k) {
    const int u0 = bounds[static_cast<size_t>(i)], u1 = bounds[static_cast<size_t>(j)];
    bool moe = false;
    if (k > 1) {
      if (k > Tokens(1)) return -1.0;
      for (int u = u0; u < u1; ++u) {
        const UnitKind kind = units[static_cast<size_t>(u)].kind;
        if (IsAttention(kind) && k > m->micro_batch_size) return -1.0;
        if (kind == UnitKind::kMoeRoute && m->moe.gate == Gate::kBatchPrioritized) return -1.0;
      }
    }
    key_buf.clear();
    for (int u = u0; u < u1; ++u) {
      const Unit& un = units[static_cast<size_t>(u)];
      moe = moe || IsMoeUnit(un.kind);
      key_buf.push_back(static_cast<uint32_t>(un.kind) |
                        static_cast<uint32_t>(un.in_a >= u0 ? u - un.in_a : 0) << 8 |
                        static_cast<uint32_t>(un.in_b >= u0 ? u - un.in_b : 0) << 20);
    }
    const uint64_t key =
        absl::HashOf(absl::MakeSpan(key_buf), k, moe ? combo_salt : 0, context_salt);
    if (auto it = p_cache.find(key); it != p_cache.end()) return it->second;
    range_graph.Clear();
    EmitRange(u0, u1, k, &range_graph, true);
    double us = kInf;
    if (simulator.Run(range_graph, &range_sim).ok()) us = range_sim.makespan_us;
    p_cache.emplace(key, us);
    return us;
  }

  std::vector<Range> PartitionRanges() {
    ResetPieces();
    const int nseg = static_cast<int>(bounds.size()) - 1;
    const std::vector<PartitionChoice> dp =
        PartitionDp(nseg, max_span, opt.max_partitions,
                    [&](int i, int j, int k) { return RangeCost(i, j, k); });
    std::vector<Range> out;
    for (const PartitionChoice& c : dp) {
      out.push_back(
          {bounds[static_cast<size_t>(c.begin)], bounds[static_cast<size_t>(c.end)], c.k, c.us});
    }
    return out;
  }

  std::vector<Range> WholeRanges() const {
    return {Range{0, static_cast<int>(units.size()), 1, 0.0}};
  }

  // Tutel: each MoE layer's exchange (dispatch, experts, combine) split r ways.
  std::vector<Range> TutelRanges(int r) const {
    std::vector<Range> out;
    int start = 0;
    for (int u = 0; u < static_cast<int>(units.size()); ++u) {
      if (units[static_cast<size_t>(u)].kind != UnitKind::kMoeExchange) continue;
      if (u > start) out.push_back({start, u, 1, 0.0});
      out.push_back({u, u + 1, r, 0.0});
      start = u + 1;
    }
    if (start < static_cast<int>(units.size()))
      out.push_back({start, static_cast<int>(units.size()), 1, 0.0});
    return out;
  }

  std::vector<MoeLayerChoice> Layers(const std::vector<Range>& ranges) const {
    std::vector<MoeLayerChoice> out;
    for (const Range& r : ranges) {
      for (int u = r.begin; u < r.end; ++u) {
        if (units[static_cast<size_t>(u)].kind != UnitKind::kMoeExchange) continue;
        out.push_back({units[static_cast<size_t>(u)].block, sched, algo, r.k});
      }
    }
    return out;
  }

  AllToAllCrossover Crossover() const {
    AllToAllCrossover c;
    const int g = cost.profile().shape.gpus_per_node;
    const int q = m->parallel.esp >= g ? 1 : g / m->parallel.esp;
    c.ranks_per_node = q;
    c.bytes = static_cast<double>(Derive(moe_layer).dispatch_bytes);
    c.applies = q >= 2;
    if (!c.applies) return c;
    auto linear = [&](int w) {
      return cost.CollectiveUs(Collective::kAllToAll, {w, w / q}, c.bytes);
    };
    auto hier = [&](int w) {
      return cost.CollectiveUs(Collective::kAllToAll, {q, 1}, c.bytes) +
             cost.MemoryBoundUs(2.0 * c.bytes) +
             cost.CollectiveUs(Collective::kAllToAll, {w / q, w / q}, c.bytes);
    };
    for (int w = 2 * q; w <= kMaxCrossoverRanks; w *= 2) {
      if (hier(w) < linear(w)) {
        c.faster_from_ranks = w;
        break;
      }
    }
    if (topo.ep.SpansNodes() && topo.ep_ranks_per_node > 1) {
      c.linear_us = linear(m->parallel.ep);
      c.hierarchical_us = hier(m->parallel.ep);
    }
    return c;
  }
};

ModelPlanner::ModelPlanner(const CostModel& cost) : impl_(std::make_unique<Impl>(cost)) {}
ModelPlanner::~ModelPlanner() = default;
ModelPlanner::ModelPlanner(ModelPlanner&&) noexcept = default;
const CostModel& ModelPlanner::cost() const { return impl_->cost; }

absl::Status ModelPlanner::Plan(const ModelConfig& model, const ModelPlanOptions& options,
                                ModelPlan* out) {
  MOEPLAN_RETURN_IF_ERROR(ValidateModel(model, impl_->cost.profile().shape));
  return PlanStage(model, options, StageOptions{}, out);
}

absl::Status ModelPlanner::PlanStage(const ModelConfig& model, const ModelPlanOptions& options,
                                     const StageOptions& stage, ModelPlan* out) {
  return Run(model, options, stage, out, nullptr);
}

absl::Status ModelPlanner::StageComputeBound(const ModelConfig& model,
                                             const ModelPlanOptions& options,
                                             const StageOptions& stage, StageBound* bound) {
  return Run(model, options, stage, nullptr, bound);
}

absl::Status ModelPlanner::Run(const ModelConfig& model, const ModelPlanOptions& options,
                               const StageOptions& stage, ModelPlan* out, StageBound* bound) {
  Impl& s = *impl_;
  const ClusterShape& cluster = s.cost.profile().shape;
  MOEPLAN_RETURN_IF_ERROR(ValidateModelPlanOptions(options));
  if (stage.zero_stage < 0 || stage.zero_stage > 3) {
    return absl::InvalidArgumentError(Cat("zero_stage: must be 0-3 (got ", stage.zero_stage, ")"));
  }
  s.m = &model;
  s.opt = options;
  s.st = stage;
  s.first_block = std::clamp(stage.first_block, 0, model.num_layers);
  s.end_block = stage.end_block < 0 ? model.num_layers
                                    : std::clamp(stage.end_block, s.first_block, model.num_layers);
  s.moe_layer = model.MoeLayer();
  s.topo = MakeTopology(model.parallel, cluster);
  s.mp_shape = s.topo.mp;
  const int g = cluster.gpus_per_node;
  s.dp_shape = ShapeOfGroup(
      model.parallel.dp,
      stage.dense_group_stride > 0 ? static_cast<int>(stage.dense_group_stride) : model.parallel.mp,
      g);
  s.edp_shape = ShapeOfGroup(
      std::max(1, stage.expert_replicas),
      stage.local_dispatch ? model.parallel.mp : model.parallel.ep * model.parallel.esp, g);
  // Range costs depend on everything a range's ops read: key them by it, so
  // that stages planned one after another (the layout search) share them.
  s.context_salt = absl::HashOf(
      model.hidden_size, model.num_attention_heads, model.ffn_hidden_size, model.seq_length,
      model.micro_batch_size, model.vocab_size, model.bytes_per_element, model.moe.num_experts,
      model.moe.top_k, model.moe.capacity_factor, model.moe.expert_ffn_hidden_size,
      model.moe.shared_expert_ffn_hidden_size, static_cast<int>(model.moe.gate),
      model.moe.layer_freq, model.parallel.mp, model.parallel.ep, model.parallel.esp,
      model.parallel.dp, stage.local_dispatch, stage.zero_stage == 3, s.dp_shape.ranks,
      s.dp_shape.nodes, s.edp_shape.ranks, s.edp_shape.nodes, &s.cost);
  if (s.p_cache.size() > (1u << 18)) s.p_cache.clear();

  // The MoE schedules and AlltoAll algorithms to try.
  std::vector<Schedule> schedules = options.schedules;
  if (stage.local_dispatch) schedules = {Schedule::kDefault};  // one way to run PPMoE
  if (schedules.empty()) {
    // With mp = 1 there is no MP group to pause: S1 and S2 only rename the default.
    for (Schedule sc : kAllSchedules) {
      if (sc != Schedule::kDefault && model.parallel.mp == 1) continue;
      if (ValidateForSchedule(s.moe_layer, sc).ok()) schedules.push_back(sc);
    }
  }
  for (Schedule sc : schedules) {
    if (stage.local_dispatch) break;
    if (absl::Status st = ValidateForSchedule(s.moe_layer, sc); !st.ok()) {
      return absl::InvalidArgumentError(Cat("schedules: ", ScheduleName(sc),
                                            " does not apply to this model: ", View(st.message())));
    }
  }
  const bool hier_applies =
      !stage.local_dispatch && s.topo.ep.SpansNodes() && s.topo.ep_ranks_per_node > 1;
  std::vector<AllToAllAlgo> algos = options.algos;
  if (stage.local_dispatch) algos = {AllToAllAlgo::kLinear};
  if (algos.empty()) {
    algos.push_back(AllToAllAlgo::kLinear);
    if (hier_applies) algos.push_back(AllToAllAlgo::kHierarchical);
  }
  for (AllToAllAlgo a : algos) {
    if (a == AllToAllAlgo::kHierarchical && !hier_applies) {
      return absl::InvalidArgumentError(
          Cat("alltoall_algorithms: 2dh needs an EP group that spans nodes with several EP ranks "
              "per node (got ep=",
              model.parallel.ep, " with ", s.topo.ep_ranks_per_node, " per node)"));
    }
  }
  std::vector<Variant> variants = options.variants;
  if (variants.empty()) variants.assign(std::begin(kAllVariants), std::end(kAllVariants));

  s.BuildUnits();
  s.ResetPieces();
  if (bound != nullptr) {
    // The least over the schedules and algorithms, per phase (and resource).
    bound->fwd_us = bound->bwd_us = kInf;
    bound->fwd_res.fill(kInf);
    bound->bwd_res.fill(kInf);
    double busy[2][kNumResources];
    for (Schedule sc : schedules) {
      for (AllToAllAlgo a : algos) {
        s.sched = sc;
        s.algo = a;
        s.PhaseBound(busy);
        bound->fwd_us =
            std::min(bound->fwd_us, *std::max_element(busy[0], busy[0] + kNumResources));
        bound->bwd_us =
            std::min(bound->bwd_us, *std::max_element(busy[1], busy[1] + kNumResources));
        for (size_t r = 0; r < kNumResources; ++r) {
          bound->fwd_res[r] = std::min(bound->fwd_res[r], busy[0][r]);
          bound->bwd_res[r] = std::min(bound->bwd_res[r], busy[1][r]);
        }
      }
    }
    bound->optimizer_us = s.OptimizerStepUs(false);
    bound->sharded_optimizer_us = s.OptimizerStepUs(true);
    s.SyncBound(&bound->sync_res);
    bound->sync_res[0][0] += bound->optimizer_us;
    bound->sync_res[1][0] += bound->sharded_optimizer_us;
    bound->sync_res[2][0] += bound->sharded_optimizer_us;
    return absl::OkStatus();
  }
  s.BuildBounds();

  out->variants.clear();
  out->variants.resize(variants.size());
  out->moe_layers = model.NumMoeLayers();
  out->params_per_rank = s.ParamsPerRank();
  out->crossover = s.Crossover();
  Impl::Built built;
  absl::flat_hash_map<uint64_t, std::vector<Range>> partitions;
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    VariantPlan& vp = out->variants[vi];
    vp = VariantPlan{};
    vp.variant = variants[vi];
    double best = kInf;
    for (Schedule sc : schedules) {
      for (AllToAllAlgo a : algos) {
        // S2's AlltoAlls are the SAA's pairwise steps: no algorithm to choose.
        if (sc == Schedule::kS2 && a == AllToAllAlgo::kHierarchical && algos.size() > 1) continue;
        s.sched = sc;
        s.algo = a;
        s.combo_salt = 1 + static_cast<uint64_t>(sc) * 4 + static_cast<uint64_t>(a);
        VariantAlternative alt{sc, a, 0, kInf};
        auto consider = [&](const std::vector<Range>& ranges, bool dw, int degree) -> absl::Status {
          MOEPLAN_RETURN_IF_ERROR(options.deadline.Check("model plan"));
          MOEPLAN_RETURN_IF_ERROR(s.Evaluate(ranges, dw, &built));
          const double us = s.final_sim.makespan_us;
          if (us < alt.iteration_us) {
            alt.iteration_us = us;
            alt.tutel_degree = degree;
          }
          if (us < best) {
            best = us;
            vp.schedule = sc;
            vp.algo = a;
            vp.tutel_degree = degree;
            vp.graph = s.final_graph;
            vp.sim = s.final_sim;
            vp.layers = s.Layers(ranges);
            vp.partitions = built.partitions;
            vp.dw = built.dw;
          }
          return absl::OkStatus();
        };
        switch (vp.variant) {
          case Variant::kNone:
            MOEPLAN_RETURN_IF_ERROR(consider(s.WholeRanges(), false, 0));
            break;
          case Variant::kTutel:
            for (int r : options.tutel_degrees) {
              MOEPLAN_RETURN_IF_ERROR(consider(s.TutelRanges(r), false, r));
            }
            break;
          case Variant::kDw:
            MOEPLAN_RETURN_IF_ERROR(consider(s.WholeRanges(), true, 0));
            break;
          case Variant::kPartition:
          case Variant::kLancet: {
            // Both variants split the same ranges: one DP per schedule and algorithm.
            auto [it, fresh] = partitions.try_emplace(s.combo_salt);
            if (fresh) it->second = s.PartitionRanges();
            MOEPLAN_RETURN_IF_ERROR(consider(it->second, vp.variant == Variant::kLancet, 0));
            break;
          }
        }
        vp.alternatives.push_back(alt);
      }
    }
    std::stable_sort(vp.alternatives.begin(), vp.alternatives.end(),
                     [](const VariantAlternative& x, const VariantAlternative& y) {
                       return x.iteration_us < y.iteration_us;
                     });
  }
  out->best = 0;
  for (size_t i = 1; i < out->variants.size(); ++i) {
    if (out->variants[i].iteration_us() <
        out->variants[static_cast<size_t>(out->best)].iteration_us())
      out->best = static_cast<int>(i);
  }
  return absl::OkStatus();
}

}  // namespace moeplan::planner
