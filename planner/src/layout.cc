// Layouts, pipelines, the memory model and the layout search of docs/layouts.md.
#include "moeplan/planner/layout.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "field_rules.h"
#include "fmt/format.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/limits.h"
#include "moeplan/planner/schedules.h"
#include "moeplan/planner/validate.h"

namespace moeplan::planner {
namespace {

using internal::Bad;

constexpr int kMaxDegree = 1 << 20;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

absl::Status Degree(std::string_view field, int v) {
  if (v < 1 || v > kMaxDegree) return Bad(field, Cat("must be between 1 and ", kMaxDegree), Cat(v));
  return absl::OkStatus();
}

absl::Status MustDivide(std::string_view field, std::string_view what, int64_t d, int64_t n) {
  if (n % d == 0) return absl::OkStatus();
  return Bad(field, Cat("must divide ", what, " (", n, ")"), Cat(d));
}

std::string GiB(double bytes) { return fmt::format("{:.1f} GiB", bytes / kGiB); }

// The blocks of chunk `chunk` of stage `stage`: chunk c of stage s is model
// chunk c * pp + s (interleaved), each num_layers / (pp * v) blocks.
StageOptions ChunkOptions(const ModelConfig& m, const Layout& l, int stage, int chunk) {
  const int v = std::max(1, l.virtual_stages);
  const int per = m.num_layers / (l.pp * v);
  const int index = chunk * l.pp + stage;
  StageOptions o;
  o.first_block = index * per;
  o.end_block = o.first_block + per;
  o.embed = index == 0;
  o.head = index == l.pp * v - 1;
  o.local_dispatch = l.family == Family::kPpMoe;
  o.expert_replicas = l.ExpertReplicas();
  o.zero_stage = l.zero_stage;
  return o;
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
  for (Family f : kAllFamilies) {
    if (FamilyName(f) == name) {
      *out = f;
      return true;
    }
  }
  return false;
}

std::string_view PipelineScheduleName(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::kGpipe:
      return "gpipe";
    case PipelineSchedule::k1F1B:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved";
  }
  return "unknown";
}

bool ParsePipelineSchedule(std::string_view name, PipelineSchedule* out) {
  for (PipelineSchedule s : kAllPipelineSchedules) {
    if (PipelineScheduleName(s) == name) {
      *out = s;
      return true;
    }
  }
  return false;
}

Family InferFamily(const Layout& l) {
  if (l.tp > 1 && int64_t{l.ep} * l.esp == l.tp) return Family::kPpMoe;
  if (l.esp == l.tp && l.ep < l.dp) return Family::kDpMoe;
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
  m.parallel = ParallelLayout{l.tp, l.ep, l.esp, l.dp, l.pp};
  return m;
}

int64_t PipelineSteps(const Layout& l) {
  return int64_t{l.pp} * l.virtual_stages * l.microbatches * 2;
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

absl::Status ValidateLayout(const ModelConfig& m, const Layout& l, int64_t global_batch,
                            const ClusterShape& c) {
  MOEPLAN_RETURN_IF_ERROR(Degree("layout.dp", l.dp));
  MOEPLAN_RETURN_IF_ERROR(Degree("layout.tp", l.tp));
  MOEPLAN_RETURN_IF_ERROR(Degree("layout.pp", l.pp));
  MOEPLAN_RETURN_IF_ERROR(Degree("layout.ep", l.ep));
  MOEPLAN_RETURN_IF_ERROR(Degree("layout.esp", l.esp));
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
  if (m.moe.shared_expert_ffn_hidden_size > 0) {
    MOEPLAN_RETURN_IF_ERROR(MustDivide("layout.tp", "moe.shared_expert_ffn_hidden_size", l.tp,
                                       m.moe.shared_expert_ffn_hidden_size));
  }
  MOEPLAN_RETURN_IF_ERROR(MustDivide("layout.pp", "num_layers", l.pp, m.num_layers));
  MOEPLAN_RETURN_IF_ERROR(MustDivide("layout.ep", "moe.num_experts", l.ep, m.moe.num_experts));
  MOEPLAN_RETURN_IF_ERROR(
      MustDivide("layout.esp", "moe.expert_ffn_hidden_size", l.esp, m.moe.expert_ffn_hidden_size));
  const int64_t gpus = int64_t{l.dp} * l.tp * l.pp;
  if (gpus > c.TotalGpus()) {
    return Bad("layout", Cat("dp*tp*pp must be <= the GPUs (", c.TotalGpus(), ")"), Cat(gpus));
  }
  const int64_t stage = int64_t{l.dp} * l.tp;
  if (!(g % stage == 0 || stage % g == 0)) {
    return Bad(
        "layout",
        Cat("dp*tp (a stage's ranks) must divide gpus_per_node (", g, ") or be a multiple of it"),
        Cat(stage));
  }
  const int64_t experts = int64_t{l.ep} * l.esp;
  switch (l.family) {
    case Family::kDpMoe:
      if (l.esp != l.tp) {
        return Bad("layout.esp", "dpmoe shards each expert like the dense TP: must equal tp",
                   Cat("esp=", l.esp, ", tp=", l.tp));
      }
      if (l.dp % l.ep != 0) {
        return Bad("layout.ep",
                   "dpmoe spreads the experts over data-parallel ranks: must divide dp",
                   Cat("ep=", l.ep, ", dp=", l.dp));
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
        return Bad("layout.ep", "parm (MP+EP+ESP) needs ep*esp == tp*dp",
                   Cat("ep*esp=", experts, ", tp*dp=", stage));
      }
      if (l.tp % l.esp != 0) {
        return Bad("layout.esp",
                   "parm runs each expert shard on its TP group's tokens: must divide tp",
                   Cat("esp=", l.esp, ", tp=", l.tp));
      }
      break;
  }
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
    if (m.num_layers % (l.pp * v) != 0) {
      return Bad("layout.virtual_stages",
                 Cat("pp*virtual_stages must divide num_layers (", m.num_layers, ")"),
                 Cat("pp=", l.pp, ", virtual_stages=", v));
    }
    if (l.microbatches % l.pp != 0) {
      return Bad("layout.microbatches", "interleaved 1F1B needs a multiple of pp",
                 Cat("microbatches=", l.microbatches, ", pp=", l.pp));
    }
  } else if (v != 1) {
    return Bad("layout.virtual_stages", "must be 1 unless pipeline is interleaved", Cat(v));
  }
  MOEPLAN_RETURN_IF_ERROR(CheckPipelineSteps(l));
  // The MoE layer's own rules at one micro-batch (S1/S2 are checked per schedule).
  const ModelConfig lm = ModelForLayout(m, l, global_batch / (int64_t{l.dp} * l.microbatches));
  MOEPLAN_RETURN_IF_ERROR(ValidateModelShape(lm));
  return absl::OkStatus();
}

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

absl::Status ValidateSearchOptions(const SearchOptions& o) {
  if (o.top < 1 || o.top > 1000) return Bad("search.top", "must be between 1 and 1000", Cat(o.top));
  if (o.gpus < 0 || o.gpus > (1 << 20)) {
    return Bad("search.gpus", "must be between 1 and 2^20 (0: the profile's)", Cat(o.gpus));
  }
  for (int z : o.zero_stages) {
    if (z < 0 || z > 3) return Bad("search.zero_stages", "each must be 0, 1, 2 or 3", Cat(z));
  }
  if (o.max_microbatches < 1 || o.max_microbatches > 4096) {
    return Bad("search.max_microbatches", "must be between 1 and 4096", Cat(o.max_microbatches));
  }
  if (o.virtual_stages.empty()) return Bad("search.virtual_stages", "must not be empty", "[]");
  for (int v : o.virtual_stages) {
    if (v < 2 || v > 64)
      return Bad("search.virtual_stages", "each must be between 2 and 64", Cat(v));
  }
  return absl::OkStatus();
}

// ---------------- Memory ----------------

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

MemoryBreakdown StageMemory(const ModelConfig& model, const Layout& l, int64_t mbs, int stage,
                            double in_flight, const MemoryOptions& o) {
  const ModelConfig m = ModelForLayout(model, l, mbs);
  const int v = std::max(1, l.virtual_stages);
  MemoryBreakdown r;
  r.stage = stage;
  r.in_flight = in_flight;
  const double e = m.bytes_per_element;
  const double S = static_cast<double>(mbs) * m.seq_length;  // tokens per micro-batch
  const double M = static_cast<double>(m.hidden_size), t = l.tp;
  const double a = static_cast<double>(m.num_attention_heads), L = m.seq_length;
  const double E = static_cast<double>(m.moe.num_experts);
  const double cap = static_cast<double>(
      Capacity(m.moe.top_k, m.moe.capacity_factor, static_cast<int64_t>(S), m.moe.num_experts));
  // Rows a rank's experts hold: every token slot of the layer (E * T), or of
  // its own E/ep experts when the dispatch is local (PPMoE).
  const double rows = l.family == Family::kPpMoe ? E / l.ep * cap : E * cap;
  const double shard = static_cast<double>(m.moe.expert_ffn_hidden_size) / l.esp;
  RankParams params;
  double act = 0.0, largest_block = 0.0, buffers = 0.0;
  for (int c = 0; c < v; ++c) {
    const StageOptions so = ChunkOptions(m, l, stage, c);
    const RankParams p = StageParams(m, so);
    params.dense += p.dense;
    params.expert += p.expert;
    for (int blk = so.first_block; blk < so.end_block; ++blk) {
      // Korthikanti et al. 2022 (eq. 2, tensor parallel without sequence
      // parallelism), in 2-byte units: sbh(10 + 24/t) + 5as^2b/t; the MLP's
      // t-split 16sbh/t is replaced by the MoE's own tensors in MoE blocks.
      double block = S * M * (10.0 + 8.0 / t) + 5.0 * a * L * S / t;
      if (m.IsMoeBlock(blk)) {
        block += (S * E * 4.0 + rows * (M + 2.0 * shard) * e +
                  2.0 * S * static_cast<double>(m.moe.shared_expert_ffn_hidden_size) / t * e) /
                 (e / 2.0);
        buffers = std::max(buffers, 2.0 * rows * M * e);
      } else {
        block += 16.0 * S * M / t;
      }
      block *= e / 2.0;
      largest_block = std::max(largest_block, block);
      act += l.recompute ? S * M * e : block;
    }
    if (m.vocab_size > 0 && so.embed) act += S * M * e;
    if (m.vocab_size > 0 && so.head) act += S * static_cast<double>(m.vocab_size) / t * (e + 4.0);
  }
  r.activation_per_microbatch = act;
  r.activations = act * in_flight + (l.recompute ? largest_block : 0.0);
  r.capacity_buffers = buffers;
  const double pb = o.param_bytes > 0.0 ? o.param_bytes : e;
  const double dp = l.dp, edp = l.ExpertReplicas();
  auto held = [&](double bytes_per_param, int from_stage) {
    const bool sharded = l.zero_stage >= from_stage;
    return bytes_per_param *
           (params.dense / (sharded ? dp : 1.0) + params.expert / (sharded ? edp : 1.0));
  };
  r.params = held(pb, 3);
  r.grads = held(o.grad_bytes, 2);
  r.optimizer = held(o.optimizer_bytes, 1);
  r.total = r.params + r.grads + r.optimizer + r.activations + r.capacity_buffers;
  r.limit = std::max(0.0, o.gpu_memory_bytes);
  return r;
}

// ---------------- Pipelines ----------------

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

double InFlightMicrobatches(PipelineSchedule schedule, int p, int v, int m, int s) {
  int held = 0, peak = 0;
  for (const PipeStep& st : PipelineOrder(schedule, p, v, m, s)) {
    held += st.forward ? 1 : -1;
    peak = std::max(peak, held);
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

absl::Status SimulatePipeline(const PipelineSpec& spec, OpGraph* g, Simulator* sim,
                              SimResult* result, PipelineResult* out) {
  const int p = spec.stages, v = spec.chunks, m = spec.microbatches;
  if (p < 1 || v < 1 || m < 1 || static_cast<int>(spec.fwd_us.size()) != p * v ||
      static_cast<int>(spec.bwd_us.size()) != p * v ||
      (!spec.tail_us.empty() && static_cast<int>(spec.tail_us.size()) != p)) {
    return absl::InvalidArgumentError("pipeline: costs must have stages * chunks entries");
  }
  // Ids of each step's op and of the send after it: index ((s * v + c) * m + i) * 2 + fwd.
  auto idx = [&](int s, int c, int i, bool fwd) {
    return ((static_cast<size_t>(s) * v + c) * m + i) * 2 + (fwd ? 1 : 0);
  };
  std::vector<OpId> op_of(static_cast<size_t>(p) * v * m * 2, kNoOp);
  std::vector<OpId> send_of(op_of.size(), kNoOp);
  g->Clear();
  g->Reserve(static_cast<int>(op_of.size() * 2 + p), static_cast<int>(op_of.size() * 4));
  std::vector<OpId> last_of(static_cast<size_t>(p), kNoOp);
  const double p2p = p > 1 || v > 1 ? spec.p2p_us : 0.0;
  MOEPLAN_RETURN_IF_ERROR(WalkPipeline(spec.schedule, p, v, m, [&](int s, const PipeStep& st) {
    // The input: the previous chunk's send (forward) or the next one's (backward).
    OpId dep = kNoOp;
    if (st.forward) {
      if (s > 0) {
        dep = send_of[idx(s - 1, st.chunk, st.mb, true)];
      } else if (st.chunk > 0) {
        dep = send_of[idx(p - 1, st.chunk - 1, st.mb, true)];
      }
    } else if (s < p - 1) {
      dep = send_of[idx(s + 1, st.chunk, st.mb, false)];
    } else if (st.chunk < v - 1) {
      dep = send_of[idx(0, st.chunk + 1, st.mb, false)];
    } else {
      dep = op_of[idx(s, st.chunk, st.mb, true)];
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
    const size_t cs = static_cast<size_t>(s) * v + st.chunk;
    op.cost_us = st.forward ? spec.fwd_us[cs] : spec.bwd_us[cs];
    const OpId own_fwd = st.forward ? kNoOp : op_of[idx(s, st.chunk, st.mb, true)];
    const OpId id = g->Add(op, {dep, own_fwd});
    op_of[idx(s, st.chunk, st.mb, st.forward)] = id;
    last_of[static_cast<size_t>(s)] = id;
    const bool last_fwd = st.forward && s == p - 1 && st.chunk == v - 1;
    const bool first_bwd = !st.forward && s == 0 && st.chunk == 0;
    if (!last_fwd && !first_bwd) {
      Op send;
      send.base = st.forward ? "pipe.send_fwd" : "pipe.send_bwd";
      send.block = op.block;
      send.step = op.step;
      send.part = op.part;
      send.device = op.device;
      send.kind = OpKind::kComm;
      send.phase = op.phase;
      send.term = Term::kSendRecv;
      send.resources = spec.p2p_resource;
      send.cost_us = p2p;
      send_of[idx(s, st.chunk, st.mb, st.forward)] = g->Add(send, {id});
    }
  }));
  std::vector<OpId> bwd_last = last_of;
  for (int s = 0; s < p; ++s) {
    if (spec.tail_us.empty()) break;
    Op tail;
    tail.base = "pipe.tail";
    tail.block = static_cast<int16_t>(s);
    tail.device = static_cast<int16_t>(s);
    tail.phase = Phase::kBackward;
    tail.term = Term::kOptimizer;
    tail.resources = 0;
    tail.cost_us = spec.tail_us[static_cast<size_t>(s)];
    g->Add(tail, {last_of[static_cast<size_t>(s)]});
  }
  MOEPLAN_RETURN_IF_ERROR(sim->Run(*g, result));
  out->makespan_us = result->makespan_us;
  out->pipeline_end_us = 0.0;
  for (OpId id : bwd_last) {
    out->pipeline_end_us =
        std::max(out->pipeline_end_us, result->times[static_cast<size_t>(id)].end_us);
  }
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
  return absl::OkStatus();
}

// ---------------- Programs ----------------

namespace {

// What a chunk graph's op is in the program: part of every micro-batch's
// forward or backward, or of the chunk's tail (once per iteration).
enum class Role : uint8_t { kForward, kBackward, kTail };

Role RoleOf(const Op& op, int zero_stage) {
  if (op.term == Term::kOptimizer) return Role::kTail;
  // ZeRO 2-3 reduce-scatter each micro-batch's gradients as they come (the
  // buckets issued in the backward, "bwd."); 0-1 once the last one is in.
  if ((op.flags & kGradSync) && !(zero_stage >= 2 && op.base.substr(0, 4) == "bwd.")) {
    return Role::kTail;
  }
  return op.phase == Phase::kForward ? Role::kForward : Role::kBackward;
}

// A chunk graph read once: each op's role, the ops each step copies, and the
// step's roots (its first ops, which wait for the transfer feeding the step)
// and ends (what the transfer after it waits for).
struct ChunkShape {
  std::vector<Role> role;
  std::vector<OpId> ops[3];  // by role, in issue order
  std::vector<uint8_t> root;
  std::vector<OpId> ends[2];  // forward, backward
};

absl::Status ShapeOf(const OpGraph& g, int zero_stage, ChunkShape* out) {
  const int n = g.size();
  out->role.resize(static_cast<size_t>(n));
  out->root.assign(static_cast<size_t>(n), 0);
  std::vector<uint8_t> consumed(static_cast<size_t>(n), 0);
  for (OpId id = 0; id < n; ++id) {
    const Role r = RoleOf(g.op(id), zero_stage);
    out->role[static_cast<size_t>(id)] = r;
    out->ops[static_cast<size_t>(r)].push_back(id);
    bool root = r != Role::kTail && !(g.op(id).flags & kPrefetch);
    for (OpId d : g.deps(id)) {
      const Role dr = out->role[static_cast<size_t>(d)];
      if (dr == Role::kTail && r != Role::kTail) {
        return absl::InternalError(
            Cat("pipeline program: ", g.op(id).Name(), " waits for the tail op ", g.op(d).Name()));
      }
      if (r == Role::kForward && dr == Role::kBackward) {
        return absl::InternalError(Cat("pipeline program: the forward op ", g.op(id).Name(),
                                       " waits for the backward op ", g.op(d).Name()));
      }
      if (dr == r) {
        root = false;
        // What buckets and prefetches wait for still ends the phase's chain.
        if (!(g.op(id).flags & (kGradSync | kPrefetch))) consumed[static_cast<size_t>(d)] = 1;
      }
    }
    out->root[static_cast<size_t>(id)] = root;
  }
  // Ends: the ops of a phase nothing of it waits for, gradient buckets and
  // prefetches aside; backward weight gradients too unless they end the
  // chain (a chunk's input gradient is sent before its dW ops run).
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<OpId> ends, dw;
    for (OpId id : out->ops[phase]) {
      const Op& op = g.op(id);
      if (consumed[static_cast<size_t>(id)] || (op.flags & (kGradSync | kPrefetch))) continue;
      ((op.flags & kWeightGrad) ? dw : ends).push_back(id);
    }
    if (ends.empty()) ends = std::move(dw);
    if (ends.empty() && !out->ops[phase].empty()) {
      return absl::InternalError("pipeline program: a chunk phase has no last op");
    }
    out->ends[phase] = std::move(ends);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BuildPipelineProgram(const Layout& l, std::span<const OpGraph* const> chunks,
                                  const PipelineLinks& links, OpGraph* out) {
  const int p = l.pp, v = std::max(1, l.virtual_stages), m = l.microbatches;
  if (p < 1 || m < 1 || static_cast<int>(chunks.size()) != p * v) {
    return absl::InvalidArgumentError(
        Cat("pipeline program: needs pp * virtual_stages chunk graphs (got ", chunks.size(),
            " for pp=", p, ", virtual_stages=", v, ", microbatches=", m, ")"));
  }
  if (l.recompute) {
    return absl::InvalidArgumentError(
        "layout.recompute: programs with full activation recomputation are not built yet");
  }
  if (int64_t{p} * v * m * 2 > kMaxPipelineSteps) return CheckPipelineSteps(l);
  std::vector<ChunkShape> shapes(chunks.size());
  int64_t total = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    MOEPLAN_RETURN_IF_ERROR(ShapeOf(*chunks[k], l.zero_stage, &shapes[k]));
    total += int64_t{chunks[k]->size()} * m;
  }
  if (total > kMaxProgramOps) {
    return absl::ResourceExhaustedError(Cat("pipeline program: ", total,
                                            " ops exceed the limit of ", kMaxProgramOps,
                                            "; use fewer micro-batches or blocks"));
  }
  out->Clear();
  out->Reserve(static_cast<int>(total + 4 * int64_t{p} * v * m), static_cast<int>(total * 3));
  // The copy of chunk op `id` for micro-batch i of (stage, chunk): ids[(k * m + i)][id].
  std::vector<std::vector<OpId>> ids(chunks.size() * static_cast<size_t>(m));
  std::vector<std::vector<int16_t>> instances(ids.size());
  // The transfer each step waits for (forward, backward).
  std::vector<OpId> input(ids.size() * 2, kNoOp);
  auto slot = [&](int s, int c, int i) { return (static_cast<size_t>(s) * v + c) * m + i; };
  std::vector<OpId> deps;
  absl::Status error;
  auto stamp = [&](Op* op, int s, int c, int i) {
    op->flags |= kStaged;
    op->device = static_cast<int16_t>(s);
    op->chunk = static_cast<int8_t>(v > 1 ? c : -1);
    op->mb = static_cast<int16_t>(i);
  };
  // Copies ops of `role` of chunk (s, c) for micro-batch i (tail: i = m - 1's
  // maps, the copies without a micro-batch).
  auto copy = [&](int s, int c, int i, Role role) {
    const size_t k = static_cast<size_t>(s) * v + c;
    const OpGraph& g = *chunks[k];
    const ChunkShape& sh = shapes[k];
    std::vector<OpId>& map = ids[slot(s, c, i)];
    if (map.empty()) map.assign(static_cast<size_t>(g.size()), kNoOp);
    std::vector<int16_t>& inst = instances[slot(s, c, i)];
    if (inst.empty()) inst.assign(g.layers().size() + 1, 0);
    const OpId in =
        role == Role::kTail ? kNoOp : input[slot(s, c, i) * 2 + (role == Role::kForward)];
    for (OpId id : sh.ops[static_cast<size_t>(role)]) {
      deps.clear();
      for (OpId d : g.deps(id)) {
        const OpId nd = map[static_cast<size_t>(d)];
        if (nd == kNoOp && error.ok()) {
          error = absl::InternalError(Cat("pipeline program: ", g.op(id).Name(),
                                          " issued before its dependency ", g.op(d).Name()));
        }
        deps.push_back(nd);
      }
      if (sh.root[static_cast<size_t>(id)] && in != kNoOp) deps.push_back(in);
      Op op = g.op(id);
      stamp(&op, s, c, role == Role::kTail ? -1 : i);
      OpExec x = g.exec(id);
      if (x.layer > 0) {
        int16_t& mine = inst[static_cast<size_t>(x.layer)];
        if (mine == 0) {
          ExecLayer el = g.layers()[static_cast<size_t>(x.layer - 1)];
          el.mb = static_cast<int16_t>(i);
          if (out->layers().size() >= static_cast<size_t>(INT16_MAX) && error.ok()) {
            error = absl::ResourceExhaustedError(
                "pipeline program: more than 32767 MoE layer instances; use fewer "
                "micro-batches or blocks");
          }
          mine = out->AddLayer(el);
        }
        x.layer = mine;
      }
      map[static_cast<size_t>(id)] = out->Add(op, deps, x);
    }
  };
  auto transfer = [&](int s, const PipeStep& st) {
    const bool fwd = st.forward;
    int ds = s, dc = st.chunk;
    if (fwd) {
      if (s < p - 1) {
        ds = s + 1;
      } else if (st.chunk < v - 1) {
        ds = 0;
        dc = st.chunk + 1;
      } else {
        return;  // the last chunk's forward: its backward follows on this stage
      }
    } else if (s > 0) {
      ds = s - 1;
    } else if (st.chunk > 0) {
      ds = p - 1;
      dc = st.chunk - 1;
    } else {
      return;  // the first chunk's backward: the end of the micro-batch
    }
    const size_t k = static_cast<size_t>(s) * v + st.chunk;
    const std::vector<OpId>& map = ids[slot(s, st.chunk, st.mb)];
    deps.clear();
    for (OpId e : shapes[k].ends[fwd ? 0 : 1]) deps.push_back(map[static_cast<size_t>(e)]);
    Op send;
    send.base = fwd ? "pipe.send_fwd" : "pipe.send_bwd";
    send.kind = OpKind::kComm;
    send.phase = fwd ? Phase::kForward : Phase::kBackward;
    send.term = Term::kSendRecv;
    send.resources = links.send_resources;
    send.cost_us = links.send_us;
    send.bytes = links.bytes;
    send.inter_node_bytes = links.send_resources & kInter ? links.bytes : 0;
    stamp(&send, s, st.chunk, st.mb);
    OpExec sx;
    sx.kind = ExecKind::kSendRecv;
    sx.group = s % 2 == 0 ? ExecGroup::kPpEven : ExecGroup::kPpOdd;
    sx.parts = ds;
    sx.count = links.elements;
    input[slot(ds, dc, st.mb) * 2 + (fwd ? 1 : 0)] = out->Add(send, deps, sx);
  };
  // With tp > 1 the receiving TP group gathers a transfer's pieces first
  // thing in the step that uses them: issued there, not with the send, it
  // never holds the receiver's link ahead of the receiver's earlier work.
  auto gather = [&](int s, const PipeStep& st) {
    OpId& in = input[slot(s, st.chunk, st.mb) * 2 + (st.forward ? 1 : 0)];
    if (links.tp <= 1 || in == kNoOp) return;
    Op op;
    op.base = st.forward ? "pipe.gather_fwd" : "pipe.gather_bwd";
    op.kind = OpKind::kComm;
    op.phase = st.forward ? Phase::kForward : Phase::kBackward;
    op.term = Term::kAllGather;
    op.resources = kIntra;
    op.cost_us = links.gather_us;
    op.bytes = links.bytes;
    stamp(&op, s, st.chunk, st.mb);
    OpExec x;
    x.kind = ExecKind::kAllGather;
    x.group = ExecGroup::kMp;
    x.count = links.elements;
    in = out->Add(op, {in}, x);
  };
  MOEPLAN_RETURN_IF_ERROR(WalkPipeline(l.pipeline, p, v, m, [&](int s, const PipeStep& st) {
    gather(s, st);
    copy(s, st.chunk, st.mb, st.forward ? Role::kForward : Role::kBackward);
    transfer(s, st);
  }));
  for (int s = 0; s < p; ++s) {
    for (int c = 0; c < v; ++c) copy(s, c, m - 1, Role::kTail);
  }
  MOEPLAN_RETURN_IF_ERROR(error);
  for (const OpGraph* g : chunks) {
    for (const BufAlias& a : g->aliases()) out->Alias(a);
  }
  return absl::OkStatus();
}

bool RunsOnStage(const OpGraph& program, OpId id, int stage) {
  if (program.op(id).device == stage) return true;
  const OpExec& x = program.exec(id);
  return x.kind == ExecKind::kSendRecv && x.parts == stage;
}

// ---------------- Evaluation and search ----------------

namespace {

// A planned chunk: per-micro-batch forward and backward, its tail, the best
// variant and the critical-path terms per micro-batch.
struct ChunkTimes {
  double fwd = 0.0, bwd = 0.0, tail = 0.0;
  double grad_sync = 0.0, optimizer = 0.0;
  std::array<double, kNumTerms> fwd_terms{}, bwd_terms{};
  Variant variant = Variant::kNone;
  Schedule schedule = Schedule::kDefault;
  AllToAllAlgo algo = AllToAllAlgo::kLinear;
};

struct ChunkKey {
  int64_t mbs;
  int tp, dp, ep, esp, edp, zero, blocks, phase;
  uint8_t family;
  bool embed, head;
  friend bool operator==(const ChunkKey&, const ChunkKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ChunkKey& k) {
    return H::combine(std::move(h), k.mbs, k.tp, k.dp, k.ep, k.esp, k.edp, k.zero, k.blocks,
                      k.phase, k.family, k.embed, k.head);
  }
};

bool IsComm(Term t) {
  return t == Term::kAllToAll || t == Term::kAllGather || t == Term::kReduceScatter ||
         t == Term::kAllReduce || t == Term::kSendRecv;
}

}  // namespace

struct LayoutPlanner::Impl {
  explicit Impl(const CostModel& c) : cost(c), planner(c) {}
  const CostModel& cost;
  ModelPlanner planner;
  ModelPlan plan;
  absl::flat_hash_map<ChunkKey, ChunkTimes> cache;
  absl::flat_hash_map<ChunkKey, ModelPlanner::StageBound> bounds;
  OpGraph pipe_graph;
  Simulator pipe_sim;
  SimResult pipe_result;
  SearchStats* stats = nullptr;
  ModelPlanOptions plan_options;

  ChunkKey KeyOf(const ModelConfig& model, const Layout& l, int64_t mbs, const StageOptions& so,
                 int zero) const {
    return ChunkKey{mbs,
                    l.tp,
                    l.dp,
                    l.ep,
                    l.esp,
                    l.ExpertReplicas(),
                    zero,
                    so.end_block - so.first_block,
                    so.first_block % model.moe.layer_freq,
                    static_cast<uint8_t>(l.family),
                    so.embed,
                    so.head};
  }

  absl::StatusOr<ChunkTimes> Chunk(const ModelConfig& model, const Layout& l, int64_t mbs,
                                   int stage, int chunk) {
    const StageOptions so = ChunkOptions(model, l, stage, chunk);
    if (auto it = cache.find(KeyOf(model, l, mbs, so, l.zero_stage)); it != cache.end()) {
      if (stats) ++stats->stage_cache_hits;
      return it->second;
    }
    if (stats) ++stats->stage_plans;
    const ModelConfig m = ModelForLayout(model, l, mbs);
    ModelPlanOptions opt = plan_options;
    if (l.family == Family::kDpMoe) opt.schedules = {Schedule::kDefault};
    MOEPLAN_RETURN_IF_ERROR(planner.PlanStage(m, opt, so, &plan));
    const VariantPlan& vp = plan.variants[static_cast<size_t>(plan.best)];
    // ZeRO 1 and 2 build the same graph (reduce-scatter buckets, gathers after
    // the step); 2 only counts the buckets as part of every micro-batch's backward.
    for (int z : {l.zero_stage, l.zero_stage == 1 ? 2 : l.zero_stage == 2 ? 1 : -1}) {
      if (z >= 0) cache.emplace(KeyOf(model, l, mbs, so, z), Times(vp, z >= 2));
    }
    return cache.find(KeyOf(model, l, mbs, so, l.zero_stage))->second;
  }

  // A planned chunk's times; `sync_in_backward`: its gradient buckets end its backward.
  static ChunkTimes Times(const VariantPlan& vp, bool sync_in_backward) {
    ChunkTimes t;
    t.variant = vp.variant;
    t.schedule = vp.schedule;
    t.algo = vp.algo;
    const OpGraph& g = vp.graph;
    const SimResult& r = vp.sim;
    double bwd_end = r.forward_end_us, sync_end = 0.0;
    for (OpId id = 0; id < g.size(); ++id) {
      const Op& op = g.op(id);
      const double end = r.times[static_cast<size_t>(id)].end_us;
      if (op.term == Term::kOptimizer) continue;
      if (op.flags & kGradSync) {
        if (op.base.substr(0, 4) == "bwd.") {
          sync_end = std::max(sync_end, end);
        }
        continue;
      }
      bwd_end = std::max(bwd_end, end);
    }
    if (sync_in_backward) bwd_end = std::max(bwd_end, sync_end);
    t.fwd = r.forward_end_us;
    t.bwd = bwd_end - t.fwd;
    t.tail = std::max(0.0, r.makespan_us - bwd_end);
    for (OpId id : r.critical_path) {
      const Op& op = g.op(id);
      const OpTime& time = r.times[static_cast<size_t>(id)];
      if (time.end_us <= t.fwd + 1e-9) {
        t.fwd_terms[static_cast<size_t>(op.term)] += op.cost_us;
      } else if (time.end_us <= bwd_end + 1e-9) {
        t.bwd_terms[static_cast<size_t>(op.term)] += op.cost_us;
      } else if (op.term == Term::kOptimizer) {
        t.optimizer += op.cost_us;
      } else {
        t.grad_sync += op.cost_us;
      }
    }
    return t;
  }

  // The time of one micro-batch's activation (or gradient) to the next stage:
  // each TP rank sends its 1/tp (Megatron-LM's scatter-gather), across nodes
  // once a stage fills a node, and the receiving TP group AllGathers the
  // pieces (inside its node). Both are charged to the send, which holds the
  // sender's link.
  PipelineLinks Links(const ModelConfig& model, const Layout& l, int64_t mbs) const {
    const int g = cost.profile().shape.gpus_per_node;
    const bool across = int64_t{l.dp} * l.tp >= g;
    const double bytes = static_cast<double>(mbs) * model.seq_length * model.hidden_size *
                         model.bytes_per_element / l.tp;
    PipelineLinks k;
    k.elements = mbs * model.seq_length * model.hidden_size / l.tp;
    k.bytes = static_cast<int64_t>(bytes);
    k.send_us = cost.CollectiveUs(Collective::kSendRecv, GroupShape{2, across ? 2 : 1}, bytes);
    k.send_resources = across ? kInter : kIntra;
    k.tp = l.tp;
    k.gather_us = cost.CollectiveUs(Collective::kAllGather, GroupShape{l.tp, 1}, bytes);
    return k;
  }
  void P2p(const ModelConfig& model, const Layout& l, int64_t mbs, PipelineSpec* spec) const {
    const PipelineLinks k = Links(model, l, mbs);
    spec->p2p_us = k.send_us + k.gather_us;
    spec->p2p_resource = k.send_resources;
  }

  // Evaluates a validated layout with `mbs` sequences per micro-batch.
  absl::Status Run(const ModelConfig& model, const Layout& l, int64_t mbs, const MemoryOptions& mem,
                   LayoutCandidate* out) {
    const int p = l.pp, v = std::max(1, l.virtual_stages), m = l.microbatches;
    PipelineSpec spec;
    spec.schedule = l.pipeline;
    spec.stages = p;
    spec.chunks = v;
    spec.microbatches = m;
    spec.fwd_us.assign(static_cast<size_t>(p * v), 0.0);
    spec.bwd_us.assign(static_cast<size_t>(p * v), 0.0);
    spec.tail_us.assign(static_cast<size_t>(p), 0.0);
    std::vector<ChunkTimes> chunks(static_cast<size_t>(p * v));
    for (int s = 0; s < p; ++s) {
      for (int c = 0; c < v; ++c) {
        MOEPLAN_ASSIGN_OR_RETURN(ChunkTimes t, Chunk(model, l, mbs, s, c));
        const size_t i = static_cast<size_t>(s) * v + c;
        spec.fwd_us[i] = t.fwd;
        // Full recomputation runs the chunk's forward again before its backward.
        spec.bwd_us[i] = t.bwd + (l.recompute ? t.fwd : 0.0);
        spec.tail_us[static_cast<size_t>(s)] += t.tail;
        chunks[i] = t;
      }
    }
    P2p(model, l, mbs, &spec);
    PipelineResult pr;
    MOEPLAN_RETURN_IF_ERROR(SimulatePipeline(spec, &pipe_graph, &pipe_sim, &pipe_result, &pr));
    if (stats) ++stats->simulated;

    out->layout = l;
    out->micro_batch_size = mbs;
    out->iteration_us = pr.makespan_us;
    const double tokens = static_cast<double>(model.GlobalBatch()) * model.seq_length;
    out->tokens_per_s_per_gpu = tokens / (pr.makespan_us * 1e-6) / l.Gpus();
    out->bubble_us = pr.bubble_us;
    out->bubble_fraction = pr.makespan_us > 0.0 ? pr.bubble_us / pr.makespan_us : 0.0;
    // Breakdown: the busiest stage's chunks.
    const int s = pr.busiest_stage;
    std::array<double, kNumTerms> terms{};
    out->compute_us = out->grad_sync_us = out->optimizer_us = 0.0;
    out->stage_forward_us = out->stage_backward_us = 0.0;
    for (int c = 0; c < v; ++c) {
      const ChunkTimes& t = chunks[static_cast<size_t>(s) * v + c];
      for (int k = 0; k < kNumTerms; ++k) {
        terms[static_cast<size_t>(k)] +=
            m * (t.fwd_terms[static_cast<size_t>(k)] * (l.recompute ? 2.0 : 1.0) +
                 t.bwd_terms[static_cast<size_t>(k)]);
      }
      out->grad_sync_us += t.grad_sync;
      out->optimizer_us += t.optimizer;
      out->stage_forward_us += t.fwd;
      out->stage_backward_us += spec.bwd_us[static_cast<size_t>(s) * v + c];
      if (c == 0) {
        out->variant = t.variant;
        out->schedule = t.schedule;
        out->algo = t.algo;
      }
    }
    out->exposed_comm.clear();
    for (int k = 0; k < kNumTerms; ++k) {
      const Term term = static_cast<Term>(k);
      if (IsComm(term)) {
        if (terms[static_cast<size_t>(k)] > 0.0) {
          out->exposed_comm.push_back({term, terms[static_cast<size_t>(k)]});
        }
      } else if (term != Term::kOptimizer) {
        out->compute_us += terms[static_cast<size_t>(k)];
      }
    }
    // Memory: the stage that needs the most.
    out->memory = MemoryBreakdown{};
    for (int st = 0; st < p; ++st) {
      const MemoryBreakdown mb =
          StageMemory(model, l, mbs, st, InFlightMicrobatches(l.pipeline, p, v, m, st), mem);
      if (st == 0 || mb.total > out->memory.total) out->memory = mb;
    }
    out->feasible = out->memory.fits();
    out->infeasible_reason = out->memory.OverReason();
    return absl::OkStatus();
  }

  // Two lower bounds, the larger kept. (1) The pipeline simulated with each
  // chunk's lower bounds (StageComputeBound) and the exact p2p: simulated
  // times only grow with op costs. (2) Each stage's load: a chunk's planned
  // iteration (forward, backward and tail) holds every resource r for at
  // least F_r + B_r + G_r (its gradient synchronisation and optimizer), its
  // forward and backward last at least F_r and B_r, and the stage runs m of
  // each before its tail: m (F_r + B_r) + G_r per chunk, for every r.
  absl::StatusOr<double> Bound(const ModelConfig& model, const Layout& l, int64_t mbs) {
    const int p = l.pp, v = std::max(1, l.virtual_stages);
    PipelineSpec spec;
    spec.schedule = l.pipeline;
    spec.stages = p;
    spec.chunks = v;
    spec.microbatches = l.microbatches;
    spec.fwd_us.assign(static_cast<size_t>(p * v), 0.0);
    spec.bwd_us.assign(static_cast<size_t>(p * v), 0.0);
    spec.tail_us.assign(static_cast<size_t>(p), 0.0);
    const size_t zc = l.zero_stage == 0 ? 0 : l.zero_stage <= 2 ? 1 : 2;
    const double m = l.microbatches;
    double load = 0.0;
    for (int st = 0; st < p; ++st) {
      double stage_load = 0.0;
      for (int c = 0; c < v; ++c) {
        const StageOptions so = ChunkOptions(model, l, st, c);
        const ChunkKey key =
            KeyOf(model, l, mbs, so, /*zero=*/0);  // the bounds hold for every stage
        ModelPlanner::StageBound b;
        if (auto it = bounds.find(key); it != bounds.end()) {
          b = it->second;
        } else {
          ModelPlanOptions opt = plan_options;
          if (l.family == Family::kDpMoe) opt.schedules = {Schedule::kDefault};
          MOEPLAN_RETURN_IF_ERROR(
              planner.StageComputeBound(ModelForLayout(model, l, mbs), opt, so, &b));
          bounds.emplace(key, b);
        }
        const size_t i = static_cast<size_t>(st) * v + c;
        spec.fwd_us[i] = b.fwd_us;
        spec.bwd_us[i] = b.bwd_us + (l.recompute ? b.fwd_us : 0.0);
        spec.tail_us[static_cast<size_t>(st)] +=
            l.zero_stage >= 1 ? b.sharded_optimizer_us : b.optimizer_us;
        double chunk_load = 0.0;
        for (size_t r = 0; r < kNumResources; ++r) {
          const double f = b.fwd_res[r] * (l.recompute ? 2.0 : 1.0);
          chunk_load = std::max(chunk_load, m * (f + b.bwd_res[r]) + b.sync_res[zc][r]);
        }
        stage_load += chunk_load;
      }
      load = std::max(load, stage_load);
    }
    P2p(model, l, mbs, &spec);
    PipelineResult pr;
    MOEPLAN_RETURN_IF_ERROR(SimulatePipeline(spec, &pipe_graph, &pipe_sim, &pipe_result, &pr));
    return std::max(pr.makespan_us, load);
  }

  void Begin(const ModelConfig& model, const ModelPlanOptions& options) {
    // The caches hold chunks of one (model, options); a new call starts afresh.
    cache.clear();
    bounds.clear();
    plan_options = options;
  }
};

LayoutPlanner::LayoutPlanner(const CostModel& cost) : impl_(std::make_unique<Impl>(cost)) {}
LayoutPlanner::~LayoutPlanner() = default;
LayoutPlanner::LayoutPlanner(LayoutPlanner&&) noexcept = default;

namespace {

MemoryOptions Resolve(const MemoryOptions& o, const ClusterProfile& profile) {
  MemoryOptions r = o;
  if (r.gpu_memory_bytes < 0.0) r.gpu_memory_bytes = profile.gpu_memory_gib * kGiB;
  return r;
}

// A layout evaluated on its own: resolved (ResolveLayout) and the checks of
// ValidateLayout on as many nodes of the profile's size as it spans (like
// --gpus of the search).
absl::StatusOr<Layout> OneLayout(const ModelConfig& model, const Layout& layout,
                                 const ClusterShape& shape) {
  const Layout l = ResolveLayout(layout);
  const int64_t nodes =
      (int64_t{l.dp} * l.tp * l.pp + shape.gpus_per_node - 1) / shape.gpus_per_node;
  const ClusterShape cluster{static_cast<int>(std::clamp<int64_t>(nodes, shape.nodes, 1 << 20)),
                             shape.gpus_per_node};
  MOEPLAN_RETURN_IF_ERROR(ValidateLayout(model, l, model.GlobalBatch(), cluster));
  return l;
}

}  // namespace

absl::Status LayoutPlanner::Evaluate(const ModelConfig& model, const Layout& layout,
                                     const ModelPlanOptions& plan, const MemoryOptions& memory,
                                     LayoutCandidate* out) {
  Impl& s = *impl_;
  MOEPLAN_RETURN_IF_ERROR(ValidateModelShape(model));
  MOEPLAN_RETURN_IF_ERROR(ValidateModelPlanOptions(plan));
  MOEPLAN_RETURN_IF_ERROR(ValidateMemoryOptions(memory));
  MOEPLAN_ASSIGN_OR_RETURN(const Layout l, OneLayout(model, layout, s.cost.profile().shape));
  const int64_t global = model.GlobalBatch();
  s.Begin(model, plan);
  s.stats = nullptr;
  const int64_t mbs = global / (int64_t{l.dp} * l.microbatches);
  return s.Run(model, l, mbs, Resolve(memory, s.cost.profile()), out);
}

absl::Status LayoutPlanner::Program(const ModelConfig& model, const Layout& layout,
                                    const ModelPlanOptions& plan, VariantPlan* out) {
  Impl& s = *impl_;
  MOEPLAN_RETURN_IF_ERROR(ValidateModelShape(model));
  MOEPLAN_RETURN_IF_ERROR(ValidateModelPlanOptions(plan));
  MOEPLAN_ASSIGN_OR_RETURN(const Layout l, OneLayout(model, layout, s.cost.profile().shape));
  const int p = l.pp, v = std::max(1, l.virtual_stages);
  const int64_t mbs = model.GlobalBatch() / (int64_t{l.dp} * l.microbatches);
  const ModelConfig m = ModelForLayout(model, l, mbs);
  ModelPlanOptions opt = plan;
  if (l.family == Family::kDpMoe) opt.schedules = {Schedule::kDefault};
  std::vector<VariantPlan> chunks(static_cast<size_t>(p * v));
  std::vector<const OpGraph*> graphs(chunks.size());
  *out = VariantPlan{};
  for (int st = 0; st < p; ++st) {
    for (int c = 0; c < v; ++c) {
      MOEPLAN_RETURN_IF_ERROR(s.planner.PlanStage(m, opt, ChunkOptions(model, l, st, c), &s.plan));
      const size_t k = static_cast<size_t>(st) * v + c;
      chunks[k] = std::move(s.plan.variants[static_cast<size_t>(s.plan.best)]);
      graphs[k] = &chunks[k].graph;
      for (const MoeLayerChoice& choice : chunks[k].layers) out->layers.push_back(choice);
    }
  }
  std::sort(out->layers.begin(), out->layers.end(),
            [](const MoeLayerChoice& a, const MoeLayerChoice& b) { return a.block < b.block; });
  const PipelineLinks links = s.Links(model, l, mbs);
  MOEPLAN_RETURN_IF_ERROR(BuildPipelineProgram(l, graphs, links, &out->graph));
  MOEPLAN_RETURN_IF_ERROR(s.pipe_sim.Run(out->graph, &out->sim));
  out->variant = chunks[0].variant;
  out->schedule = chunks[0].schedule;
  out->algo = chunks[0].algo;
  out->tutel_degree = chunks[0].tutel_degree;
  return absl::OkStatus();
}

absl::Status LayoutPlanner::Search(const ModelConfig& model, const SearchOptions& options,
                                   const ModelPlanOptions& plan, const MemoryOptions& memory,
                                   LayoutSearchResult* out) {
  Impl& s = *impl_;
  MOEPLAN_RETURN_IF_ERROR(ValidateModelShape(model));
  MOEPLAN_RETURN_IF_ERROR(ValidateModelPlanOptions(plan));
  MOEPLAN_RETURN_IF_ERROR(ValidateMemoryOptions(memory));
  MOEPLAN_RETURN_IF_ERROR(ValidateSearchOptions(options));
  const ClusterShape& shape = s.cost.profile().shape;
  const int g = shape.gpus_per_node;
  const int gpus = options.gpus > 0 ? options.gpus : shape.TotalGpus();
  if (gpus % g != 0 && g % gpus != 0) {
    return Bad("search.gpus", Cat("must divide gpus_per_node (", g, ") or be a multiple of it"),
               Cat(gpus));
  }
  const ClusterShape cluster{std::max(1, gpus / g), g};
  const MemoryOptions mem = Resolve(memory, s.cost.profile());
  const int64_t global = model.GlobalBatch();
  s.Begin(model, plan);
  *out = LayoutSearchResult{};
  out->gpus = gpus;
  out->global_batch = global;
  SearchStats& st = out->stats;
  s.stats = &st;

  auto divisors = [](int64_t n, int64_t max) {
    std::vector<int> d;
    for (int64_t i = 1; i <= std::min(n, max); ++i) {
      if (n % i == 0) d.push_back(static_cast<int>(i));
    }
    return d;
  };
  std::vector<Family> families = options.families;
  if (families.empty()) families.assign(std::begin(kAllFamilies), std::end(kAllFamilies));
  std::vector<PipelineSchedule> pipelines = options.pipelines;
  if (pipelines.empty()) {
    pipelines.assign(std::begin(kAllPipelineSchedules), std::end(kAllPipelineSchedules));
  }
  std::vector<int> zeros = options.zero_stages;
  if (zeros.empty()) zeros = {0, 1, 2, 3};

  // Every valid (dp, tp, pp, ep, esp, family).
  const bool has_parm = std::count(families.begin(), families.end(), Family::kParm) > 0;
  std::vector<Layout> layouts;
  for (int tp : divisors(g, g)) {
    for (int pp : divisors(model.num_layers, gpus / tp)) {
      if (gpus % (tp * pp) != 0) continue;
      const int dp = gpus / (tp * pp);
      for (Family f : families) {
        std::vector<std::pair<int, int>> experts;  // (ep, esp)
        switch (f) {
          case Family::kDpMoe:
            for (int ep : divisors(dp, dp)) {
              // ep = dp is parm's esp = tp (which also tries S1 and S2): one name for it.
              if (ep == dp && has_parm) continue;
              experts.push_back({ep, tp});
            }
            break;
          case Family::kPpMoe:
            if (tp == 1) break;  // no TP group to spread the experts over
            for (int ep : divisors(tp, tp)) experts.push_back({ep, tp / ep});
            break;
          case Family::kParm:
            // Each expert shard runs on its TP group's tokens: esp | tp.
            for (int esp : divisors(tp, tp)) experts.push_back({tp * dp / esp, esp});
            break;
        }
        for (auto [ep, esp] : experts) {
          Layout l;
          l.dp = dp;
          l.tp = tp;
          l.pp = pp;
          l.ep = ep;
          l.esp = esp;
          l.family = f;
          l.microbatches = 1;
          if (global % dp != 0) continue;
          if (!ValidateLayout(model, l, global, cluster).ok()) continue;
          layouts.push_back(l);
        }
      }
    }
  }

  // Every (layout, zero, pipeline, v, m) candidate, memory-checked first.
  struct Pending {
    Layout layout;
    int64_t mbs;
    double bound = 0.0;
  };
  std::vector<Pending> pending;
  for (const Layout& base : layouts) {
    const int64_t per_replica = global / base.dp;
    for (int m : divisors(per_replica, options.max_microbatches)) {
      // One stage: more micro-batches only save memory; take the fewest that fit.
      for (int z : zeros) {
        for (PipelineSchedule ps : pipelines) {
          if (base.pp == 1 && ps != PipelineSchedule::k1F1B) continue;
          std::vector<int> vs = {1};
          if (ps == PipelineSchedule::kInterleaved) vs = options.virtual_stages;
          for (int v : vs) {
            Layout l = base;
            l.microbatches = m;
            l.zero_stage = z;
            l.pipeline = ps;
            l.virtual_stages = v;
            if (ps == PipelineSchedule::kInterleaved &&
                (base.pp < 2 || m % base.pp != 0 || model.num_layers % (base.pp * v) != 0)) {
              continue;
            }
            if (++st.enumerated > kMaxSearchCandidates) {
              return absl::ResourceExhaustedError(
                  Cat("search: more than ", kMaxSearchCandidates,
                      " candidate layouts to enumerate; narrow search.gpus, search.families, "
                      "search.pipelines, search.zero_stages or search.max_microbatches"));
            }
            if (PipelineSteps(l) > kMaxPipelineSteps) {
              ++st.over_limit;
              continue;
            }
            const int64_t mbs = per_replica / m;
            bool fits = false;
            for (bool rc : {false, true}) {
              l.recompute = rc;
              bool ok = true;
              for (int stage = 0; stage < l.pp && ok; ++stage) {
                ok = StageMemory(model, l, mbs, stage, InFlightMicrobatches(ps, l.pp, v, m, stage),
                                 mem)
                         .fits();
              }
              if (ok) {
                fits = true;
                break;
              }
            }
            if (!fits) {
              ++st.pruned_memory;
              continue;
            }
            pending.push_back({l, mbs, 0.0});
          }
        }
      }
    }
  }
  // Lower bounds: the pipeline simulated with each chunk's compute alone (no
  // communication, tails or p2p). Simulated times only grow with op costs, so
  // no candidate can beat its bound; candidates are evaluated in bound order
  // until the N-th best found is no slower than the next bound.
  for (Pending& c : pending) {
    MOEPLAN_RETURN_IF_ERROR(plan.deadline.Check("search"));
    MOEPLAN_ASSIGN_OR_RETURN(c.bound, s.Bound(model, c.layout, c.mbs));
  }
  std::stable_sort(pending.begin(), pending.end(),
                   [](const Pending& a, const Pending& b) { return a.bound < b.bound; });
  std::vector<LayoutCandidate> ranked;
  const auto slower = [](const LayoutCandidate& a, const LayoutCandidate& b) {
    return a.iteration_us < b.iteration_us;
  };
  for (size_t i = 0; i < pending.size(); ++i) {
    const Pending& c = pending[i];
    if (!options.exhaustive && static_cast<int>(ranked.size()) >= options.top &&
        c.bound >= ranked[static_cast<size_t>(options.top) - 1].iteration_us) {
      st.pruned_bound += static_cast<int64_t>(pending.size() - i);
      break;
    }
    MOEPLAN_RETURN_IF_ERROR(plan.deadline.Check("search"));
    LayoutCandidate cand;
    MOEPLAN_RETURN_IF_ERROR(s.Run(model, c.layout, c.mbs, mem, &cand));
    if (!cand.feasible) continue;
    ranked.insert(std::upper_bound(ranked.begin(), ranked.end(), cand, slower), std::move(cand));
    if (static_cast<int>(ranked.size()) > options.top) ranked.pop_back();
  }
  out->candidates = std::move(ranked);
  s.stats = nullptr;
  return absl::OkStatus();
}

}  // namespace moeplan::planner
