// The whole model's backward (model_planner_internal.h): the forward's units
// in reverse with dX and dW ops, the parameters each gradient completes, and
// the backward AlltoAlls where Lancet may place dW ops.
#include <cstdint>
#include <string_view>

#include "model_planner_internal.h"
#include "moeplan/base/strings.h"

namespace moeplan::planner {

using internal::B;
using internal::Builder;
using internal::DenseColl;
using internal::DenseGemm;
using internal::DenseMemory;
using internal::Deps;
using internal::kJoin;
using internal::Slot;

namespace {

// The backward of one model graph, block by block in reverse: every op goes
// to the Impl's g0, every gradient to its params (the parameters each op
// completes) and every weight GEMM's dW op to its dw_ops.
class BackwardEmitter {
  const bool copy_blocks_;

 public:
  // `copy_blocks`: blocks of a kind after the first are copied from it
  // (BackwardTemplate's emission, on a graph of the backward alone).
  BackwardEmitter(ModelPlanner::Impl& s, bool detach, bool copy_blocks = false)
      : copy_blocks_(copy_blocks),
        s_(s),
        m_(*s.m),
        detach_(detach),
        dm_(s.dims),
        S_(m_.micro_batch_size * m_.seq_length),
        Bq_(m_.micro_batch_size),
        M_(m_.hidden_size),
        L_(m_.seq_length),
        t_(m_.parallel.mp),
        hp_(dm_.heads),
        f_(dm_.ffn),
        fs_(dm_.shared),
        v_(dm_.vocab),
        e_(m_.bytes_per_element),
        sm_(static_cast<double>(S_) * M_ * e_),
        sp_(t_ > 1 && m_.parallel.sequence_parallel),
        fp8_(m_.Fp8()),
        seq_(sp_ ? sm_ / static_cast<double>(t_) : sm_),
        b_(s.cost, &s.g0) {}

  void Emit(Deps x) {
    if (m_.vocab_size > 0 && s_.st.head) {
      // The MTP depths in reverse (each: its output layer, block and input
      // projection), then the main output layer.
      for (int d = m_.mtp_num_layers - 1; d >= 0; --d) {
        x = Head(x, /*mtp=*/true);
        x = Block(m_.num_layers + d, x);
        b_.Stamp(m_.num_layers + d, 0);
        x = Linear("bwd.mtp_proj_dx", "bwd.mtp_proj_dw", 2 * M_, M_ / t_,
                   2.0 * static_cast<double>(M_) * M_ / t_, x);
        x = Mem("bwd.mtp_norm", 6.0 * sm_, x);
        Param(2.0 * Norm(M_), x);
        // The lookup's gradient: into the stage's own copy of the embedding
        // when the first stage holds the table (Megatron-Core builds one on
        // the MTP stage), else into the table itself (bwd.embed's).
        x = Mem("bwd.mtp_embed", 3.0 * sm_, x);
        if (!s_.st.embed) Param(static_cast<double>(v_) * M_, x);
      }
      x = Head(x, /*mtp=*/false);
    }
    for (int blk = s_.end_block - 1; blk >= s_.first_block; --blk) x = Block(blk, x);
    if (m_.vocab_size > 0 && s_.st.embed) {
      b_.Stamp(-1, 0);
      x = Mem("bwd.embed", 3.0 * sm_, x);
      Param((static_cast<double>(v_) + EmbeddingPositions(m_)) * M_, x);
    }
  }

 private:
  Deps Mem(std::string_view name, double bytes, Deps in) {
    return b_.Compute(name, B, Term::kDense, s_.cost.MemoryBoundUs(bytes), bytes, in, 0,
                      DenseMemory(bytes, e_));
  }
  // A GEMM in bytes_per_element, or (`linear`) a linear layer's: FP8 with
  // FP8 training, after `cast` elements (dX: the output gradient) are
  // quantized; dW reads the column-wise copies the casts wrote.
  Deps Gemm(std::string_view name, int64_t mm, int64_t nn, int64_t kk, Deps in, uint8_t flags = 0,
            bool linear = false, double cast = 0.0) {
    const bool fp8 = linear && fp8_;
    const internal::GemmCost g =
        internal::GemmOf(s_.cost, fp8 ? *s_.linear : s_.cost, mm, nn, kk, e_, fp8 ? cast : 0.0);
    return b_.Compute(name, B, Term::kDense, g.us, g.bytes, in, flags, DenseGemm(mm, nn, kk));
  }
  Deps AllReduce(std::string_view name, Deps in) {
    return b_.Coll(name, B, Collective::kAllReduce, s_.mp_shape, sm_, in,
                   DenseColl(ExecKind::kAllReduce, ExecGroup::kMp, sm_, e_));
  }
  // A TP-split input gradient's partial sums: AllReduced, or with sequence
  // parallelism ReduceScattered into S/t slices (the dual of the forward's
  // AllGather).
  Deps Reduce(std::string_view allreduce_name, std::string_view reducescatter_name, Deps in) {
    if (!sp_) return AllReduce(allreduce_name, in);
    return b_.Coll(reducescatter_name, B, Collective::kReduceScatter, s_.mp_shape, seq_, in,
                   DenseColl(ExecKind::kReduceScatter, ExecGroup::kMp, seq_, e_),
                   s_.TpCommExposed(reducescatter_name));
  }
  // Sequence parallel: S/t slices AllGathered over TP (an output gradient
  // entering a TP sub-block, the dual of its forward ReduceScatter; or a
  // saved input re-gathered for a weight gradient). Without: `in`.
  Deps Gather(std::string_view name, Deps in) {
    if (!sp_) return in;
    return b_.Coll(name, B, Collective::kAllGather, s_.mp_shape, seq_, in,
                   DenseColl(ExecKind::kAllGather, ExecGroup::kMp, seq_, e_),
                   s_.TpCommExposed(name));
  }
  Deps Join(std::string_view name, Deps in) {
    return b_.Compute(name, B, Term::kDense, 0.0, 0.0, in, 0, kJoin);
  }
  void Param(double elements, Deps producer) { s_.params.push_back({elements * e_, producer.a}); }
  // A weight GEMM's backward: dX, then dW (off the chain when detached).
  // `regather`: with sequence parallelism the GEMM's saved input is the S/t
  // slice, AllGathered again (an op of that name) for dW, as Megatron's
  // column-parallel linears do.
  Deps Linear(std::string_view dx_name, std::string_view dw_name, int64_t in_f, int64_t out_f,
              double param_elements, Deps in, std::string_view regather = {}) {
    const Deps dx = Gemm(dx_name, S_, in_f, out_f, in, 0, true, static_cast<double>(S_) * out_f);
    Deps dw_in = detach_ ? in : dx;
    if (sp_ && !regather.empty()) {
      const Deps input = Gather(regather, in);
      dw_in = detach_ ? input : Deps{dx.a, input.a};
    }
    const Deps dw = Gemm(dw_name, out_f, in_f, S_, dw_in, kWeightGrad, true);
    s_.dw_ops.push_back(dw.a);
    Param(param_elements, dw);
    return detach_ ? dx : dw;
  }

  // The loss, LM head and final norm.
  // `mtp`: an MTP depth's, whose output layer is the main one's (its
  // gradient adds to the same parameters) and whose norm is its own.
  Deps Head(Deps x, bool mtp) {
    b_.Stamp(-1, 0);
    x = Mem("bwd.loss", 3.0 * e_ * S_ * v_, x);
    // The tied embedding's gradient completes at bwd.embed (below); a last
    // stage without the embedding holds its own copy (Megatron-LM).
    const Deps dx = Gemm("bwd.lm_head_dx", S_, M_, v_, x);
    Deps dw_in = detach_ ? x : dx;
    if (sp_) {
      const Deps input = Gather("bwd.lm_head_input_allgather", x);
      dw_in = detach_ ? input : Deps{dx.a, input.a};
    }
    const Deps dw = Gemm("bwd.lm_head_dw", v_, M_, S_, dw_in, kWeightGrad);
    s_.dw_ops.push_back(dw.a);
    if (!mtp && (!s_.st.embed || m_.untie_embeddings_and_output_weights)) {
      Param(static_cast<double>(v_) * M_, dw);
    }
    x = detach_ ? dx : dw;
    if (t_ > 1) x = Reduce("bwd.lm_head_allreduce", "bwd.lm_head_reducescatter", x);
    x = Mem("bwd.ln_f", 3.0 * seq_, x);
    Param(Norm(M_), x);
    return x;
  }

  // One block: emitted, or copied from the first block of its kind.
  Deps Block(int blk, Deps x) {
    const bool moe = m_.IsMoeBlock(blk);
    const RankParams params = BlockParams(m_, blk);
    Source& src = sources_[moe ? 1 : 0];
    const bool same =
        src.blk >= 0 && src.params.dense == params.dense && src.params.expert == params.expert;
    if (copy_blocks_ && same && x.b == kNoOp) return {CopyBlock(src, blk, x.a)};
    Source rec = Record(blk, params, x);
    const Deps out = EmitBlock(blk, x);
    if (copy_blocks_ && src.blk < 0 && x.b == kNoOp && out.b == kNoOp) {
      Close(&rec, out.a);
      if (SelfContained(rec)) src = rec;
    }
    return out;
  }

  // A block's ops in g0 and what it recorded, by position.
  struct Source {
    int blk = -1;  // -1: none yet
    RankParams params;
    OpId input = kNoOp, begin = 0, end = 0, out = kNoOp;
    size_t params_begin = 0, params_end = 0, dw_begin = 0, dw_end = 0;
    size_t slots_begin = 0, slots_end = 0, layers_begin = 0, layers_end = 0;
    size_t aliases_begin = 0, aliases_end = 0;
  };
  Source Record(int blk, RankParams params, Deps x) const {
    Source r;
    r.blk = blk;
    r.params = params;
    r.input = x.a;
    r.begin = s_.g0.size();
    r.params_begin = s_.params.size();
    r.dw_begin = s_.dw_ops.size();
    r.slots_begin = s_.slots.size();
    r.layers_begin = s_.g0.layers().size();
    r.aliases_begin = s_.g0.aliases().size();
    return r;
  }
  void Close(Source* r, OpId out) const {
    r->end = s_.g0.size();
    r->out = out;
    r->params_end = s_.params.size();
    r->dw_end = s_.dw_ops.size();
    r->slots_end = s_.slots.size();
    r->layers_end = s_.g0.layers().size();
    r->aliases_end = s_.g0.aliases().size();
  }
  // Whether the block reads nothing before it but its input, and its ops
  // name only the layer instances it added: then a copy renumbered to
  // another block is what emitting that block gives.
  bool SelfContained(const Source& r) const {
    const OpGraph& g = s_.g0;
    auto inside = [&](OpId v) { return v == kNoOp || v == r.input || (v >= r.begin && v < r.end); };
    for (OpId v = r.begin; v < r.end; ++v) {
      if (g.op(v).block != r.blk) return false;
      for (OpId d : g.deps(v)) {
        if (!inside(d)) return false;
      }
      const int16_t layer = g.exec(v).layer;
      if (layer != 0 && (static_cast<size_t>(layer) <= r.layers_begin ||
                         static_cast<size_t>(layer) > r.layers_end)) {
        return false;
      }
    }
    for (size_t i = r.params_begin; i < r.params_end; ++i) {
      if (!inside(s_.params[i].producer)) return false;
    }
    for (size_t i = r.dw_begin; i < r.dw_end; ++i) {
      if (!inside(s_.dw_ops[i])) return false;
    }
    for (size_t i = r.slots_begin; i < r.slots_end; ++i) {
      for (OpId o : s_.slots[i].ops) {
        if (o < r.begin || o >= r.end) return false;
      }
    }
    return r.out >= r.begin && r.out < r.end;
  }
  // Block `blk` after `input`, copied from `src`: ids shifted, the block,
  // its layer instances, aliases and slot names renumbered; its parameters,
  // dW ops and slots recorded in the same order.
  OpId CopyBlock(const Source& src, int blk, OpId input) {
    OpGraph& g = s_.g0;
    const OpId shift = g.size() - src.begin;
    auto id = [&](OpId v) { return v == kNoOp ? kNoOp : v == src.input ? input : v + shift; };
    layers_.clear();  // the copy's instance of each of the source's
    for (size_t i = src.layers_begin; i < src.layers_end; ++i) {
      ExecLayer l = g.layers()[i];
      l.block = static_cast<int16_t>(blk);
      layers_.push_back(g.AddLayer(l));
    }
    for (size_t i = src.aliases_begin; i < src.aliases_end; ++i) {
      BufAlias a = g.aliases()[i];
      a.block = static_cast<int16_t>(blk);
      g.Alias(a);
    }
    for (OpId v = src.begin; v < src.end; ++v) {
      deps_.clear();
      for (OpId d : g.deps(v)) deps_.push_back(id(d));
      Op op = g.op(v);
      op.block = static_cast<int16_t>(blk);
      OpExec exec = g.exec(v);
      if (exec.layer != 0) {
        exec.layer = layers_[static_cast<size_t>(exec.layer) - 1 - src.layers_begin];
      }
      g.Add(op, deps_, exec);
    }
    for (size_t i = src.params_begin; i < src.params_end; ++i) {
      internal::Param p = s_.params[i];
      p.producer = id(p.producer);
      s_.params.push_back(p);
    }
    for (size_t i = src.dw_begin; i < src.dw_end; ++i) s_.dw_ops.push_back(id(s_.dw_ops[i]));
    for (size_t i = src.slots_begin; i < src.slots_end; ++i) {
      Slot slot = s_.slots[i];
      slot.block = blk;
      slot.first = id(slot.first);
      slot.last = id(slot.last);
      for (OpId& o : slot.ops) o = id(o);
      s_.slots.push_back(std::move(slot));
    }
    b_.Stamp(blk, 0);
    return id(src.out);
  }

  // One block emitted: its FFN (or MoE layer), then its attention.
  Deps EmitBlock(int blk, Deps x) {
    if (s_.st.zero_stage == 3) {
      const Deps gather = s_.ZeroGather(&s_.g0, blk, B);
      if (gather.a != kNoOp || gather.b != kNoOp) {
        b_.Stamp(blk, 0);
        x = Join("bwd.zero_wait", {x.a, gather.a});
        if (gather.b != kNoOp) x = Join("bwd.zero_wait", {x.a, gather.b});
      }
    }
    b_.Stamp(blk, 0);
    const Deps out_grad = x;
    x = m_.IsMoeBlock(blk) ? MoeBlock(blk, x) : DenseFfn(x);
    Param(Norm(M_), x);
    x = Mem("bwd.residual2", 3.0 * seq_, Deps{x.a, out_grad.a});
    return Attention(x);
  }

  double Norm(double width) const {
    return m_.normalization == Normalization::kRmsNorm ? width : 2.0 * width;
  }
  // An activation's backward: reads its input (2x with a gated linear unit)
  // and the output gradient, writes the input gradient.
  double ActBackwardBytes(int64_t width) const {
    return (1.0 + 2.0 * m_.FfnInputFactor()) * e_ * S_ * width;
  }

  Deps DenseFfn(Deps x) {
    const double bias = m_.add_bias_linear ? 1.0 : 0.0;
    x = Gather("bwd.fc2_allgather", x);
    x = Linear("bwd.fc2_dx", "bwd.fc2_dw", f_, M_, static_cast<double>(f_) * M_ + bias * M_, x);
    x = Mem(m_.gated_linear_unit ? "bwd.swiglu" : "bwd.gelu", ActBackwardBytes(f_), x);
    x = Linear("bwd.fc1_dx", "bwd.fc1_dw", M_, dm_.ffn_in,
               static_cast<double>(M_) * dm_.ffn_in + bias * dm_.ffn_in, x,
               "bwd.fc1_input_allgather");
    if (t_ > 1) x = Reduce("bwd.fc1_allreduce", "bwd.fc1_reducescatter", x);
    return Mem("bwd.ln2", 3.0 * seq_, x);
  }

  // The shared expert's backward beside the routed experts', from the
  // block's output gradient.
  Deps SharedExpert(int blk, Deps out_grad) {
    b_.Stamp(blk, kMoeScope);
    out_grad = Gather("bwd.shared_allgather", out_grad);
    if (m_.moe.shared_expert_gate) {
      // The scaling's and the gate's gradients: the output gradient and the
      // shared output read, the gate GEMV's input gradient accumulated.
      out_grad = Mem("bwd.shared_gate", 4.0 * sm_, out_grad);
      Param(M_, out_grad);
    }
    Deps z = Linear("bwd.shared_fc2_dx", "bwd.shared_fc2_dw", fs_, M_,
                    static_cast<double>(fs_) * M_, out_grad);
    z = Mem("bwd.shared_act", ActBackwardBytes(fs_), z);
    z = Linear("bwd.shared_fc1_dx", "bwd.shared_fc1_dw", M_, dm_.shared_in,
               static_cast<double>(M_) * dm_.shared_in, z, "bwd.shared_fc1_input_allgather");
    if (t_ > 1) z = Reduce("bwd.shared_allreduce", "bwd.shared_reducescatter", z);
    b_.Stamp(blk, 0);
    return z;
  }

  // The routed experts' sections (unroute, exchange, route), the shared
  // expert, and the norm before them.
  Deps MoeBlock(int blk, Deps x) {
    const Deps out_grad = x;
    OpGraph& g0 = s_.g0;
    const LayerContext ctx = s_.MoeContext(&s_.moe_layer, blk, detach_);
    // The routed experts' backward ops use the block's whole-micro-batch instance.
    const int16_t instance = g0.AddLayer({static_cast<int16_t>(blk), -1, S_});
    auto stamp = [&](OpId from) {
      for (OpId id = from; id < g0.size(); ++id) g0.SetExecLayer(id, instance);
    };
    const OpId unroute = g0.size();
    Frontier y = AppendSection(s_.sched, MoeSection::kBwdUnroute, ctx, &g0, {x.a, x.b});
    stamp(unroute);
    const Deps shared = fs_ > 0 ? SharedExpert(blk, out_grad) : Deps{};
    const OpId before = g0.size();
    y = AppendSection(s_.sched, MoeSection::kBwdExchange, ctx, &g0, y);
    stamp(before);
    s_.RecordSlots(before, blk);
    ExpertGrads(blk, before);
    const OpId route = g0.size();
    y = AppendSection(s_.sched, MoeSection::kBwdRoute, ctx, &g0, y);
    stamp(route);
    OpId gate = kNoOp;
    for (OpId id = route; id < g0.size(); ++id) {
      const std::string_view base = g0.op(id).base;
      if (base == "bwd.gate" || base == "bwd.mp_allreduce_gate") gate = id;
    }
    s_.params.push_back({static_cast<double>(M_) * m_.moe.num_experts * e_, gate});
    x = Mem("bwd.ln2", 3.0 * seq_, Deps{y.a, shared.a});
    if (y.b != kNoOp) x = Join("bwd.ln2_join", {x.a, y.b});
    return x;
  }

  // The experts' dW ops of the exchange section from `before`, each
  // completing an equal share of the block's expert parameters.
  void ExpertGrads(int blk, OpId before) {
    const OpGraph& g0 = s_.g0;
    int expert_dw = 0;
    for (OpId id = before; id < g0.size(); ++id) {
      if (g0.op(id).flags & kWeightGrad) ++expert_dw;
    }
    for (OpId id = before; id < g0.size(); ++id) {
      if (!(g0.op(id).flags & kWeightGrad)) continue;
      s_.dw_ops.push_back(id);
      s_.params.push_back({BlockParams(m_, blk).expert * e_ / expert_dw, id, true});
    }
  }

  Deps Attention(Deps x) {
    const Deps mid = x;
    const CostModel& c = s_.cost;
    const int64_t qk = dm_.qk, dv = dm_.v;
    x = Gather("bwd.proj_allgather", x);
    x = Linear("bwd.proj_dx", "bwd.proj_dw", dm_.attn_out, M_,
               static_cast<double>(M_) * dm_.attn_out + (m_.add_bias_linear ? M_ : 0), x);
    if (s_.cp_shape.ranks > 1) {
      x = s_.RingAttention(b_, B, Bq_, x);
    } else if (m_.FusedAttention()) {
      x = b_.Compute(
          "bwd.flash_attn", B, Term::kDense,
          internal::kFlashBackwardRatio * internal::FlashAttentionUs(c, Bq_, hp_, L_, dm_),
          2.0 * e_ * Bq_ * hp_ * L_ * (2.0 * qk + 2.0 * dv), x, 0,
          DenseGemm(L_, L_, qk, Bq_ * hp_, 5));
    } else {
      x = CoreBackward(x);
    }
    x = m_.multi_latent_attention ? LatentProjections(x) : QkvProjection(x);
    if (t_ > 1) x = Reduce("bwd.qkv_allreduce", "bwd.qkv_reducescatter", x);
    x = Mem("bwd.ln1", 3.0 * seq_, x);
    Param(Norm(M_), x);
    return Mem("bwd.residual1", 3.0 * seq_, Deps{x.a, mid.a});
  }

  // The unfused core's backward: context, softmax, scores.
  Deps CoreBackward(Deps x) {
    const CostModel& c = s_.cost;
    const int64_t qk = dm_.qk, dv = dm_.v;
    // dP = dO V^T (L x L x v) and dV = P^T dO (L x v x L).
    x = b_.Compute("bwd.attn_ctx", B, Term::kDense,
                   c.BatchedGemmUs(Bq_ * hp_, L_, L_, dv) + c.BatchedGemmUs(Bq_ * hp_, L_, dv, L_),
                   2.0 * e_ * Bq_ * hp_ * (2.0 * L_ * dv + L_ * L_), x, 0,
                   DenseGemm(L_, L_, dv, Bq_ * hp_, 2));
    x = Mem("bwd.softmax", 3.0 * e_ * Bq_ * hp_ * L_ * L_, x);
    // dQ = dS K (L x qk x L) and dK = dS^T Q (L x qk x L).
    x = b_.Compute("bwd.attn_score", B, Term::kDense, 2.0 * c.BatchedGemmUs(Bq_ * hp_, L_, qk, L_),
                   2.0 * e_ * Bq_ * hp_ * (2.0 * L_ * qk + L_ * L_), x, 0,
                   DenseGemm(L_, qk, L_, Bq_ * hp_, 2));
    return x;
  }

  Deps QkvProjection(Deps x) {
    if (m_.qk_layernorm) {
      x = Mem("bwd.qk_norm", 3.0 * e_ * S_ * (hp_ + dm_.groups) * dm_.qk, x);
      Param(2.0 * Norm(static_cast<double>(dm_.qk)), x);
    }
    const double bias = m_.add_qkv_bias || m_.add_bias_linear ? 1.0 : 0.0;
    return Linear("bwd.qkv_dx", "bwd.qkv_dw", M_, dm_.qkv,
                  static_cast<double>(M_) * dm_.qkv + bias * dm_.qkv, x, "bwd.qkv_input_allgather");
  }

  // MLA's up projections (split over TP), then the down projections (whole
  // on every rank) and their norms; the query and key/value paths join at
  // the block input's gradient.
  Deps LatentProjections(Deps x) {
    Deps q = Linear("bwd.q_up_dx", "bwd.q_up_dw", dm_.q_lora > 0 ? dm_.q_lora : M_, dm_.q_up,
                    static_cast<double>(dm_.q_lora > 0 ? dm_.q_lora : M_) * dm_.q_up, x);
    if (dm_.q_lora > 0) {
      q = Mem("bwd.q_norm", 3.0 * e_ * S_ * dm_.q_lora, q);
      Param(Norm(static_cast<double>(dm_.q_lora)), q);
      q = Linear("bwd.q_down_dx", "bwd.q_down_dw", M_, dm_.q_lora,
                 static_cast<double>(M_) * dm_.q_lora, q);
    }
    Deps kv = Linear("bwd.kv_up_dx", "bwd.kv_up_dw", dm_.kv_lora, dm_.kv_up,
                     static_cast<double>(dm_.kv_lora) * dm_.kv_up, x);
    kv = Mem("bwd.kv_norm", 3.0 * e_ * S_ * dm_.kv_lora, kv);
    Param(Norm(static_cast<double>(dm_.kv_lora)), kv);
    kv = Linear("bwd.kv_down_dx", "bwd.kv_down_dw", M_, dm_.kv_lora + dm_.rope,
                static_cast<double>(M_) * (dm_.kv_lora + dm_.rope), kv);
    return Join("bwd.attn_in_join", {q.a, kv.a});
  }

  ModelPlanner::Impl& s_;
  const ModelConfig& m_;
  const bool detach_;
  const RankDims& dm_;
  const int64_t S_, Bq_, M_, L_, t_, hp_, f_, fs_, v_;
  const double e_, sm_;
  const bool sp_;     // sequence parallelism
  const bool fp8_;    // FP8 training: linear layers' GEMMs at the FP8 peak
  const double seq_;  // an activation between the TP sub-blocks: S/t tokens with sp_
  Builder b_;
  Source sources_[2];  // the first dense and MoE block emitted, to copy
  std::vector<OpId> deps_;
  std::vector<int16_t> layers_;
};

}  // namespace

// Appends the backward after `x` (the forward's end) into g0; records
// params, slots, dW ops.
void ModelPlanner::Impl::EmitBackward(Deps x, bool detach) {
  BackwardEmitter(*this, detach).Emit(x);
}

// The backward template of the current pair (CopyBackward), built on its
// first use in a plan: emitted into g0 on its own (after a stand-in for the
// forward's last op), then kept with each op's parameters listed.
internal::BackwardOps& ModelPlanner::Impl::BackwardTemplate(bool detach) {
  // One per detach, for the pair being planned (PlanVariants plans pair by
  // pair): rebuilt on its storage when the plan or the pair changes.
  internal::BackwardOps& t = bwd_ops[detach ? 1 : 0];
  const uint64_t pair = 1 + static_cast<uint64_t>(sched) * 4 + static_cast<uint64_t>(algo);
  if (t.plan == plan_count && t.pair == pair) return t;
  t.plan = plan_count;
  t.pair = pair;
  ++t.build;
  std::swap(g0, t.graph);
  g0.Clear();
  g0.RecordExec(true);  // a template says what its ops compute, whatever g0 records
  // The template holds what its own emission records, nothing before it.
  params.clear();
  slots.clear();
  dw_ops.clear();
  Op stand_in;
  stand_in.base = "bwd.input";
  BackwardEmitter(*this, detach, /*copy_blocks=*/true).Emit({g0.Add(stand_in, {})});
  std::swap(g0, t.graph);
  t.params.swap(params);
  t.slots.swap(slots);
  t.dw_ops.swap(dw_ops);
  params.clear();
  slots.clear();
  dw_ops.clear();
  t.param_first.assign(static_cast<size_t>(t.graph.size()), -1);
  t.param_next.assign(t.params.size(), -1);
  t.forward_param = false;
  for (size_t i = t.params.size(); i-- > 0;) {
    const OpId p = t.params[i].producer;
    if (p == 0) t.forward_param = true;
    if (p < 0) continue;
    t.param_next[i] = t.param_first[static_cast<size_t>(p)];
    t.param_first[static_cast<size_t>(p)] = static_cast<int>(i);
  }
  return t;
}

}  // namespace moeplan::planner
