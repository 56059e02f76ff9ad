// The per-rank memory model of a layout (docs/layouts.md "Memory").
#include "moeplan/planner/layout_memory.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>

#include "field_rules.h"
#include "fmt/format.h"
#include "layout_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/pipeline.h"

namespace moeplan::planner {

using internal::Bad;
using internal::ChunkOptions;
using internal::kGiB;

namespace {

std::string GiB(double bytes) { return fmt::format("{:.1f} GiB", bytes / kGiB); }

}  // namespace

absl::Status ValidateMemoryOptions(const MemoryOptions& o) {
  auto check = [](std::string_view field, double v, double lo) -> absl::Status {
    if (!std::isfinite(v) || v < lo || v > 1024.0) {
      return Bad(field, Cat("must be between ", lo, " and 1024 bytes"), Cat(v));
    }
    return absl::OkStatus();
  };
  MOEPLAN_RETURN_IF_ERROR(check("memory.param_bytes", o.param_bytes, 0.0));
  MOEPLAN_RETURN_IF_ERROR(check("memory.grad_bytes", o.grad_bytes, 0.0));
  MOEPLAN_RETURN_IF_ERROR(check("memory.optimizer_bytes", o.optimizer_bytes, 0.0));
  if (!std::isfinite(o.gpu_memory_bytes) || o.gpu_memory_bytes > 1e15) {
    return Bad("memory.gpu_memory_gib", "must be finite, >= 0 and <= 1e6 GiB",
               Cat(o.gpu_memory_bytes / kGiB));
  }
  return absl::OkStatus();
}

std::string MemoryBreakdown::OverReason() const {
  if (fits()) return "";
  std::pair<double, std::string_view> terms[] = {
      {params, "parameters"},
      {grads, "gradients"},
      {optimizer, "optimizer states"},
      {activations, "activations"},
      {capacity_buffers, "expert capacity buffers"},
  };
  const auto largest = *std::max_element(std::begin(terms), std::end(terms));
  return Cat("stage ", stage, " needs ", GiB(total), " per GPU of ", GiB(limit), " (",
             GiB(total - limit), " over); largest term: ", largest.second, " ", GiB(largest.first),
             largest.second == "activations"
                 ? fmt::format(" ({:.2f} micro-batches in flight)", in_flight)
                 : std::string());
}

namespace {

// Rows each expert's buffer holds for `tokens` tokens (0 in a dense model).
double ExpertCapacity(const ModelConfig& m, double tokens) {
  if (m.IsDense()) return 0.0;
  return static_cast<double>(Capacity(m.moe.top_k, m.moe.capacity_factor,
                                      static_cast<int64_t>(tokens), m.moe.num_experts));
}

// What attention keeps per token on a rank, in 2-byte units: Q and K for the
// scores, V and the output projection's input (MHA: 8M/t); MLA also keeps its
// latents (the norms' and up projections' inputs).
double AttentionKept(const ModelConfig& m, const RankDims& dm) {
  const double hp = static_cast<double>(dm.heads), qk = static_cast<double>(dm.qk);
  const double dv = static_cast<double>(dm.v), kvh = static_cast<double>(dm.groups);
  if (m.multi_latent_attention) {
    return 2.0 * (2.0 * hp * qk + 2.0 * hp * dv) +
           4.0 * static_cast<double>(dm.q_lora + dm.kv_lora + dm.rope);
  }
  return 2.0 * (hp * qk + kvh * qk + kvh * dv + hp * dv);
}

// What selective recomputation does not keep of block `blk`, in 2-byte units
// (StageMemory's): core_attn the unfused scores, softmax and dropout (5as^2b/t;
// a fused kernel keeps nothing beyond its inputs and output, which the
// projections around it keep anyway), layernorm the two norms' outputs (the
// QKV and MLP inputs, 4sbh), mla_up_proj the up-projected Q, K and V, mlp a
// dense block's FC1 and activation outputs, moe_act the experts' activation
// output, shared_experts the shared experts' hidden tensors.
double NotKept(const ModelConfig& m, const Layout& l, const RankDims& dm, int blk, double S,
               double rows, double seq) {
  const uint8_t r = l.recompute_modules;
  if (r == 0) return 0.0;
  const double M = static_cast<double>(m.hidden_size), e = m.bytes_per_element;
  double out = 0.0;
  if ((r & kRecomputeCoreAttn) && !m.FusedAttention()) {
    out += 5.0 * static_cast<double>(m.num_attention_heads) * m.seq_length * S / l.tp;
  }
  if (r & kRecomputeLayernorm) out += 4.0 * S * M * seq;
  if (r & kRecomputeMlaUpProj) out += 2.0 * S * static_cast<double>(dm.heads * (2 * dm.qk + dm.v));
  if (!m.IsMoeBlock(blk)) {
    if (r & kRecomputeMlp) out += 2.0 * S * static_cast<double>(dm.ffn_in + dm.ffn);
    return out;
  }
  const double shard = static_cast<double>(m.moe.expert_ffn_hidden_size) / l.esp;
  if (r & kRecomputeMoeAct) out += rows * shard * e / (e / 2.0);
  if (r & kRecomputeSharedExperts) out += 2.0 * S * static_cast<double>(dm.shared_in + dm.shared);
  return out;
}

// FP8 training: the linear layers keep the 1-byte column-wise copies of
// their inputs for dW (Transformer Engine), not bytes_per_element ones: the
// attention's input (QKV or MLA's down projections) and MLA's latents, the
// output projection's input, and the FFNs' two inputs (a dense block's FC1
// and FC2; an MoE block's experts' rows and the shared experts' FC2: its
// layer input stays kept for the router, which is not FP8). Bytes saved.
double Fp8Saved(const ModelConfig& m, const RankDims& dm, int blk, double S, double rows,
                double seq, double shard) {
  if (!m.Fp8()) return 0.0;
  const double M = static_cast<double>(m.hidden_size);
  double elements = S * M * seq + S * static_cast<double>(dm.attn_out);
  if (m.multi_latent_attention) elements += S * static_cast<double>(dm.q_lora + dm.kv_lora);
  if (m.IsMoeBlock(blk)) {
    elements += rows * (M + shard) + S * static_cast<double>(dm.shared);
  } else {
    elements += S * M * seq + S * static_cast<double>(dm.ffn);
  }
  return elements * (m.bytes_per_element - 1.0);
}

// A parameter's bytes held on a rank, unless memory.param_bytes says: the
// model's element, and with FP8 training the row- and column-wise 1-byte
// copies of the weights the GEMMs read (cached from a step's first
// micro-batch), which with fp8_param_gather are the weights themselves.
double HeldParamBytes(const ModelConfig& m) {
  if (!m.Fp8()) return m.bytes_per_element;
  return m.fp8_param_gather ? 2.0 : m.bytes_per_element + 2.0;
}

// Parameters, gradients and optimizer states, each sharded by ZeRO from its
// stage on: the dense state over DP x CP (Megatron-Core's distributed
// optimizer), the experts' over their replicas.
void HeldState(const Layout& l, const RankParams& params, double param_bytes,
               const MemoryOptions& o, MemoryBreakdown* r) {
  const double dp = l.GradientRanks(), edp = l.ExpertReplicas();
  auto held = [&](double bytes_per_param, int from_stage) {
    const bool sharded = l.zero_stage >= from_stage;
    return bytes_per_param *
           (params.dense / (sharded ? dp : 1.0) + params.expert / (sharded ? edp : 1.0));
  };
  r->params = held(param_bytes, 3);
  r->grads = held(o.grad_bytes, 2);
  r->optimizer = held(o.optimizer_bytes, 1);
}

}  // namespace

double ExpertRows(const ModelConfig& m, const Layout& l, double tokens) {
  const double E = static_cast<double>(m.moe.num_experts);
  const double cap = ExpertCapacity(m, tokens);
  // Every token slot of the layer (E * T), or of its own E/ep experts when
  // the dispatch is local (PPMoE). DPMoE's ESP group gathers the rows of its
  // esp ranks, each routing 1/tp of the TP group's tokens when the grid is
  // folded (esp != tp; 1 when esp == tp).
  const bool folded = l.family == Family::kDpMoe && l.esp != l.tp;
  return l.family == Family::kPpMoe ? E / l.ep * cap : folded ? E * cap * l.esp / l.tp : E * cap;
}

MemoryBreakdown StageMemory(const ModelConfig& model, const Layout& l, int64_t mbs, int stage,
                            double in_flight, const MemoryOptions& o) {
  const ModelConfig m = ModelForLayout(model, l, mbs);
  const int v = l.Chunks();
  MemoryBreakdown r;
  r.stage = stage;
  r.in_flight = in_flight;
  const double e = m.bytes_per_element;
  const double S = static_cast<double>(mbs) * m.seq_length;  // tokens per micro-batch
  const double M = static_cast<double>(m.hidden_size), t = l.tp;
  // Sequence parallelism splits what the TP sub-blocks replicate (norm and
  // residual inputs, dropout masks, the TP GEMMs' inputs) over t.
  const double seq = l.sequence_parallel ? 1.0 / t : 1.0;
  const double a = static_cast<double>(m.num_attention_heads), L = m.seq_length;
  const double E = static_cast<double>(m.moe.num_experts);
  const double rows = ExpertRows(m, l, S);
  const double shard = static_cast<double>(m.moe.expert_ffn_hidden_size) / l.esp;
  const double glu = static_cast<double>(m.FfnInputFactor());
  const RankDims dm = DimsOf(m);
  const double attn_kept = AttentionKept(m, dm);
  RankParams params;
  double act = 0.0, largest_block = 0.0, largest_recomputed = 0.0, buffers = 0.0;
  // DualPipe's two segments are held for very different times: each
  // chunk's activations count at its own peak (DualPipeHeld), the stage's
  // `in_flight` (their sum over 2) is what the breakdown reports.
  const bool dual = l.pipeline == PipelineSchedule::kDualPipe;
  const std::array<int, 2> held =
      dual ? DualPipeHeld(l.pp, l.microbatches, stage) : std::array<int, 2>{};
  double held_act = 0.0;
  for (int c = 0; c < v; ++c) {
    const double act_before = act;
    const StageOptions so = ChunkOptions(m, l, stage, c);
    const RankParams p = StageParams(m, so);
    params.dense += p.dense;
    params.expert += p.expert;
    auto add_block = [&](int blk) {
      // Korthikanti et al. 2022 (eq. 2, tensor parallel without sequence
      // parallelism), in 2-byte units: sbh(10 + 24/t) + 5as^2b/t, and with
      // it (eq. 4) sbh(10/t + 24/t) + 5as^2b/t; the MLP's t-split 16sbh/t is
      // replaced by the MoE's own tensors in MoE blocks.
      // Generalised to other head counts and sizes (attn_kept), gated FFNs
      // (the first GEMM's output and the activation's: (g + 1) f) and fused
      // attention (no s^2 term).
      double block =
          S * (10.0 * M * seq + attn_kept) + (m.FusedAttention() ? 0.0 : 5.0 * a * L * S / t);
      if (m.IsMoeBlock(blk)) {
        block += (S * E * 4.0 + rows * (M + (1.0 + glu) * shard) * e +
                  S * static_cast<double>(dm.shared_in + dm.shared) * e) /
                 (e / 2.0);
        buffers = std::max(buffers, 2.0 * rows * M * e);
      } else {
        block += 2.0 * S * static_cast<double>(dm.ffn_in + dm.ffn);
      }
      const double not_kept = NotKept(m, l, dm, blk, S, rows, seq) * e / 2.0;
      block = block * e / 2.0 - Fp8Saved(m, dm, blk, S, rows, seq, shard);
      largest_block = std::max(largest_block, block);
      largest_recomputed = std::max(largest_recomputed, not_kept);
      act += l.recompute ? S * M * e * seq : block - not_kept;
    };
    for (int blk = so.first_block; blk < so.end_block; ++blk) add_block(blk);
    // The last chunk also runs the MTP depths (blocks num_layers on).
    if (so.head && m.vocab_size > 0) {
      for (int d = 0; d < m.mtp_num_layers; ++d) add_block(m.num_layers + d);
    }
    if (m.vocab_size > 0 && so.embed) act += S * M * e * seq;
    if (m.vocab_size > 0 && so.head) {
      // The logits and their fp32 loss, of the main output layer and each MTP depth's.
      act += (1.0 + m.mtp_num_layers) * S * static_cast<double>(m.vocab_size) / t * (e + 4.0);
    }
    if (dual) held_act += (act - act_before) * held[static_cast<size_t>(c)];
  }
  r.activation_per_microbatch = act;
  // Recomputed activations live again for one block at a time.
  r.activations =
      (dual ? held_act : act * in_flight) + (l.recompute ? largest_block : largest_recomputed);
  r.capacity_buffers = buffers;
  HeldState(l, params, o.param_bytes > 0.0 ? o.param_bytes : HeldParamBytes(m), o, &r);
  r.total = r.params + r.grads + r.optimizer + r.activations + r.capacity_buffers;
  r.limit = std::max(0.0, o.gpu_memory_bytes);
  return r;
}

}  // namespace moeplan::planner
