// The whole model's forward (model_planner_internal.h): units, each one dense
// op or one section of an MoE schedule, emitted whole or split into k
// micro-batches per range; ZeRO-3's parameter gathers.
#include <array>
#include <cstdint>

#include "model_planner_internal.h"

namespace moeplan::planner {

using internal::Builder;
using internal::DenseColl;
using internal::DenseGemm;
using internal::DenseMemory;
using internal::Deps;
using internal::F;
using internal::IsMoeUnit;
using internal::IsRoutedUnit;
using internal::Unit;
using internal::UnitKind;

LayerContext ModelPlanner::Impl::MoeContext(const LayerConfig* layer, int block,
                                            bool detach) const {
  LayerContext ctx;
  ctx.layer = layer;
  ctx.cost = &cost;
  ctx.topo = topo;
  ctx.a2a = algo;
  ctx.detach_dw = detach;
  ctx.block = block;
  ctx.local_dispatch = st.local_dispatch;
  ctx.sequence_parallel = m->parallel.mp > 1 && m->parallel.sequence_parallel;
  if (m->Fp8()) ctx.fp8_gemm = linear;
  return ctx;
}

void ModelPlanner::Impl::BuildUnits() {
  units.clear();
  const int t = m->parallel.mp;
  const bool sp = t > 1 && m->parallel.sequence_parallel;
  auto add = [&](UnitKind k, int block, int in_a, int in_b = -1) {
    units.push_back({k, static_cast<int16_t>(block), in_a, in_b});
    return static_cast<int>(units.size()) - 1;
  };
  int prev = -1;
  auto chain = [&](UnitKind k, int block) { return prev = add(k, block, prev); };
  if (m->vocab_size > 0 && st.embed) chain(UnitKind::kEmbed, -1);
  auto block_units = [&](int blk) {
    chain(UnitKind::kLn1, blk);
    if (sp) chain(UnitKind::kLn1Gather, blk);
    if (m->multi_latent_attention) {
      // Queries and the key/value latent from the same input, side by side.
      const int ln1 = prev;
      if (m->mla.q_lora_rank > 0) {
        chain(UnitKind::kQDown, blk);
        chain(UnitKind::kQNorm, blk);
      }
      const int q = chain(UnitKind::kQUp, blk);
      prev = ln1;
      chain(UnitKind::kKvDown, blk);
      chain(UnitKind::kKvNorm, blk);
      const int kv = chain(UnitKind::kKvUp, blk);
      prev = add(m->FusedAttention() ? UnitKind::kFlashAttn : UnitKind::kAttnScore, blk, q, kv);
    } else {
      chain(UnitKind::kQkv, blk);
      if (m->qk_layernorm) chain(UnitKind::kQkNorm, blk);
      chain(m->FusedAttention() ? UnitKind::kFlashAttn : UnitKind::kAttnScore, blk);
    }
    if (!m->FusedAttention()) {
      chain(UnitKind::kSoftmax, blk);
      chain(UnitKind::kAttnCtx, blk);
    }
    chain(UnitKind::kProj, blk);
    if (t > 1) chain(UnitKind::kProjAllReduce, blk);
    chain(UnitKind::kResidual1, blk);
    const int ln2 = chain(UnitKind::kLn2, blk);
    if (m->IsMoeBlock(blk)) {
      const int route = chain(UnitKind::kMoeRoute, blk);
      int shared = -1;
      if (m->moe.SharedFfnSize() > 0) {
        prev = ln2;  // the shared expert reads the layer input, beside the routed experts
        if (sp) chain(UnitKind::kSharedGather, blk);
        chain(UnitKind::kSharedFc1, blk);
        chain(UnitKind::kSharedAct, blk);
        shared = chain(UnitKind::kSharedFc2, blk);
        if (m->moe.shared_expert_gate) shared = chain(UnitKind::kSharedGate, blk);
        if (t > 1) shared = chain(UnitKind::kSharedAllReduce, blk);
      }
      prev = route;
      const int exchange = chain(UnitKind::kMoeExchange, blk);
      prev = add(UnitKind::kResidual2, blk, exchange, shared);
    } else {
      if (sp) chain(UnitKind::kLn2Gather, blk);
      for (UnitKind k : {UnitKind::kFc1, UnitKind::kGelu, UnitKind::kFc2}) chain(k, blk);
      if (t > 1) chain(UnitKind::kFc2AllReduce, blk);
      chain(UnitKind::kResidual2, blk);
    }
  };
  auto head_units = [&] {
    chain(UnitKind::kLnF, -1);
    if (sp) chain(UnitKind::kHeadGather, -1);
    chain(UnitKind::kLmHead, -1);
    chain(UnitKind::kLoss, -1);
  };
  for (int blk = first_block; blk < end_block; ++blk) block_units(blk);
  if (m->vocab_size > 0 && st.head) {
    head_units();
    // The MTP depths after the last layer, each predicting one token further
    // with its own block and the shared output layer.
    for (int d = 0; d < m->mtp_num_layers; ++d) {
      chain(UnitKind::kMtpEmbed, m->num_layers + d);
      chain(UnitKind::kMtpNorm, m->num_layers + d);
      chain(UnitKind::kMtpProj, m->num_layers + d);
      block_units(m->num_layers + d);
      head_units();
    }
  }
}

// A forward memory-bound op of `bytes`, and a forward GEMM m x n x k, after `x`.
Deps ModelPlanner::Impl::ForwardMemory(Builder& b, std::string_view name, double bytes,
                                       Deps x) const {
  const double e = m->bytes_per_element;
  return b.Compute(name, F, Term::kDense, cost.MemoryBoundUs(bytes), bytes, x, 0,
                   DenseMemory(bytes, e));
}
Deps ModelPlanner::Impl::ForwardGemm(Builder& b, std::string_view name, int64_t mm, int64_t nn,
                                     int64_t kk, Deps x, bool linear_layer) const {
  // FP8: a linear layer's input [mm x kk] is quantized first.
  const bool fp8 = linear_layer && Fp8();
  const internal::GemmCost g = internal::GemmOf(cost, fp8 ? *linear : cost, mm, nn, kk,
                                                m->bytes_per_element, fp8 ? mm * kk : 0);
  return b.Compute(name, F, Term::kDense, g.us, g.bytes, x, 0, DenseGemm(mm, nn, kk));
}

// The routed experts' forward section of `kind` over `s` tokens (the
// schedule's, on a layer of one piece's size).
Deps ModelPlanner::Impl::BuildRoutedUnit(UnitKind kind, int64_t s, Builder& b, Deps x,
                                         LayerConfig* piece_layer) {
  *piece_layer = moe_layer;
  piece_layer->batch_size = 1;
  piece_layer->seq_len = s;
  const LayerContext ctx = MoeContext(piece_layer, -1, false);
  const Frontier out = AppendSection(
      sched, kind == UnitKind::kMoeRoute ? MoeSection::kFwdRoute : MoeSection::kFwdExchange, ctx,
      b.graph(), {x.a, x.b});
  return {out.a, out.b};
}

// A TP sub-block's partial sums over `sm` bytes: AllReduced, or with sequence
// parallelism ReduceScattered into S/t slices (the same bytes: an AllReduce
// is a ReduceScatter and an AllGather).
Deps ModelPlanner::Impl::TpReduce(Builder& b, std::string_view allreduce,
                                  std::string_view reducescatter, double sm, Deps x) const {
  const double e = m->bytes_per_element;
  if (!SequenceParallel()) {
    return b.Coll(allreduce, F, Collective::kAllReduce, mp_shape, sm, x,
                  DenseColl(ExecKind::kAllReduce, ExecGroup::kMp, sm, e));
  }
  const double piece = sm / m->parallel.mp;
  return b.Coll(reducescatter, F, Collective::kReduceScatter, mp_shape, piece, x,
                DenseColl(ExecKind::kReduceScatter, ExecGroup::kMp, piece, e),
                TpCommExposed(reducescatter));
}

// Sequence parallelism: the S/t slices of `sm` bytes AllGathered over TP.
Deps ModelPlanner::Impl::SpGather(Builder& b, std::string_view name, double sm, Deps x) const {
  const double piece = sm / m->parallel.mp;
  return b.Coll(name, F, Collective::kAllGather, mp_shape, piece, x,
                DenseColl(ExecKind::kAllGather, ExecGroup::kMp, piece, m->bytes_per_element),
                TpCommExposed(name));
}

// Context parallelism (docs/model.md "Context parallelism"): each rank holds
// a cp-th of every sequence (seq_length here: Megatron-Core's two chunks of
// 1/(2 cp), which even out the causal mask) and attends its queries to every
// rank's keys in cp blocks, block i on the K/V of the rank i places back
// around the ring, each a cp-th of the work (a fused kernel over L/cp x L/cp,
// half of it masked). Forward: step i of the ring (1 <= i < cp) brings the
// K/V for block i while block i - 1 runs. Backward: the K/V go around again
// the same way, and each chunk's dK/dV partial follows it, every rank adding
// its block's part (a memory-bound add): cp - 1 dK/dV steps beside the
// blocks, and a last hop that returns the summed dK/dV to the chunk's owner.
Deps ModelPlanner::Impl::RingAttention(Builder& b, Phase phase, int64_t seqs, Deps x) const {
  const int cp = cp_shape.ranks;
  const int64_t L = m->seq_length, hp = dims.heads;
  const double e = m->bytes_per_element;
  const bool fwd = phase == F;
  const double block_us = (fwd ? 1.0 : internal::kFlashBackwardRatio) *
                          internal::FlashAttentionUs(cost, seqs, hp, L, dims);
  const double block_bytes = (fwd ? 1.0 : 2.0) * e * seqs * hp * L * (2.0 * dims.qk + 2.0 * dims.v);
  const OpExec block_exec = DenseGemm(L, L, dims.qk, seqs * hp, fwd ? 2 : 5);
  const double kv = e * seqs * L * dims.groups * (dims.qk + dims.v);
  const GroupShape pair{2, cp_shape.SpansNodes() ? 2 : 1};
  const std::string_view block_name = fwd ? "fwd.flash_attn" : "bwd.flash_attn";
  const std::string_view kv_name = fwd ? "fwd.cp_kv_sendrecv" : "bwd.cp_kv_sendrecv";
  OpId kv_at = kNoOp, block = kNoOp, partial = kNoOp, dkv = kNoOp;
  for (int i = 0; i < cp; ++i) {
    // K/V chunk i: the rank's own (i = 0), else the ring's step i.
    kv_at = i == 0 ? kNoOp
                   : b.ChunkColl(kv_name, i, phase, Collective::kSendRecv, pair, kv,
                                 {i == 1 ? x.a : kv_at, i == 1 ? x.b : kNoOp});
    block = i == 0 ? b.ChunkCompute(block_name, i, phase, Term::kDense, block_us, block_bytes,
                                    {x.a, x.b}, 0, block_exec)
                   : b.ChunkCompute(block_name, i, phase, Term::kDense, block_us, block_bytes,
                                    {block, kv_at}, 0, block_exec);
    if (fwd) continue;
    if (i == 0) {
      partial = block;
      continue;
    }
    // The partial dK/dV of chunk i from the previous rank, added to.
    dkv = b.ChunkColl("bwd.cp_dkv_sendrecv", i, phase, Collective::kSendRecv, pair, kv, {partial});
    partial = b.ChunkCompute("bwd.cp_dkv_add", i, phase, Term::kDense, cost.MemoryBoundUs(3.0 * kv),
                             3.0 * kv, {block, dkv}, 0, DenseMemory(3.0 * kv, e));
  }
  if (fwd) return {block};
  dkv = b.ChunkColl("bwd.cp_dkv_sendrecv", cp, phase, Collective::kSendRecv, pair, kv, {partial});
  return {partial, dkv};
}

// The attention's projections and core (BuildUnit's attention units).
Deps ModelPlanner::Impl::BuildAttentionUnit(UnitKind kind, int k, Builder& b, Deps x) {
  const ModelConfig& mm = *m;
  const int64_t s = Tokens(k), q = Seqs(k);
  const int64_t M = mm.hidden_size, L = mm.seq_length;
  const RankDims& dm = dims;
  const int64_t hp = dm.heads;
  const double e = mm.bytes_per_element;
  const CostModel& c = cost;
  auto mem = [&](std::string_view name, double bytes) { return ForwardMemory(b, name, bytes, x); };
  auto gemm = [&](std::string_view name, int64_t mm_, int64_t nn, int64_t kk) {
    return ForwardGemm(b, name, mm_, nn, kk, x);
  };
  switch (kind) {
    case UnitKind::kQkv:
      return gemm("fwd.qkv", s, dm.qkv, M);
    case UnitKind::kQkNorm:
      return mem("fwd.qk_norm", 2.0 * e * s * (hp + dm.groups) * dm.qk);
    case UnitKind::kQDown:
      return gemm("fwd.q_down", s, dm.q_lora, M);
    case UnitKind::kQNorm:
      return mem("fwd.q_norm", 2.0 * e * s * dm.q_lora);
    case UnitKind::kQUp:
      return gemm("fwd.q_up", s, dm.q_up, dm.q_lora > 0 ? dm.q_lora : M);
    case UnitKind::kKvDown:
      return gemm("fwd.kv_down", s, dm.kv_lora + dm.rope, M);
    case UnitKind::kKvNorm:
      return mem("fwd.kv_norm", 2.0 * e * s * dm.kv_lora);
    case UnitKind::kKvUp:
      return gemm("fwd.kv_up", s, dm.kv_up, dm.kv_lora);
    case UnitKind::kAttnScore:
      return b.Compute("fwd.attn_score", F, Term::kDense, c.BatchedGemmUs(q * hp, L, L, dm.qk),
                       e * q * hp * (2.0 * L * dm.qk + L * L), x, 0,
                       DenseGemm(L, L, dm.qk, q * hp));
    case UnitKind::kSoftmax:
      return mem("fwd.softmax", 2.0 * e * q * hp * L * L);
    case UnitKind::kAttnCtx:
      return b.Compute("fwd.attn_ctx", F, Term::kDense, c.BatchedGemmUs(q * hp, L, dm.v, L),
                       e * q * hp * (L * dm.v + L * L + L * dm.v), x, 0,
                       DenseGemm(L, dm.v, L, q * hp));
    case UnitKind::kFlashAttn:
      if (cp_shape.ranks > 1) return RingAttention(b, F, q, x);
      return b.Compute(
          "fwd.flash_attn", F, Term::kDense, internal::FlashAttentionUs(c, q, hp, L, dm),
          e * q * hp * L * (2.0 * dm.qk + 2.0 * dm.v), x, 0, DenseGemm(L, L, dm.qk, q * hp, 2));
    default:
      return x;
  }
}

// Appends a unit's ops for a micro-batch of k pieces' size after `x`.
Deps ModelPlanner::Impl::BuildUnit(const Unit& u, int k, Builder& b, Deps x,
                                   LayerConfig* piece_layer) {
  const ModelConfig& mm = *m;
  const int64_t s = Tokens(k);
  const int64_t M = mm.hidden_size;
  const RankDims& dm = dims;
  const int64_t f = dm.ffn, fs = dm.shared, v = dm.vocab;
  const double e = mm.bytes_per_element;
  const double sm = static_cast<double>(s) * M * e;  // one activation, bytes
  // Sequence parallel: what runs between the TP sub-blocks holds S/t tokens.
  const double seq = SequenceParallel() ? sm / mm.parallel.mp : sm;
  auto mem = [&](std::string_view name, double bytes) { return ForwardMemory(b, name, bytes, x); };
  auto gemm = [&](std::string_view name, int64_t mm_, int64_t nn, int64_t kk) {
    return ForwardGemm(b, name, mm_, nn, kk, x);
  };
  auto reduce = [&](std::string_view allreduce, std::string_view reducescatter) {
    return TpReduce(b, allreduce, reducescatter, sm, x);
  };
  auto gather = [&](std::string_view name) { return SpGather(b, name, sm, x); };
  switch (u.kind) {
    case UnitKind::kEmbed:
      return mem("fwd.embed", 3.0 * sm);
    case UnitKind::kLn1:
      return mem("fwd.ln1", 2.0 * seq);
    case UnitKind::kLn1Gather:
      return gather("fwd.ln1_allgather");
    default:  // the attention's projections and core
      return BuildAttentionUnit(u.kind, k, b, x);
    case UnitKind::kProj:
      return gemm("fwd.proj", s, M, dm.attn_out);
    case UnitKind::kProjAllReduce:
      return reduce("fwd.proj_allreduce", "fwd.proj_reducescatter");
    case UnitKind::kResidual1:
      return mem("fwd.residual1", 3.0 * seq);
    case UnitKind::kLn2:
      return mem("fwd.ln2", 2.0 * seq);
    case UnitKind::kLn2Gather:
      return gather("fwd.ln2_allgather");
    case UnitKind::kFc1:
      return gemm("fwd.fc1", s, dm.ffn_in, M);
    case UnitKind::kGelu:
      // GELU reads z and writes a; SwiGLU reads gate and up, writes their product.
      return mem(mm.gated_linear_unit ? "fwd.swiglu" : "fwd.gelu",
                 (1.0 + mm.FfnInputFactor()) * e * s * f);
    case UnitKind::kFc2:
      return gemm("fwd.fc2", s, M, f);
    case UnitKind::kFc2AllReduce:
      return reduce("fwd.fc2_allreduce", "fwd.fc2_reducescatter");
    case UnitKind::kResidual2:
      return mem("fwd.residual2", 3.0 * seq);
    case UnitKind::kSharedGather:
      return gather("fwd.shared_allgather");
    case UnitKind::kSharedFc1:
      return gemm("fwd.shared_fc1", s, dm.shared_in, M);
    case UnitKind::kSharedAct:
      return mem("fwd.shared_act", (1.0 + mm.FfnInputFactor()) * e * s * fs);
    case UnitKind::kSharedFc2:
      return gemm("fwd.shared_fc2", s, M, fs);
    case UnitKind::kSharedGate:
      // The gate's GEMV reads the layer input; the scaling reads and writes
      // the shared output.
      return mem("fwd.shared_gate", 3.0 * sm);
    case UnitKind::kSharedAllReduce:
      return reduce("fwd.shared_allreduce", "fwd.shared_reducescatter");
    case UnitKind::kMoeRoute:
    case UnitKind::kMoeExchange:
      return BuildRoutedUnit(u.kind, s, b, x, piece_layer);
    case UnitKind::kMtpEmbed:
      return mem("fwd.mtp_embed", 3.0 * sm);
    case UnitKind::kMtpNorm:
      return mem("fwd.mtp_norm", 4.0 * sm);
    case UnitKind::kMtpProj:
      return gemm("fwd.mtp_proj", s, M / mm.parallel.mp, 2 * M);
    case UnitKind::kLnF:
      return mem("fwd.ln_f", 2.0 * seq);
    case UnitKind::kHeadGather:
      return gather("fwd.ln_f_allgather");
    case UnitKind::kLmHead:
      return ForwardGemm(b, "fwd.lm_head", s, v, M, x, /*linear_layer=*/false);  // not FP8
    case UnitKind::kLoss:
      return mem("fwd.loss", 3.0 * e * s * v);
  }
  return x;
}

void ModelPlanner::Impl::AppendInputs(const Unit& u, int range_begin, int p, bool standalone) {
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
void ModelPlanner::Impl::EmitRange(int u0, int u1, int k, OpGraph* g, bool standalone,
                                   std::vector<OpId>* unit_ends) {
  for (int j = u0; j < u1; ++j) {
    const Unit& u = units[static_cast<size_t>(j)];
    const Deps gather = u.kind == UnitKind::kLn1 ? ZeroGather(g, u.block, F) : Deps{};
    const internal::UnitOps& ops = UnitTemplate(u, k);
    const OpGraph& tmpl = ops.graph;
    const Deps lf = ops.out;
    const int n = tmpl.size();
    map.assign(static_cast<size_t>(n) * k, kNoOp);
    piece_begin[static_cast<size_t>(j)] = static_cast<int>(piece_out.size());
    piece_k[static_cast<size_t>(j)] = k;
    const bool moe = IsRoutedUnit(u.kind);
    if (moe) {
      for (BufAlias a : tmpl.aliases()) {
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
      Op op = tmpl.op(l);
      op.block = u.block;
      if (IsMoeUnit(u.kind)) op.flags |= kMoeScope;
      OpExec exec = tmpl.exec(l);
      const auto local = tmpl.deps(l);
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
      auto at = [&](OpId lo) { return lo == kNoOp ? kNoOp : map[static_cast<size_t>(lo) * k + p]; };
      piece_out.push_back({at(lf.a), at(lf.b)});
    }
    if (unit_ends != nullptr) unit_ends->push_back(g->size());
  }
}

// A unit's ops (BuildUnit) split k ways, built once per plan: they depend on
// its kind, k and, for the routed experts, the schedule and algorithm, never
// on its block (EmitRange stamps that).
const internal::UnitOps& ModelPlanner::Impl::UnitTemplate(const Unit& u, int k) {
  const uint64_t combo = internal::IsRoutedUnit(u.kind)
                             ? 1 + static_cast<uint64_t>(sched) * 4 + static_cast<uint64_t>(algo)
                             : 0;
  const uint64_t key = static_cast<uint64_t>(u.kind) | static_cast<uint64_t>(k) << 8 | combo << 24;
  auto [it, fresh] = unit_ops.try_emplace(key);
  if (fresh) {
    Builder sb(cost, &it->second.graph);
    LayerConfig piece_layer;
    it->second.out = BuildUnit(u, k, sb, Deps{}, &piece_layer);
  }
  return it->second;
}

void ModelPlanner::Impl::ResetPieces() {
  piece_out.clear();
  piece_begin.assign(units.size(), 0);
  piece_k.assign(units.size(), 1);
}

// ZeRO-3: a block's parameters are gathered over their DP groups before its
// forward and again before its backward. The gathers depend on nothing, so
// they run ahead on the link as far as its FIFO allows (prefetch).
Deps ModelPlanner::Impl::ZeroGather(OpGraph* g, int block, Phase phase) {
  if (st.zero_stage < 3) return {};
  Builder b(cost, g);
  b.Stamp(block, kPrefetch);
  const double e = ParamGatherBytes();
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

}  // namespace moeplan::planner
