// FormatModelTable (report.h): a whole-model plan as text. Renders from the
// response only, so local and --server plans print the same bytes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <string>

#include "moeplan/base/format.h"
#include "moeplan/client/report.h"
#include "moeplan/planner/limits.h"
#include "moeplan/proto/convert.h"

namespace moeplan::client {
namespace {

std::string Gate(v1::Gate g) {
  switch (g) {
    case v1::GATE_TOP_K:
      return "top-k";
    case v1::GATE_SWITCH:
      return "switch";
    case v1::GATE_BATCH_PRIORITIZED:
      return "batch-prioritized";
    default:
      return "unspecified";
  }
}

std::string Speedup(double x) { return x > 0.0 ? fmt::format("{:.2f}x", x) : "-"; }

// At most `n` names, then "+ N more".
std::string Names(const google::protobuf::RepeatedPtrField<std::string>& names, int n) {
  std::string out;
  for (int i = 0; i < names.size() && i < n; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > n) out += fmt::format(", + {} more", names.size() - n);
  return out;
}

// "every 2" (moe.layer_freq) or "pattern" (moe.layer_pattern).
std::string MoeEvery(const v1::MoeConfig& moe) {
  return moe.layer_pattern_size() > 0 ? "by pattern" : fmt::format("every {}", moe.layer_freq());
}

// The attention and FFN kinds, where they are not GPT-2's.
std::string Shape(const v1::ModelConfig& m) {
  std::string out;
  if (m.has_multi_latent_attention()) {
    const v1::MultiLatentAttention& a = m.multi_latent_attention();
    out += fmt::format("MLA (q rank {}, kv rank {}, qk {}+{}, v {})", a.q_lora_rank(),
                       a.kv_lora_rank(), a.qk_head_dim(), a.qk_pos_emb_head_dim(), a.v_head_dim());
  } else if (m.has_num_query_groups() && m.num_query_groups() != m.num_attention_heads()) {
    out += fmt::format("GQA ({} key/value groups)", m.num_query_groups());
  }
  if (m.has_kv_channels())
    out += fmt::format("{}head size {}", out.empty() ? "" : ", ", m.kv_channels());
  if (m.attention_backend() == "flash" || m.attention_backend() == "fused") {
    out += fmt::format("{}{} attention", out.empty() ? "" : ", ", m.attention_backend());
  }
  if (m.gated_linear_unit()) out += fmt::format("{}SwiGLU", out.empty() ? "" : ", ");
  if (m.mtp_num_layers() > 0) {
    out += fmt::format("{}{} MTP depth{}", out.empty() ? "" : ", ", m.mtp_num_layers(),
                       m.mtp_num_layers() > 1 ? "s" : "");
  }
  return out.empty() ? out : fmt::format("  {}\n", out);
}

std::string Billions(double n) { return fmt::format("{:.2f} B", n / 1e9); }

// Parameters, model FLOPs per token and the peak MFU is measured against.
std::string Accounting(const v1::PlanModelResponse& plan) {
  if (!plan.has_accounting()) return "";
  const v1::ModelAccounting& a = plan.accounting();
  std::string mtp =
      a.mtp_params() > 0.0 ? fmt::format(", MTP depths {} more", Billions(a.mtp_params())) : "";
  return fmt::format(
      "  parameters {} total, {} active (embedding {}, output layer {}{}); {:.1f} GFLOP per "
      "token (Megatron-LM's count); MFU against {} TFLOP/s\n",
      Billions(a.total_params()), Billions(a.active_params()), Billions(a.embedding_params()),
      a.output_layer_params() > 0.0 ? Billions(a.output_layer_params()) : "tied", mtp,
      a.flops_per_token() / 1e9, a.peak_tflops());
}

}  // namespace

std::string FormatModelTable(const v1::ModelConfig& m, const v1::PlanModelResponse& plan,
                             const v1::ClusterProfile& profile) {
  std::string out;
  auto w = std::back_inserter(out);
  const v1::ParallelLayout& p = m.parallel();
  const v1::MoeConfig& moe = m.moe();
  fmt::format_to(w, "model {} on {} (v{}; {} nodes x {} GPUs), {} ranks\n",
                 m.name().empty() ? "(unnamed)" : m.name(), plan.profile_name(),
                 plan.profile_version(), profile.nodes(), profile.gpus_per_node(), plan.ranks());
  const bool dense = !m.has_moe();
  fmt::format_to(
      w,
      "  {} blocks ({}), hidden {}, {} heads, ffn {}, seq {}, micro-batch "
      "{}, vocab {}, b={}\n",
      m.num_layers(),
      dense ? std::string("dense") : fmt::format("{} MoE, {}", plan.moe_layers(), MoeEvery(moe)),
      m.hidden_size(), m.num_attention_heads(), m.ffn_hidden_size(), m.seq_length(),
      m.micro_batch_size(), m.vocab_size(), m.bytes_per_element());
  if (dense) {
    fmt::format_to(w, "  dense model: no MoE layer | mp={} dp={}\n", p.mp(), p.dp());
  } else {
    fmt::format_to(
        w,
        "  MoE: {} experts, top-{}, {}, expert ffn {}, shared expert ffn {}, {} gate | "
        "mp={} ep={} esp={} dp={}\n",
        moe.num_experts(), moe.top_k(),
        moe.dropless() ? std::string("dropless") : fmt::format("f={}", moe.capacity_factor()),
        moe.expert_ffn_hidden_size(), moe.shared_expert_ffn_hidden_size(), Gate(moe.gate()), p.mp(),
        p.ep(), p.esp(), p.dp());
  }
  fmt::format_to(w, "{}", Shape(m));
  fmt::format_to(w, "{}", Accounting(plan));
  fmt::format_to(w, "  {} parameters per rank\n\n", plan.params_per_rank());

  fmt::format_to(w, "{:<10}{:>12}{:>12}{:>12}{:>12}{:>12}{:>9}{:>10}{:>9}{:>7}  {}\n", "variant",
                 "iteration", "compute", "comm", "exposed", "hidden", "vs_none", "vs_tutel",
                 "TFLOP/s", "MFU", "moe layers");
  for (const v1::VariantPlan& v : plan.variants()) {
    std::string how = dense ? std::string("-")
                            : fmt::format("{}/{}", proto::ScheduleLabel(v.schedule()),
                                          proto::AllToAllAlgoLabel(v.alltoall()));
    if (v.tutel_degree() > 0) how += fmt::format(", r={}", v.tutel_degree());
    fmt::format_to(w, "{:<10}{:>12}{:>12}{:>12}{:>12}{:>12}{:>9}{:>10}{:>9.1f}{:>6.1f}%  {}{}\n",
                   v.name(), FormatDuration(v.iteration_us()), FormatDuration(v.compute_us()),
                   FormatDuration(v.comm_us()), FormatDuration(v.exposed_comm_us()),
                   FormatDuration(v.hidden_comm_us()), Speedup(v.speedup_over_none()),
                   Speedup(v.speedup_over_tutel()), v.tflops_per_gpu(), 100.0 * v.mfu(), how,
                   v.name() == plan.best_variant() ? "  <- best" : "");
  }

  if (!dense) fmt::format_to(w, "\n(schedule/AlltoAll) tried per variant, fastest first:\n");
  for (const v1::VariantPlan& v : plan.variants()) {
    if (dense) break;
    std::string alts;
    for (const v1::VariantAlternative& a : v.alternatives()) {
      alts +=
          fmt::format("{}{}/{}{} {}", alts.empty() ? "" : ", ", proto::ScheduleLabel(a.schedule()),
                      proto::AllToAllAlgoLabel(a.alltoall()),
                      a.tutel_degree() > 0 ? fmt::format(" r={}", a.tutel_degree()) : "",
                      FormatDuration(a.iteration_us()));
    }
    fmt::format_to(w, "  {:<10}{}\n", v.name(), alts);
  }

  for (const v1::VariantPlan& v : plan.variants()) {
    if (v.partition_ranges_size() == 0) continue;
    std::map<int, int> ks;
    for (const v1::MoeLayerPlan& l : v.layers()) ++ks[l.partitions()];
    std::string dist;
    for (const auto& [k, n] : ks) dist += fmt::format("{}k={}: {}", dist.empty() ? "" : ", ", k, n);
    fmt::format_to(w, "\n{}: {} partitioned ranges; k per MoE layer: {}\n", v.name(),
                   v.partition_ranges_size(), dist);
    for (const v1::PartitionRange& r : v.partition_ranges()) {
      fmt::format_to(w, "  k={:<2} {} .. {}{}\n", r.k(), r.first_op(), r.last_op(),
                     r.us() > 0.0 ? fmt::format(" ({})", FormatDuration(r.us())) : "");
    }
  }
  for (const v1::VariantPlan& v : plan.variants()) {
    if (v.dw_placements_size() == 0) continue;
    fmt::format_to(w, "\n{}: dW ops issued under each backward AlltoAll\n", v.name());
    for (const v1::DwPlacement& d : v.dw_placements()) {
      fmt::format_to(w, "  {} ({}): {} dW, {}{}{}\n", d.alltoall(), FormatDuration(d.alltoall_us()),
                     d.dw_ops_size(), FormatDuration(d.dw_us()), d.dw_ops_size() ? ": " : "",
                     Names(d.dw_ops(), 4));
    }
  }

  if (dense) return out;  // no AlltoAll
  const v1::AllToAllCrossover& c = plan.alltoall_crossover();
  fmt::format_to(w, "\nAlltoAll algorithms for {} per rank, {} EP ranks per node: ",
                 FormatBytes(c.bytes()), c.ranks_per_node());
  if (!c.applies()) {
    fmt::format_to(w, "hierarchical (2dh) does not apply (one EP rank per node)\n");
  } else {
    if (c.hierarchical_faster_from_ranks() > 0) {
      fmt::format_to(w, "2dh beats linear from {} ranks on this cluster's links",
                     c.hierarchical_faster_from_ranks());
    } else {
      fmt::format_to(w, "linear beats 2dh up to 65536 ranks on this cluster's links");
    }
    if (c.linear_us() > 0.0) {
      fmt::format_to(w, "; at ep={}: linear {}, 2dh {}", p.ep(), FormatDuration(c.linear_us()),
                     FormatDuration(c.hierarchical_us()));
    }
    fmt::format_to(w, "\n");
  }
  return out;
}

}  // namespace moeplan::client

namespace moeplan::client {
namespace {

std::string Gib(double bytes) { return fmt::format("{:.1f}", bytes / (1024.0 * 1024.0 * 1024.0)); }

std::string PipelineLabel(const v1::Layout& l) {
  if (l.pp() == 1) return "-";
  if (l.pipeline() == "interleaved") return fmt::format("interleaved v={}", l.virtual_stages());
  return l.pipeline();
}

}  // namespace

std::string FormatLayoutTable(const v1::ModelConfig& m, const v1::PlanModelResponse& plan,
                              const v1::ClusterProfile& profile) {
  std::string out;
  auto w = std::back_inserter(out);
  const v1::MoeConfig& moe = m.moe();
  fmt::format_to(w, "model {} on {} (v{}; {} GPUs of {} per node, {} GiB each), global batch {}\n",
                 m.name().empty() ? "(unnamed)" : m.name(), plan.profile_name(),
                 plan.profile_version(), plan.gpus(), profile.gpus_per_node(),
                 profile.gpu_memory_gib(), plan.global_batch_size());
  const bool dense = !m.has_moe();
  fmt::format_to(
      w, "  {} blocks ({}), hidden {}, {} heads, ffn {}, seq {}, vocab {}; {}\n", m.num_layers(),
      dense ? std::string("dense") : fmt::format("{} MoE, {}", plan.moe_layers(), MoeEvery(moe)),
      m.hidden_size(), m.num_attention_heads(), m.ffn_hidden_size(), m.seq_length(), m.vocab_size(),
      dense ? std::string("no experts")
            : fmt::format("{} experts, top-{}, expert ffn {}", moe.num_experts(), moe.top_k(),
                          moe.expert_ffn_hidden_size()));
  fmt::format_to(w, "{}{}", Shape(m), Accounting(plan));
  if (plan.has_search_stats()) {
    const v1::SearchStats& s = plan.search_stats();
    fmt::format_to(w,
                   "search: {} candidates enumerated, {} pruned by memory, {} by bound, {} "
                   "simulated ({} stages planned, {} reused) in {:.1f} ms\n",
                   s.enumerated(), s.pruned_memory(), s.pruned_bound(), s.simulated(),
                   s.stage_plans(), s.stage_cache_hits(), s.elapsed_ms());
    if (s.over_limit() > 0) {
      fmt::format_to(w,
                     "search: {} candidates skipped: more than {} pipeline steps to simulate "
                     "(pp*v*microbatches*2; lower --max-microbatches)\n",
                     s.over_limit(), planner::kMaxPipelineSteps);
    }
    if (s.over_memory() > 0) {
      fmt::format_to(w,
                     "search: {} candidates skipped: a stage plan would hold more than the plan "
                     "memory bound (lower --gpus or --max-microbatches)\n",
                     s.over_memory());
    }
  }
  if (plan.candidates_size() == 0) {
    fmt::format_to(w, "no layout fits: every candidate was pruned by memory\n");
    return out;
  }
  fmt::format_to(w,
                 "\n{:>4}  {:<6} {:>4} {:>3} {:>3} {:>4} {:>4} {:>4} {:>4} {:>4}  {:<15} {:>12} "
                 "{:>13} {:>8} {:>6} {:>8} {:>7}  {:<9} {}\n",
                 "rank", "family", "dp", "tp", "pp", "ep", "esp", "m", "mbs", "zero", "pipeline",
                 "iteration ms", "tokens/s/GPU", "TFLOP/s", "MFU", "GiB/GPU", "bubble", "variant",
                 "schedule");
  for (const v1::LayoutCandidate& c : plan.candidates()) {
    const v1::Layout& l = c.layout();
    fmt::format_to(w,
                   "{:>4}  {:<6} {:>4} {:>3} {:>3} {:>4} {:>4} {:>4} {:>4} {:>4}  {:<15} {:>12.2f} "
                   "{:>13.0f} {:>8.1f} {:>5.1f}% {:>8} {:>6.1f}%  {:<9} {}{}{}{}{}{}{}\n",
                   c.rank(), dense ? "dense" : c.family(), l.dp(), l.tp(), l.pp(), l.ep(), l.esp(),
                   l.microbatches(), l.micro_batch_size(), l.zero_stage(), PipelineLabel(l),
                   c.iteration_us() / 1000.0, c.tokens_per_s_per_gpu(), c.tflops_per_gpu(),
                   100.0 * c.mfu(), Gib(c.memory_bytes_per_gpu()), 100.0 * c.bubble_fraction(),
                   c.variant(), proto::ScheduleLabel(c.schedule()),
                   c.alltoall() == v1::ALLTOALL_ALGORITHM_LINEAR ||
                           c.alltoall() == v1::ALLTOALL_ALGORITHM_UNSPECIFIED
                       ? ""
                       : fmt::format("+{}", proto::AllToAllAlgoLabel(c.alltoall())),
                   l.recompute() ? " recompute"
                   : l.recompute_modules().empty()
                       ? ""
                       : fmt::format(" recompute={}", fmt::join(l.recompute_modules().begin(),
                                                                l.recompute_modules().end(), "+")),
                   l.sequence_parallel() ? " sp" : "",
                   l.cp() > 1 ? fmt::format(" cp={}", l.cp()) : "",
                   l.a2a_overlap() ? " a2a_overlap" : "",
                   l.pipeline_model_parallel_layout().empty()
                       ? ""
                       : fmt::format(" layout={}", l.pipeline_model_parallel_layout()));
  }
  for (const v1::LayoutCandidate& c : plan.candidates()) {
    const v1::MemoryBreakdown& mb = c.memory();
    std::string comm;
    for (const v1::TermTime& t : c.exposed_comm()) {
      comm += fmt::format("{}{} {:.2f}", comm.empty() ? "" : ", ", t.term(), t.us() / 1000.0);
    }
    fmt::format_to(w,
                   "\n#{} {}: compute {:.2f} ms, exposed comm [{}] ms, grad sync {:.2f} ms, "
                   "optimizer {:.2f} ms, bubble {:.2f} ms{}\n",
                   c.rank(), dense ? "dense" : c.family(), c.compute_us() / 1000.0,
                   comm.empty() ? "none" : comm, c.grad_sync_us() / 1000.0,
                   c.optimizer_us() / 1000.0, c.bubble_us() / 1000.0,
                   c.overlap_hidden_us() > 0.0 ? fmt::format(", overlapped pairs hide {:.2f} ms",
                                                             c.overlap_hidden_us() / 1000.0)
                                               : "");
    fmt::format_to(w,
                   "   memory (stage {}): params {} + grads {} + optimizer {} + activations {} "
                   "({:.2f} micro-batches in flight) + capacity buffers {} = {} GiB{}\n",
                   mb.stage(), Gib(mb.params_bytes()), Gib(mb.grads_bytes()),
                   Gib(mb.optimizer_bytes()), Gib(mb.activations_bytes()),
                   mb.in_flight_microbatches(), Gib(mb.capacity_buffer_bytes()),
                   Gib(mb.total_bytes()),
                   c.feasible() ? "" : fmt::format("  INFEASIBLE: {}", c.infeasible_reason()));
  }
  return out;
}

}  // namespace moeplan::client
