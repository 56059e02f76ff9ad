// Layouts and their field rules (docs/layouts.md).
#include "moeplan/planner/layout.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <utility>

#include "enum_names.h"
#include "field_rules.h"
#include "layout_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/limits.h"
#include "moeplan/planner/pipeline.h"

namespace moeplan::planner {
namespace {

using internal::Bad;

constexpr int kMaxDegree = 1 << 20;

absl::Status Degree(std::string_view field, int v) {
  if (v < 1 || v > kMaxDegree) return Bad(field, Cat("must be between 1 and ", kMaxDegree), Cat(v));
  return absl::OkStatus();
}

absl::Status MustDivide(std::string_view field, std::string_view what, int64_t d, int64_t n) {
  if (n % d == 0) return absl::OkStatus();
  return Bad(field, Cat("must divide ", what, " (", n, ")"), Cat(d));
}

// Degrees, what each must divide, and how they fit the cluster's nodes.
absl::Status ValidateDegrees(const ModelConfig& m, const Layout& l, const ClusterShape& c) {
  MOEPLAN_RETURN_IF_ERROR(Degree("layout.dp", l.dp));
  MOEPLAN_RETURN_IF_ERROR(Degree("layout.tp", l.tp));
  MOEPLAN_RETURN_IF_ERROR(Degree("layout.pp", l.pp));
  MOEPLAN_RETURN_IF_ERROR(Degree("layout.ep", l.ep));
  MOEPLAN_RETURN_IF_ERROR(Degree("layout.esp", l.esp));
  MOEPLAN_RETURN_IF_ERROR(Degree("layout.cp", l.cp));
  const int g = c.gpus_per_node;
  if (l.tp > g || g % l.tp != 0) {
    return Bad("layout.tp",
               Cat("must divide gpus_per_node (", g, "): tensor parallelism stays inside a node"),
               Cat(l.tp));
  }
  MOEPLAN_RETURN_IF_ERROR(
      MustDivide("layout.tp", "num_attention_heads", l.tp, m.num_attention_heads));
  MOEPLAN_RETURN_IF_ERROR(MustDivide("layout.tp", "ffn_hidden_size", l.tp, m.ffn_hidden_size));
  if (m.vocab_size > 0) {
    MOEPLAN_RETURN_IF_ERROR(MustDivide("layout.tp", "vocab_size", l.tp, m.vocab_size));
  }
  if (m.moe.SharedFfnSize() > 0) {
    MOEPLAN_RETURN_IF_ERROR(MustDivide("layout.tp",
                                       "the shared experts' size (moe.num_shared_experts * "
                                       "moe.shared_expert_ffn_hidden_size)",
                                       l.tp, m.moe.SharedFfnSize()));
  }
  if (m.num_query_groups > 0) {
    MOEPLAN_RETURN_IF_ERROR(MustDivide("layout.tp",
                                       "num_query_groups (Megatron TP splits the "
                                       "key/value heads)",
                                       l.tp, m.num_query_groups));
  }
  if (l.pp > m.num_layers) {
    // Stages need not hold equal numbers of layers (ChunkOptions), but each
    // holds one at least.
    return Bad("layout.pp", Cat("must be <= num_layers (", m.num_layers, ")"), Cat(l.pp));
  }
  if (m.IsDense()) {
    for (auto [field, v] :
         {std::pair<std::string_view, int>{"layout.ep", l.ep}, {"layout.esp", l.esp}}) {
      if (v != 1) {
        return Bad(field, "must be 1 (or unset) for a dense model: it has no experts to split",
                   Cat(v));
      }
    }
  } else {
    MOEPLAN_RETURN_IF_ERROR(MustDivide("layout.ep", "moe.num_experts", l.ep, m.moe.num_experts));
    MOEPLAN_RETURN_IF_ERROR(MustDivide("layout.esp", "moe.expert_ffn_hidden_size", l.esp,
                                       m.moe.expert_ffn_hidden_size));
    // An expert's shards are consecutive ranks (ESP innermost): inside a
    // node or whole nodes, as TP (a folded grid's esp need not divide tp).
    if (!(g % l.esp == 0 || l.esp % g == 0)) {
      return Bad("layout.esp",
                 Cat("must divide gpus_per_node (", g,
                     ") or be a multiple of it: an expert's "
                     "shards are consecutive ranks"),
                 Cat(l.esp));
    }
  }
  const int64_t gpus = int64_t{l.dp} * l.tp * l.cp * l.pp;
  if (gpus > c.TotalGpus()) {
    return Bad("layout", Cat("dp*tp*cp*pp must be <= the GPUs (", c.TotalGpus(), ")"), Cat(gpus));
  }
  const int64_t stage = int64_t{l.dp} * l.tp * l.cp;
  if (!(g % stage == 0 || stage % g == 0)) {
    return Bad("layout",
               Cat("dp*tp*cp (a stage's ranks) must divide gpus_per_node (", g,
                   ") or be a multiple of it"),
               Cat(stage));
  }
  return absl::OkStatus();
}

// How the family places the experts over the stage's tp * cp * dp ranks
// (context-parallel ranks hold other tokens, as data-parallel ones do).
absl::Status ValidateFamily(const Layout& l) {
  const int64_t dp = l.GradientRanks();
  const int64_t stage = dp * l.tp;
  const int64_t experts = int64_t{l.ep} * l.esp;
  switch (l.family) {
    case Family::kDpMoe:
      if (l.esp == l.tp) {
        if (dp % l.ep != 0) {
          return Bad("layout.ep",
                     "dpmoe spreads the experts over data-parallel ranks: must divide dp*cp",
                     Cat("ep=", l.ep, ", dp*cp=", dp));
        }
        break;
      }
      // A folded expert grid (Megatron-Core's --expert-tensor-parallel-size
      // != --tensor-model-parallel-size): ep x esp x edp over the stage's
      // tp x dp ranks, each rank routing its own tokens.
      if (!l.sequence_parallel) {
        return Bad("layout.esp",
                   "dpmoe with esp != tp (a folded expert grid: etp != tp) needs sequence "
                   "parallelism, sp=1 with tp >= 2, so that each rank routes its own tokens",
                   Cat("esp=", l.esp, ", tp=", l.tp, ", sp=0"));
      }
      if (stage % experts != 0) {
        return Bad("layout.ep",
                   "a folded expert grid (esp != tp) places ep*esp ranks per expert replica: "
                   "ep*esp must divide the stage's tp*cp*dp ranks",
                   Cat("ep*esp=", experts, ", tp*cp*dp=", stage));
      }
      break;
    case Family::kPpMoe:
      if (l.tp < 2) {
        return Bad("layout.tp",
                   "ppmoe spreads a layer's experts over the TP group: needs tp >= 2 (with tp = 1 "
                   "every rank holds every expert: dpmoe with ep = 1)",
                   Cat(l.tp));
      }
      if (experts != l.tp) {
        return Bad("layout.ep",
                   "ppmoe spreads a layer's experts over the TP group: ep*esp must equal tp",
                   Cat("ep*esp=", experts, ", tp=", l.tp));
      }
      break;
    case Family::kParm:
      if (experts != stage) {
        return Bad("layout.ep", "parm (MP+EP+ESP) needs ep*esp == tp*cp*dp",
                   Cat("ep*esp=", experts, ", tp*cp*dp=", stage));
      }
      if (l.tp % l.esp != 0) {
        return Bad("layout.esp",
                   "parm runs each expert shard on its TP group's tokens: must divide tp",
                   Cat("esp=", l.esp, ", tp=", l.tp));
      }
      break;
  }
  return absl::OkStatus();
}

// ZeRO, micro-batches, virtual stages and the pipeline schedule.
absl::Status ValidatePipeline(const ModelConfig& m, const Layout& l, int64_t global_batch) {
  if (l.zero_stage < 0 || l.zero_stage > 3) {
    return Bad("layout.zero_stage", "must be 0, 1, 2 or 3", Cat(l.zero_stage));
  }
  if (l.microbatches < 1 || l.microbatches > 4096) {
    return Bad("layout.microbatches", "must be between 1 and 4096", Cat(l.microbatches));
  }
  if (global_batch % (int64_t{l.dp} * l.microbatches) != 0) {
    return Bad("layout.microbatches",
               Cat("dp*microbatches must divide the global batch (", global_batch,
                   " sequences; model.global_batch_size)"),
               Cat("dp=", l.dp, ", microbatches=", l.microbatches));
  }
  const int v = l.virtual_stages;
  if (v < 1 || v > 64) return Bad("layout.virtual_stages", "must be between 1 and 64", Cat(v));
  if (l.pipeline == PipelineSchedule::kInterleaved) {
    if (l.pp < 2 || v < 2) {
      return Bad("layout.pipeline", "interleaved needs pp >= 2 and virtual_stages >= 2",
                 Cat("pp=", l.pp, ", virtual_stages=", v));
    }
    if (l.pp * v > m.num_layers) {
      return Bad("layout.virtual_stages",
                 Cat("pp*virtual_stages must be <= num_layers (", m.num_layers,
                     "): every model chunk holds a layer"),
                 Cat("pp=", l.pp, ", virtual_stages=", v));
    }
    if (l.microbatches % l.pp != 0) {
      return Bad("layout.microbatches", "interleaved 1F1B needs a multiple of pp",
                 Cat("microbatches=", l.microbatches, ", pp=", l.pp));
    }
  } else if (v != 1) {
    return Bad("layout.virtual_stages", "must be 1 unless pipeline is interleaved", Cat(v));
  }
  if (l.pipeline == PipelineSchedule::kDualPipe) {
    // DeepSeek's schedule: two micro-batch streams entering at either end.
    if (l.pp < 2 || l.pp % 2 != 0) {
      return Bad("layout.pp", "dualpipe needs an even pp >= 2 (stages pair from both ends)",
                 Cat(l.pp));
    }
    if (l.microbatches % 2 != 0 || l.microbatches < 2 * l.pp) {
      return Bad("layout.microbatches",
                 "dualpipe needs an even number >= 2*pp (half enter at each end)",
                 Cat("microbatches=", l.microbatches, ", pp=", l.pp));
    }
  }
  if (!DispatcherApplies(m, l, l.dispatcher)) {
    return Bad("layout.dispatcher",
               Cat(DispatcherName(l.dispatcher),
                   " needs expert parallelism (ep >= 2) over an exchange (not ppmoe, which "
                   "dispatches inside the TP group)"),
               Cat("ep=", l.ep, ", family=", FamilyName(l.family)));
  }
  if (l.a2a_overlap) {
    if (m.IsDense() || l.ep < 2) {
      return Bad("layout.a2a_overlap",
                 "needs expert parallelism (ep >= 2): it hides the experts' AlltoAlls",
                 Cat("ep=", l.ep));
    }
    // As Megatron-Core: one stage, or interleaved chunks. With 1F1B over
    // stages a pair's backward would wait for the next stage's pair, which
    // waits for this stage's last forward: neighbours would take turns.
    if (l.pp > 1 && l.pipeline != PipelineSchedule::kInterleaved &&
        l.pipeline != PipelineSchedule::kDualPipe) {
      return Bad("layout.a2a_overlap",
                 "with pp > 1 needs pipeline=interleaved (Megatron-Core's overlapped 1F1B runs "
                 "one stage or virtual stages) or dualpipe",
                 Cat("pipeline=", PipelineScheduleName(l.pipeline)));
    }
  }
  if (!l.stage_layers.empty()) {
    const int64_t stages = int64_t{l.pp} * v;
    if (static_cast<int64_t>(l.stage_layers.size()) != stages) {
      return Bad("layout.pipeline_model_parallel_layout",
                 Cat("must name pp*virtual_stages (", stages, ") stages"),
                 Cat(l.stage_layers.size(), " stages"));
    }
    if (absl::Status st = ValidatePipelineLayout(l.stage_layers, m, l.pp); !st.ok()) {
      return absl::InvalidArgumentError(Cat("layout.", View(st.message())));
    }
  }
  MOEPLAN_RETURN_IF_ERROR(CheckPipelineSteps(l));
  return absl::OkStatus();
}

// Sequence parallelism splits the tokens between the TP sub-blocks over tp.
absl::Status ValidateSequenceParallel(const ModelConfig& m, const Layout& l) {
  if (!l.sequence_parallel) return absl::OkStatus();
  if (l.tp < 2) {
    return Bad("layout.sequence_parallel", "splits the sequence over the TP group: needs tp >= 2",
               Cat("tp=", l.tp));
  }
  if (m.seq_length % (int64_t{l.tp} * l.cp) != 0) {
    return Bad("layout.sequence_parallel",
               "splits each sequence (each context-parallel chunk) over the TP group: "
               "seq_length must be divisible by tp*cp",
               Cat("seq_length=", m.seq_length, ", tp*cp=", int64_t{l.tp} * l.cp));
  }
  if (!m.IsDense() && l.family == Family::kPpMoe) {
    return Bad("layout.sequence_parallel",
               "ppmoe dispatches locally from tokens replicated over the TP group: use dpmoe or "
               "parm",
               "family=ppmoe");
  }
  return absl::OkStatus();
}

// Selective recomputation names modules the model has, and not with full.
absl::Status ValidateRecompute(const ModelConfig& m, const Layout& l) {
  if (l.recompute_modules == 0) return absl::OkStatus();
  if (l.recompute) {
    return Bad("layout.recompute_modules",
               "selective recomputation names modules; full recomputation (recompute) runs "
               "every one: give one of the two",
               "recompute=true");
  }
  if (l.recompute_modules >= (1u << kNumRecomputeModules)) {
    return Bad("layout.recompute_modules", "unknown module bits", Cat(int{l.recompute_modules}));
  }
  bool dense_block = false;
  for (int blk = 0; blk < m.num_layers && !dense_block; ++blk) dense_block = !m.IsMoeBlock(blk);
  // What each module needs the model to have.
  const bool has[kNumRecomputeModules] = {
      true, true, dense_block, !m.IsDense(), m.moe.SharedFfnSize() > 0, m.multi_latent_attention};
  static constexpr std::string_view kLacks[kNumRecomputeModules] = {
      "",
      "",
      "every layer is an MoE layer (mlp is a dense block's MLP)",
      "the model has no MoE layer",
      "the model has no shared experts",
      "the model has no multi-latent attention"};
  for (int i = 0; i < kNumRecomputeModules; ++i) {
    if ((l.recompute_modules & (1u << i)) && !has[i]) {
      return Bad("layout.recompute_modules", Cat("names a module the model lacks: ", kLacks[i]),
                 RecomputeModuleName(i));
    }
  }
  return absl::OkStatus();
}

// Context parallelism: Megatron-Core splits each sequence into 2*cp chunks,
// rank r holding chunks r and 2cp-1-r (an even share of the causal mask).
absl::Status ValidateContextParallel(const ModelConfig& m, const Layout& l) {
  if (l.cp == 1) return absl::OkStatus();
  if (m.seq_length % (2 * int64_t{l.cp}) != 0) {
    return Bad("layout.cp",
               "splits each sequence into 2*cp chunks (two per rank, balancing the causal mask): "
               "seq_length must be divisible by 2*cp",
               Cat("seq_length=", m.seq_length, ", cp=", l.cp));
  }
  if (!m.FusedAttention()) {
    return Bad("layout.cp",
               "runs attention as a ring of fused kernels: needs attention_backend flash or fused",
               Cat("cp=", l.cp));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view FamilyName(Family f) {
  switch (f) {
    case Family::kDpMoe:
      return "dpmoe";
    case Family::kPpMoe:
      return "ppmoe";
    case Family::kParm:
      return "parm";
  }
  return "unknown";
}

bool ParseFamily(std::string_view name, Family* out) {
  return internal::ParseByName(name, kAllFamilies, FamilyName, out);
}

std::string_view PipelineScheduleName(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::kGpipe:
      return "gpipe";
    case PipelineSchedule::k1F1B:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved";
    case PipelineSchedule::kDualPipe:
      return "dualpipe";
  }
  return "unknown";
}

bool ParsePipelineSchedule(std::string_view name, PipelineSchedule* out) {
  return internal::ParseByName(name, kAllPipelineSchedules, PipelineScheduleName, out);
}

std::string_view DispatcherName(Dispatcher d) {
  switch (d) {
    case Dispatcher::kDeepEp:
      return "deepep";
    case Dispatcher::kAllGather:
      return "allgather";
    case Dispatcher::kAllToAll:
      break;
  }
  return "alltoall";
}

bool DispatcherApplies(const ModelConfig& m, const Layout& l, Dispatcher d) {
  return d == Dispatcher::kAllToAll || (!m.IsDense() && l.ep >= 2 && l.family != Family::kPpMoe);
}

bool ParseDispatcher(std::string_view name, Dispatcher* out) {
  return internal::ParseByName(name, kAllDispatchers, DispatcherName, out);
}

std::string_view RecomputeModuleName(int i) {
  static constexpr std::string_view kNames[kNumRecomputeModules] = {
      "core_attn", "layernorm", "mlp", "moe_act", "shared_experts", "mla_up_proj"};
  return i >= 0 && i < kNumRecomputeModules ? kNames[i] : "unknown";
}

bool ParseRecomputeModule(std::string_view name, uint8_t* bit) {
  for (int i = 0; i < kNumRecomputeModules; ++i) {
    if (RecomputeModuleName(i) == name) {
      *bit = static_cast<uint8_t>(1u << i);
      return true;
    }
  }
  return false;
}

Family InferFamily(const Layout& l) {
  if (l.tp > 1 && int64_t{l.ep} * l.esp == l.tp) return Family::kPpMoe;
  if (l.esp == l.tp && l.ep < l.GradientRanks()) return Family::kDpMoe;
  // A folded expert grid: with sequence parallelism, ep * esp ranks per
  // expert replica, fewer than the stage's.
  const int64_t stage = int64_t{l.tp} * l.GradientRanks(), experts = int64_t{l.ep} * l.esp;
  if (l.sequence_parallel && experts < stage && stage % experts == 0) return Family::kDpMoe;
  return Family::kParm;
}

Layout ResolveLayout(const Layout& layout) {
  Layout l = layout;
  if (l.microbatches == 0) l.microbatches = l.pp;
  if (l.pp == 1) l.pipeline = PipelineSchedule::k1F1B;
  return l;
}

ModelConfig ModelForLayout(const ModelConfig& model, const Layout& l, int64_t micro_batch_size) {
  ModelConfig m = model;
  m.micro_batch_size = micro_batch_size;
  m.parallel = ParallelLayout{
      l.tp, l.ep, l.esp, l.GradientRanks(), l.pp, l.sequence_parallel, l.cp, l.tp_comm_overlap};
  if (l.cp > 1) m.seq_length /= l.cp;
  return m;
}

int64_t PipelineSteps(const Layout& l) {
  return int64_t{l.pp} * l.virtual_stages * l.microbatches * 2;
}

int64_t PipelineSpans(const Layout& l) {
  return int64_t{l.pp} * l.Chunks() * l.ChunkMicrobatches() * 4 + l.pp;
}

absl::Status CheckTimelineSpans(int64_t spans, size_t candidates, std::string_view remedy) {
  if (spans <= kMaxTimelineOps) return absl::OkStatus();
  return absl::ResourceExhaustedError(Cat("include_timeline: the pipelines of ", candidates,
                                          candidates == 1 ? " layout" : " layouts",
                                          " would hold up to ", spans, " spans, over the limit of ",
                                          kMaxTimelineOps, " per response; ", remedy));
}

absl::Status CheckPipelineSteps(const Layout& l) {
  const int64_t steps = PipelineSteps(l);
  if (steps <= kMaxPipelineSteps) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      Cat("layout: pp*virtual_stages*microbatches*2 = ", steps,
          " pipeline steps to simulate exceed the limit of ", kMaxPipelineSteps, " (pp=", l.pp,
          ", virtual_stages=", l.virtual_stages, ", microbatches=", l.microbatches,
          "); use fewer micro-batches or stages"));
}

namespace {

// Megatron-Core's communication overlaps and what each needs.
absl::Status ValidateOverlaps(const Layout& l) {
  if (l.tp_comm_overlap && !l.sequence_parallel) {
    return Bad("layout.tp_comm_overlap",
               "needs sequence parallelism (sp=1, tp >= 2): it overlaps the TP sub-blocks' "
               "AllGathers and ReduceScatters",
               Cat("tp=", l.tp, ", sp=0"));
  }
  if (l.overlap_param_gather && l.zero_stage != 1 && l.zero_stage != 2) {
    return Bad("layout.overlap_param_gather",
               "needs zero=1 or 2 (the distributed optimizer's parameter AllGathers)",
               Cat("zero=", l.zero_stage));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateLayout(const ModelConfig& m, const Layout& l, int64_t global_batch,
                            const ClusterShape& c) {
  MOEPLAN_RETURN_IF_ERROR(ValidateDegrees(m, l, c));
  // A dense model's family names nothing: no experts to place.
  if (!m.IsDense()) MOEPLAN_RETURN_IF_ERROR(ValidateFamily(l));
  MOEPLAN_RETURN_IF_ERROR(ValidatePipeline(m, l, global_batch));
  MOEPLAN_RETURN_IF_ERROR(ValidateOverlaps(l));
  MOEPLAN_RETURN_IF_ERROR(ValidateContextParallel(m, l));
  MOEPLAN_RETURN_IF_ERROR(ValidateRecompute(m, l));
  MOEPLAN_RETURN_IF_ERROR(ValidateSequenceParallel(m, l));
  // The MoE layer's own rules at one micro-batch (S1/S2 are checked per
  // schedule); the rest of the model's shape was checked before (model.h).
  const ModelConfig lm = ModelForLayout(m, l, global_batch / (int64_t{l.dp} * l.microbatches));
  return ValidateModelMoeLayer(lm);
}

namespace internal {

StageOptions ChunkOptions(const ModelConfig& m, const Layout& l, int stage, int chunk) {
  const bool dual = l.pipeline == PipelineSchedule::kDualPipe;
  const int v = dual ? 1 : std::max(1, l.virtual_stages);
  // Chunk i of n holds layers [i L / n, (i + 1) L / n): equal when n divides
  // L, else each chunk floor(L / n) or one more, spread evenly. DualPipe's
  // stages hold two of the pp segments each (DualPipeChunkOf).
  const int64_t n = int64_t{l.pp} * v, L = m.num_layers;
  const int index = dual ? DualPipeChunkOf(l.pp, stage, chunk).segment : chunk * l.pp + stage;
  StageOptions o;
  if (!l.stage_layers.empty()) {
    // A pipeline layout (ValidateLayout checked it has pp * v stages and
    // puts the MTP depths with the loss, which StageOptions::head plans).
    const PipelineStageLayers& s = l.stage_layers[static_cast<size_t>(index)];
    o.first_block = s.first_block;
    o.end_block = s.end_block;
    o.embed = s.embed;
    o.head = s.loss;
  } else {
    o.first_block = static_cast<int>(index * L / n);
    o.end_block = static_cast<int>((index + 1) * L / n);
    o.embed = index == 0;
    o.head = index == l.pp * v - 1;
  }
  o.local_dispatch = l.family == Family::kPpMoe && !m.IsDense();
  o.expert_replicas = l.ExpertReplicas();
  o.zero_stage = l.zero_stage;
  return o;
}

}  // namespace internal

}  // namespace moeplan::planner
