// The codec of whole models (docs/model.md): configs, options, plans.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "convert_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/accounting.h"
#include "moeplan/proto/convert.h"

namespace moeplan::proto {

namespace p = ::moeplan::planner;

using internal::AddCriticalTerms;
using internal::AddOpTimings;
using internal::FromWire;
using internal::kAlgos;
using internal::kGates;
using internal::kSchedules;
using internal::kVariants;
using internal::ToWire;

v1::OverlapVariant VariantToProto(p::Variant v) {
  return ToWire(kVariants, v, v1::OVERLAP_VARIANT_UNSPECIFIED);
}
v1::AllToAllAlgorithm AllToAllAlgoToProto(p::AllToAllAlgo a) {
  return ToWire(kAlgos, a, v1::ALLTOALL_ALGORITHM_UNSPECIFIED);
}
std::string_view AllToAllAlgoLabel(v1::AllToAllAlgorithm a) {
  const p::AllToAllAlgo* out = FromWire(kAlgos, a);
  return out != nullptr ? p::AllToAllAlgoName(*out) : "unspecified";
}

namespace {

// `text` as one of `names` (empty: the first), or an error naming `field`:
// `field: must be "a", "b" or "c" (got "x")`.
template <typename E, size_t N>
absl::StatusOr<E> Named(std::string_view field, const std::string& text,
                        const std::pair<std::string_view, E> (&names)[N]) {
  if (text.empty()) return names[0].second;
  std::string rule = "must be ";
  for (size_t i = 0; i < N; ++i) {
    if (text == names[i].first) return names[i].second;
    rule += Cat(i == 0 ? "" : i + 1 == N ? " or " : ", ", "\"", names[i].first, "\"");
  }
  return absl::InvalidArgumentError(Cat(field, ": ", rule, " (got \"", Printable(text), "\")"));
}

constexpr std::pair<std::string_view, p::Normalization> kNorms[] = {
    {"LayerNorm", p::Normalization::kLayerNorm}, {"RMSNorm", p::Normalization::kRmsNorm}};
constexpr std::pair<std::string_view, p::PositionEmbedding> kPositions[] = {
    {"learned_absolute", p::PositionEmbedding::kLearnedAbsolute},
    {"rope", p::PositionEmbedding::kRope},
    {"none", p::PositionEmbedding::kNone}};
constexpr std::pair<std::string_view, p::AttentionBackend> kBackends[] = {
    {"unfused", p::AttentionBackend::kUnfused},
    {"flash", p::AttentionBackend::kFlash},
    {"fused", p::AttentionBackend::kFused}};
constexpr std::pair<std::string_view, p::Fp8Format> kFp8Formats[] = {
    {"none", p::Fp8Format::kNone},
    {"e4m3", p::Fp8Format::kE4M3},
    {"hybrid", p::Fp8Format::kHybrid}};
constexpr std::pair<std::string_view, p::Fp8Recipe> kFp8Recipes[] = {
    {"delayed", p::Fp8Recipe::kDelayed},
    {"tensorwise", p::Fp8Recipe::kTensorwise},
    {"blockwise", p::Fp8Recipe::kBlockwise},
    {"mxfp8", p::Fp8Recipe::kMxfp8}};

absl::Status MoeFromProto(const v1::MoeConfig& moe, p::MoeSpec* out) {
  out->layer_freq = moe.layer_freq();
  for (int i = 0; i < moe.layer_pattern_size(); ++i) {
    const int32_t v = moe.layer_pattern(i);
    if (v != 0 && v != 1) {
      return absl::InvalidArgumentError(
          Cat("moe.layer_pattern[", i, "]: must be 0 (dense) or 1 (MoE) (got ", v, ")"));
    }
    out->layer_pattern.push_back(static_cast<uint8_t>(v));
  }
  out->num_experts = moe.num_experts();
  out->top_k = moe.top_k();
  out->capacity_factor = moe.capacity_factor();
  out->expert_ffn_hidden_size = moe.expert_ffn_hidden_size();
  out->shared_expert_ffn_hidden_size =
      moe.has_shared_expert_ffn_hidden_size() ? moe.shared_expert_ffn_hidden_size() : 0;
  if (moe.has_num_shared_experts() && moe.num_shared_experts() < 1) {
    return absl::InvalidArgumentError(
        Cat("moe.num_shared_experts: must be between 1 and 64 (unset: 1) (got ",
            moe.num_shared_experts(), ")"));
  }
  out->num_shared_experts = moe.has_num_shared_experts() ? moe.num_shared_experts() : 0;
  out->shared_expert_gate = moe.shared_expert_gate();
  out->router_num_groups = moe.has_router_num_groups() ? moe.router_num_groups() : 0;
  out->router_group_topk = moe.has_router_group_topk() ? moe.router_group_topk() : 0;
  if (moe.has_router_num_groups() != moe.has_router_group_topk()) {
    return absl::InvalidArgumentError(
        Cat(moe.has_router_num_groups() ? "moe.router_group_topk" : "moe.router_num_groups",
            ": must be set with ",
            moe.has_router_num_groups() ? "moe.router_num_groups" : "moe.router_group_topk",
            " (group-limited routing needs both) (got unset)"));
  }
  out->dropless = moe.dropless();
  out->token_skew = moe.has_token_skew() ? moe.token_skew() : 1.0;
  out->router_force_load_balancing = moe.router_force_load_balancing();
  const p::Gate* gate = FromWire(kGates, moe.gate());
  if (gate == nullptr) {
    return absl::InvalidArgumentError(
        Cat("moe.gate: must be GATE_TOP_K, GATE_SWITCH or GATE_BATCH_PRIORITIZED (got ",
            static_cast<int>(moe.gate()), ")"));
  }
  out->gate = *gate;
  return absl::OkStatus();
}

// Attention, FFN kind, norms, embeddings and MTP depths.
absl::Status ShapeFromProto(const v1::ModelConfig& m, p::ModelConfig* out) {
  out->num_query_groups = m.has_num_query_groups() ? m.num_query_groups() : 0;
  out->kv_channels = m.has_kv_channels() ? m.kv_channels() : 0;
  out->gated_linear_unit = m.gated_linear_unit();
  out->multi_latent_attention = m.has_multi_latent_attention();
  if (out->multi_latent_attention) {
    const v1::MultiLatentAttention& a = m.multi_latent_attention();
    out->mla.q_lora_rank = a.has_q_lora_rank() ? a.q_lora_rank() : 0;
    out->mla.kv_lora_rank = a.kv_lora_rank();
    out->mla.qk_head_dim = a.qk_head_dim();
    out->mla.qk_pos_emb_head_dim = a.qk_pos_emb_head_dim();
    out->mla.v_head_dim = a.v_head_dim();
  }
  out->untie_embeddings_and_output_weights = m.untie_embeddings_and_output_weights();
  out->mtp_num_layers = m.has_mtp_num_layers() ? m.mtp_num_layers() : 0;
  out->add_qkv_bias = m.add_qkv_bias();
  out->qk_layernorm = m.qk_layernorm();
  out->add_bias_linear = m.has_add_bias_linear() ? m.add_bias_linear() : true;
  MOEPLAN_ASSIGN_OR_RETURN(out->normalization, Named("normalization", m.normalization(), kNorms));
  MOEPLAN_ASSIGN_OR_RETURN(
      out->position_embedding_type,
      Named("position_embedding_type", m.position_embedding_type(), kPositions));
  MOEPLAN_ASSIGN_OR_RETURN(out->attention_backend,
                           Named("attention_backend", m.attention_backend(), kBackends));
  MOEPLAN_ASSIGN_OR_RETURN(out->fp8_format, Named("fp8_format", m.fp8_format(), kFp8Formats));
  MOEPLAN_ASSIGN_OR_RETURN(out->fp8_recipe, Named("fp8_recipe", m.fp8_recipe(), kFp8Recipes));
  out->fp8_param_gather = m.fp8_param_gather();
  return absl::OkStatus();
}

// The MoE layers' fields (a dense model has no moe message).
void MoeToProto(const p::MoeSpec& e, v1::MoeConfig* moe) {
  moe->set_layer_freq(e.layer_freq);
  moe->set_num_experts(static_cast<int32_t>(e.num_experts));
  moe->set_top_k(static_cast<int32_t>(e.top_k));
  moe->set_capacity_factor(e.capacity_factor);
  moe->set_expert_ffn_hidden_size(static_cast<int32_t>(e.expert_ffn_hidden_size));
  moe->set_shared_expert_ffn_hidden_size(static_cast<int32_t>(e.shared_expert_ffn_hidden_size));
  moe->set_gate(ToWire(kGates, e.gate, v1::GATE_UNSPECIFIED));
  if (!e.layer_pattern.empty()) {
    moe->clear_layer_freq();
    for (uint8_t v : e.layer_pattern) moe->add_layer_pattern(v);
  }
  if (e.shared_expert_ffn_hidden_size > 0) {
    moe->set_num_shared_experts(static_cast<int32_t>(std::max<int64_t>(1, e.num_shared_experts)));
  }
  moe->set_shared_expert_gate(e.shared_expert_gate);
  if (e.router_num_groups > 0) {
    moe->set_router_num_groups(static_cast<int32_t>(e.router_num_groups));
    moe->set_router_group_topk(static_cast<int32_t>(e.router_group_topk));
  }
  moe->set_dropless(e.dropless);
  if (e.token_skew != 1.0) moe->set_token_skew(e.token_skew);
  moe->set_router_force_load_balancing(e.router_force_load_balancing);
}

}  // namespace

absl::StatusOr<p::ModelConfig> ModelFromProto(const v1::ModelConfig& m) {
  if (m.schema_version() > 1) {
    return absl::InvalidArgumentError(
        Cat("schema_version: must be 1 (got ", m.schema_version(), ")"));
  }
  MOEPLAN_RETURN_IF_ERROR(CheckName(m.name()));
  p::ModelConfig out;
  out.name = m.name();
  out.num_layers = m.num_layers();
  out.hidden_size = m.hidden_size();
  out.num_attention_heads = m.num_attention_heads();
  out.ffn_hidden_size = m.ffn_hidden_size();
  out.seq_length = m.seq_length();
  out.micro_batch_size = m.micro_batch_size();
  out.vocab_size = m.has_vocab_size() ? m.vocab_size() : 0;
  out.bytes_per_element = m.has_bytes_per_element() ? m.bytes_per_element() : 2;
  if (m.has_moe()) {
    if (m.moe().num_experts() == 0) {
      return absl::InvalidArgumentError(
          "moe.num_experts: must be > 0 (got 0; leave moe out for a dense model)");
    }
    MOEPLAN_RETURN_IF_ERROR(MoeFromProto(m.moe(), &out.moe));
  } else {
    out.moe.num_experts = 0;  // a dense model (ModelConfig::IsDense)
  }
  MOEPLAN_ASSIGN_OR_RETURN(out.parallel, ParallelFromProto(m.parallel()));
  if (out.IsDense()) {
    // No experts to split: ep and esp unset read as 1, and dp unset as 1.
    const v1::ParallelLayout& par = m.parallel();
    if (par.ep() == 0) out.parallel.ep = 1;
    if (par.esp() == 0) out.parallel.esp = 1;
    if (!par.has_dp()) out.parallel.dp = 1;
  }
  out.global_batch_size = m.has_global_batch_size() ? m.global_batch_size() : 0;
  MOEPLAN_RETURN_IF_ERROR(ShapeFromProto(m, &out));
  return out;
}

v1::ModelConfig ModelToProto(const p::ModelConfig& m) {
  v1::ModelConfig out;
  out.set_schema_version(1);
  out.set_name(m.name);
  out.set_num_layers(m.num_layers);
  out.set_hidden_size(static_cast<int32_t>(m.hidden_size));
  out.set_num_attention_heads(static_cast<int32_t>(m.num_attention_heads));
  out.set_ffn_hidden_size(static_cast<int32_t>(m.ffn_hidden_size));
  out.set_seq_length(static_cast<int32_t>(m.seq_length));
  out.set_micro_batch_size(static_cast<int32_t>(m.micro_batch_size));
  out.set_vocab_size(static_cast<int32_t>(m.vocab_size));
  out.set_bytes_per_element(m.bytes_per_element);
  if (!m.IsDense()) MoeToProto(m.moe, out.mutable_moe());
  v1::ParallelLayout* par = out.mutable_parallel();
  par->set_mp(m.parallel.mp);
  par->set_ep(m.parallel.ep);
  par->set_esp(m.parallel.esp);
  par->set_dp(m.parallel.dp);
  par->set_pp(m.parallel.pp);
  if (m.parallel.sequence_parallel) par->set_sequence_parallel(true);
  if (m.global_batch_size > 0) out.set_global_batch_size(static_cast<int32_t>(m.global_batch_size));
  if (m.num_query_groups > 0) out.set_num_query_groups(static_cast<int32_t>(m.num_query_groups));
  if (m.kv_channels > 0) out.set_kv_channels(static_cast<int32_t>(m.kv_channels));
  out.set_gated_linear_unit(m.gated_linear_unit);
  if (m.multi_latent_attention) {
    v1::MultiLatentAttention* a = out.mutable_multi_latent_attention();
    if (m.mla.q_lora_rank > 0) a->set_q_lora_rank(static_cast<int32_t>(m.mla.q_lora_rank));
    a->set_kv_lora_rank(static_cast<int32_t>(m.mla.kv_lora_rank));
    a->set_qk_head_dim(static_cast<int32_t>(m.mla.qk_head_dim));
    a->set_qk_pos_emb_head_dim(static_cast<int32_t>(m.mla.qk_pos_emb_head_dim));
    a->set_v_head_dim(static_cast<int32_t>(m.mla.v_head_dim));
  }
  out.set_untie_embeddings_and_output_weights(m.untie_embeddings_and_output_weights);
  if (m.mtp_num_layers > 0) out.set_mtp_num_layers(m.mtp_num_layers);
  out.set_add_qkv_bias(m.add_qkv_bias);
  out.set_normalization(std::string(p::NormalizationName(m.normalization)));
  out.set_qk_layernorm(m.qk_layernorm);
  out.set_add_bias_linear(m.add_bias_linear);
  out.set_position_embedding_type(std::string(p::PositionEmbeddingName(m.position_embedding_type)));
  out.set_attention_backend(std::string(p::AttentionBackendName(m.attention_backend)));
  if (m.Fp8()) {
    out.set_fp8_format(std::string(p::Fp8FormatName(m.fp8_format)));
    out.set_fp8_recipe(std::string(p::Fp8RecipeName(m.fp8_recipe)));
  }
  out.set_fp8_param_gather(m.fp8_param_gather);
  return out;
}

absl::StatusOr<p::ModelPlanOptions> ModelOptionsFromProto(const v1::ModelPlanOptions& m) {
  p::ModelPlanOptions o;
  for (int i = 0; i < m.variants_size(); ++i) {
    const p::Variant* v = FromWire(kVariants, m.variants(i));
    if (v == nullptr) {
      return absl::InvalidArgumentError(Cat("options.variants[", i,
                                            "]: must be an OVERLAP_VARIANT_* value other than "
                                            "UNSPECIFIED (got ",
                                            static_cast<int>(m.variants(i)), ")"));
    }
    o.variants.push_back(*v);
  }
  for (int i = 0; i < m.schedules_size(); ++i) {
    const p::Schedule* s = FromWire(kSchedules, m.schedules(i));
    if (s == nullptr) {
      return absl::InvalidArgumentError(Cat(
          "options.schedules[", i, "]: must be SCHEDULE_DEFAULT, SCHEDULE_S1 or SCHEDULE_S2 (got ",
          static_cast<int>(m.schedules(i)), ")"));
    }
    o.schedules.push_back(*s);
  }
  for (int i = 0; i < m.alltoall_algorithms_size(); ++i) {
    const p::AllToAllAlgo* a = FromWire(kAlgos, m.alltoall_algorithms(i));
    if (a == nullptr) {
      return absl::InvalidArgumentError(
          Cat("options.alltoall_algorithms[", i,
              "]: must be ALLTOALL_ALGORITHM_LINEAR, ALLTOALL_ALGORITHM_HIERARCHICAL, "
              "ALLTOALL_ALGORITHM_DEEPEP or ALLTOALL_ALGORITHM_ALLGATHER (got ",
              static_cast<int>(m.alltoall_algorithms(i)), ")"));
    }
    o.algos.push_back(*a);
  }
  if (m.has_bucket_bytes()) o.bucket_bytes = m.bucket_bytes();
  if (m.has_partition_max_k()) o.max_partitions = m.partition_max_k();
  if (m.has_partition_groups()) o.partition_groups = m.partition_groups();
  if (m.has_partition_max_span()) o.max_span = m.partition_max_span();
  if (m.tutel_degrees_size() > 0)
    o.tutel_degrees.assign(m.tutel_degrees().begin(), m.tutel_degrees().end());
  if (absl::Status s = p::ValidateModelPlanOptions(o); !s.ok()) {
    static constexpr std::pair<std::string_view, std::string_view> kNames[] = {
        {"max_partitions", "partition_max_k"},
        {"max_span", "partition_max_span"},
        {"algos", "alltoall_algorithms"},
    };
    std::string msg(View(s.message()));
    for (const auto& [from, to] : kNames) {
      if (msg.rfind(from, 0) == 0) msg = Cat(to, msg.substr(from.size()));
    }
    return absl::InvalidArgumentError(Cat("options.", msg));
  }
  return o;
}

void AccountingToProto(const p::ModelConfig& model, const p::ClusterProfile& profile,
                       v1::ModelAccounting* out) {
  const p::ParamCounts c = p::CountParams(model);
  out->set_total_params(c.total);
  out->set_active_params(c.active);
  out->set_embedding_params(c.embedding);
  out->set_output_layer_params(c.output_layer);
  out->set_mtp_params(c.mtp);
  out->set_total_params_with_mtp(c.total_with_mtp);
  out->set_flops_per_token(p::FlopsPerToken(model));
  out->set_peak_tflops(p::DensePeakTflops(profile, model.bytes_per_element));
}

namespace {

// A variants plan's iteration: a micro-batch on every data-parallel replica.
void VariantThroughput(const p::ModelConfig& model, const v1::ModelAccounting& a,
                       double iteration_us, v1::VariantPlan* o) {
  const double tokens = static_cast<double>(model.micro_batch_size) * model.parallel.dp *
                        static_cast<double>(model.seq_length);
  const p::Throughput tp = p::ThroughputOf(a.flops_per_token(), tokens, iteration_us,
                                           model.parallel.TotalRanks(), a.peak_tflops());
  o->set_tokens_per_s_per_gpu(tp.tokens_per_s_per_gpu);
  o->set_tflops_per_gpu(tp.tflops_per_gpu);
  o->set_mfu(tp.mfu);
}

}  // namespace

void ModelPlanToProto(const p::ModelPlan& plan, const p::ModelConfig& model,
                      const p::ClusterProfile& profile, bool include_timeline,
                      v1::PlanModelResponse* out) {
  out->Clear();
  out->set_profile_name(profile.name);
  out->set_profile_version(profile.version);
  *out->mutable_model() = ModelToProto(model);
  out->set_ranks(model.parallel.TotalRanks());
  out->set_gpus(model.parallel.TotalRanks());
  out->set_global_batch_size(static_cast<int32_t>(model.GlobalBatch()));
  out->set_moe_layers(plan.moe_layers);
  out->set_params_per_rank(plan.params_per_rank);
  AccountingToProto(model, profile, out->mutable_accounting());
  const p::VariantPlan* none = plan.Find(p::Variant::kNone);
  const p::VariantPlan* tutel = plan.Find(p::Variant::kTutel);
  for (const p::VariantPlan& v : plan.variants) {
    v1::VariantPlan* o = out->add_variants();
    o->set_name(std::string(p::VariantName(v.variant)));
    o->set_iteration_us(v.iteration_us());
    o->set_forward_us(v.sim.forward_end_us);
    o->set_backward_us(v.sim.makespan_us - v.sim.forward_end_us);
    o->set_compute_us(v.sim.compute_busy_us);
    o->set_comm_us(v.sim.comm_busy_us);
    o->set_hidden_comm_us(v.sim.hidden_comm_us);
    o->set_exposed_comm_us(v.sim.exposed_comm_us);
    if (none != nullptr && v.iteration_us() > 0) {
      o->set_speedup_over_none(none->iteration_us() / v.iteration_us());
    }
    if (tutel != nullptr && v.iteration_us() > 0) {
      o->set_speedup_over_tutel(tutel->iteration_us() / v.iteration_us());
    }
    VariantThroughput(model, out->accounting(), v.iteration_us(), o);
    o->set_tutel_degree(v.tutel_degree);
    o->set_schedule(ScheduleToProto(v.schedule));
    o->set_alltoall(AllToAllAlgoToProto(v.algo));
    for (const p::MoeLayerChoice& l : v.layers) {
      v1::MoeLayerPlan* lo = o->add_layers();
      lo->set_block(l.block);
      lo->set_schedule(ScheduleToProto(l.schedule));
      lo->set_alltoall(AllToAllAlgoToProto(l.algo));
      lo->set_partitions(l.partitions);
    }
    for (const p::PartitionRange& r : v.partitions) {
      v1::PartitionRange* ro = o->add_partition_ranges();
      ro->set_first_op(r.first_op);
      ro->set_last_op(r.last_op);
      ro->set_k(r.k);
      ro->set_us(r.us);
    }
    for (const p::DwPlacement& d : v.dw) {
      v1::DwPlacement* dwo = o->add_dw_placements();
      dwo->set_alltoall(d.alltoall);
      dwo->set_alltoall_us(d.alltoall_us);
      for (const std::string& n : d.dw_ops) dwo->add_dw_ops(n);
      dwo->set_dw_us(d.dw_us);
    }
    for (const p::VariantAlternative& a : v.alternatives) {
      v1::VariantAlternative* ao = o->add_alternatives();
      ao->set_schedule(ScheduleToProto(a.schedule));
      ao->set_alltoall(AllToAllAlgoToProto(a.algo));
      ao->set_tutel_degree(a.tutel_degree);
      ao->set_iteration_us(a.iteration_us);
    }
    AddCriticalTerms(v.sim, o->mutable_critical_terms());
    o->set_inter_node_bytes(v.sim.inter_node_bytes);
    o->set_num_ops(v.graph.size());
    if (include_timeline) AddOpTimings(v.graph, v.sim, o->mutable_ops());
  }
  if (!plan.variants.empty()) {
    out->set_best_variant(
        std::string(p::VariantName(plan.variants[static_cast<size_t>(plan.best)].variant)));
  }
  v1::AllToAllCrossover* c = out->mutable_alltoall_crossover();
  c->set_applies(plan.crossover.applies);
  c->set_bytes(plan.crossover.bytes);
  c->set_ranks_per_node(plan.crossover.ranks_per_node);
  c->set_hierarchical_faster_from_ranks(plan.crossover.faster_from_ranks);
  c->set_linear_us(plan.crossover.linear_us);
  c->set_hierarchical_us(plan.crossover.hierarchical_us);
}

}  // namespace moeplan::proto
