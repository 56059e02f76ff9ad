#include "moeplan/proto/convert.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/op_graph.h"

namespace moeplan::proto {

namespace p = ::moeplan::planner;

absl::StatusOr<p::ParallelLayout> ParallelFromProto(const v1::ParallelLayout& par) {
  p::ParallelLayout out;
  out.mp = par.mp();
  out.ep = par.ep();
  out.esp = par.esp();
  out.pp = par.has_pp() ? par.pp() : 1;
  if (par.has_dp()) {
    out.dp = par.dp();
  } else if (par.mp() >= 1 && par.ep() >= 1 && par.esp() >= 1) {
    const int64_t expert = int64_t{par.ep()} * par.esp();
    if (expert % par.mp() != 0) {
      return absl::InvalidArgumentError(
          Cat("parallel.dp: unset, so it is derived as ep*esp/mp, which needs mp to divide ep*esp "
              "(got mp=",
              par.mp(), ", ep*esp=", expert, ")"));
    }
    out.dp = static_cast<int>(expert / par.mp());
  }
  return out;
}

// Names are labels copied into every row, config and log line that mentions
// them: bounded, so that a name cannot multiply into gigabytes.
absl::Status CheckName(const std::string& name) {
  if (name.size() <= kMaxNameBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      Cat("name: must be at most ", kMaxNameBytes, " bytes (got ", name.size(), ")"));
}

absl::StatusOr<p::LayerConfig> LayerFromProto(const v1::LayerConfig& m) {
  if (m.schema_version() > 1) {
    return absl::InvalidArgumentError(
        Cat("schema_version: must be 1 (got ", m.schema_version(), ")"));
  }
  MOEPLAN_RETURN_IF_ERROR(CheckName(m.name()));
  p::LayerConfig l;
  l.name = m.name();
  l.batch_size = m.batch_size();
  l.seq_len = m.seq_len();
  l.model_dim = m.model_dim();
  l.hidden_dim = m.hidden_dim();
  l.num_experts = m.num_experts();
  l.top_k = m.top_k();
  l.capacity_factor = m.capacity_factor();
  l.bytes_per_element = m.has_bytes_per_element() ? m.bytes_per_element() : 2;
  l.token_skew = m.has_token_skew() ? m.token_skew() : 1.0;
  l.dropless = m.dropless();
  MOEPLAN_ASSIGN_OR_RETURN(l.parallel, ParallelFromProto(m.parallel()));
  return l;
}

v1::LayerConfig LayerToProto(const p::LayerConfig& l) {
  v1::LayerConfig m;
  m.set_schema_version(1);
  m.set_name(l.name);
  m.set_batch_size(static_cast<int32_t>(l.batch_size));
  m.set_seq_len(static_cast<int32_t>(l.seq_len));
  m.set_model_dim(static_cast<int32_t>(l.model_dim));
  m.set_hidden_dim(static_cast<int32_t>(l.hidden_dim));
  m.set_num_experts(static_cast<int32_t>(l.num_experts));
  m.set_top_k(static_cast<int32_t>(l.top_k));
  m.set_capacity_factor(l.capacity_factor);
  m.set_bytes_per_element(l.bytes_per_element);
  m.set_token_skew(l.token_skew);
  m.set_dropless(l.dropless);
  v1::ParallelLayout* par = m.mutable_parallel();
  par->set_mp(l.parallel.mp);
  par->set_ep(l.parallel.ep);
  par->set_esp(l.parallel.esp);
  par->set_dp(l.parallel.dp);
  par->set_pp(l.parallel.pp);
  return m;
}

namespace {

// The planner <-> wire enum pairs, one table per enum: both directions read
// it, so a new value is added in one place.
template <class P, class W>
struct EnumPair {
  P planner;
  W wire;
};
constexpr EnumPair<p::Collective, v1::Collective> kCollectives[] = {
    {p::Collective::kAllReduce, v1::COLLECTIVE_ALL_REDUCE},
    {p::Collective::kAllGather, v1::COLLECTIVE_ALL_GATHER},
    {p::Collective::kReduceScatter, v1::COLLECTIVE_REDUCE_SCATTER},
    {p::Collective::kAllToAll, v1::COLLECTIVE_ALL_TO_ALL},
    {p::Collective::kSendRecv, v1::COLLECTIVE_SEND_RECV},
};
constexpr EnumPair<p::Schedule, v1::Schedule> kSchedules[] = {
    {p::Schedule::kDefault, v1::SCHEDULE_DEFAULT},
    {p::Schedule::kS1, v1::SCHEDULE_S1},
    {p::Schedule::kS2, v1::SCHEDULE_S2},
};

constexpr EnumPair<p::Gate, v1::Gate> kGates[] = {
    {p::Gate::kTopK, v1::GATE_TOP_K},
    {p::Gate::kSwitch, v1::GATE_SWITCH},
    {p::Gate::kBatchPrioritized, v1::GATE_BATCH_PRIORITIZED},
};
constexpr EnumPair<p::Variant, v1::OverlapVariant> kVariants[] = {
    {p::Variant::kNone, v1::OVERLAP_VARIANT_NONE},
    {p::Variant::kTutel, v1::OVERLAP_VARIANT_TUTEL},
    {p::Variant::kDw, v1::OVERLAP_VARIANT_DW},
    {p::Variant::kPartition, v1::OVERLAP_VARIANT_PARTITION},
    {p::Variant::kLancet, v1::OVERLAP_VARIANT_LANCET},
};
constexpr EnumPair<p::AllToAllAlgo, v1::AllToAllAlgorithm> kAlgos[] = {
    {p::AllToAllAlgo::kLinear, v1::ALLTOALL_ALGORITHM_LINEAR},
    {p::AllToAllAlgo::kHierarchical, v1::ALLTOALL_ALGORITHM_HIERARCHICAL},
};

template <class P, class W, size_t N>
W ToWire(const EnumPair<P, W> (&table)[N], P value, W unspecified) {
  for (const auto& e : table) {
    if (e.planner == value) return e.wire;
  }
  return unspecified;
}
template <class P, class W, size_t N>
const P* FromWire(const EnumPair<P, W> (&table)[N], W value) {
  for (const auto& e : table) {
    if (e.wire == value) return &e.planner;
  }
  return nullptr;
}

p::AlphaBeta AlphaBetaFromProto(const v1::AlphaBeta& m) {
  return {m.alpha_us(), m.beta_us_per_byte()};
}

absl::Status FitsFromProto(const google::protobuf::RepeatedPtrField<v1::CollectiveFit>& fits,
                           std::string_view list, std::vector<p::CollectiveFit>* out) {
  for (int i = 0; i < fits.size(); ++i) {
    const v1::CollectiveFit& f = fits[i];
    absl::StatusOr<p::Collective> c =
        CollectiveFromProto(f.collective(), Cat(list, "[", i, "].collective"));
    if (!c.ok()) return c.status();
    p::CollectiveFit fit{
        *c, {f.shape().ranks(), f.shape().nodes()}, AlphaBetaFromProto(f.cost()), {}};
    for (const v1::FitPiece& piece : f.pieces()) {
      fit.pieces.push_back(
          {static_cast<double>(piece.from_bytes()), AlphaBetaFromProto(piece.cost())});
    }
    out->push_back(std::move(fit));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<p::ClusterProfile> ProfileFromProto(const v1::ClusterProfile& m) {
  if (m.schema_version() > 1) {
    return absl::InvalidArgumentError(
        Cat("schema_version: must be 1 (got ", m.schema_version(), ")"));
  }
  p::ClusterProfile pr;
  pr.name = m.name();
  pr.version = m.version();
  switch (m.source()) {
    case v1::PROFILE_SOURCE_MEASURED:
      pr.source = p::ProfileSource::kMeasured;
      break;
    case v1::PROFILE_SOURCE_SPEC:
      pr.source = p::ProfileSource::kSpec;
      break;
    default:
      pr.source = p::ProfileSource::kUnspecified;
  }
  pr.shape.nodes = m.nodes();
  pr.shape.gpus_per_node = m.gpus_per_node();
  pr.gpu_memory_gib = m.gpu_memory_gib();
  if (!m.has_links() || !m.links().has_intra() || !m.links().has_inter()) {
    return absl::InvalidArgumentError(
        "links: both links.intra and links.inter are required (alpha_us, beta_us_per_byte)");
  }
  pr.intra = AlphaBetaFromProto(m.links().intra());
  pr.inter = AlphaBetaFromProto(m.links().inter());
  MOEPLAN_RETURN_IF_ERROR(FitsFromProto(m.collectives(), "collectives", &pr.collectives));
  MOEPLAN_RETURN_IF_ERROR(
      FitsFromProto(m.context().collectives(), "context.collectives", &pr.context.collectives));
  for (int i = 0; i < m.context().ops_size(); ++i) {
    const v1::OpContext& c = m.context().ops(i);
    p::OpContext oc{c.op(), 0, c.offset_us(), c.scale()};
    if (!p::ParseResourceMask(c.resource(), &oc.resources)) {
      return absl::InvalidArgumentError(
          Cat("context.ops[", i,
              "].resource: must be compute, intra, inter or a '+' join of them "
              "(got \"",
              c.resource(), "\")"));
    }
    pr.context.ops.push_back(std::move(oc));
  }
  pr.gemm.peak_tflops = m.gemm().peak_tflops();
  pr.gemm.launch_overhead_us = m.gemm().launch_overhead_us();
  pr.gemm.grid.m.assign(m.gemm().m().begin(), m.gemm().m().end());
  pr.gemm.grid.n.assign(m.gemm().n().begin(), m.gemm().n().end());
  pr.gemm.grid.k.assign(m.gemm().k().begin(), m.gemm().k().end());
  pr.gemm.grid.efficiency.assign(m.gemm().efficiency().begin(), m.gemm().efficiency().end());
  pr.memory.bandwidth_gbytes_per_s = m.memory().bandwidth_gbytes_per_s();
  pr.memory.launch_overhead_us = m.memory().launch_overhead_us();
  pr.activation.forward.bandwidth_gbytes_per_s = m.activation().forward().bandwidth_gbytes_per_s();
  pr.activation.forward.launch_overhead_us = m.activation().forward().launch_overhead_us();
  pr.activation.backward.bandwidth_gbytes_per_s =
      m.activation().backward().bandwidth_gbytes_per_s();
  pr.activation.backward.launch_overhead_us = m.activation().backward().launch_overhead_us();
  for (const auto& [to, from] : {std::pair{&pr.kernels.order, &m.kernels().order()},
                                 {&pr.kernels.iorder, &m.kernels().iorder()},
                                 {&pr.kernels.route, &m.kernels().route()}}) {
    to->bandwidth_gbytes_per_s = from->bandwidth_gbytes_per_s();
    to->launch_overhead_us = from->launch_overhead_us();
  }
  for (const v1::AlltoAllSkew& s : m.alltoall_skew()) {
    pr.alltoall_skew.push_back({{s.shape().ranks(), s.shape().nodes()}, s.gamma()});
  }
  MOEPLAN_RETURN_IF_ERROR(p::ValidateProfile(pr));
  return pr;
}

absl::StatusOr<p::Collective> CollectiveFromProto(v1::Collective c, std::string_view field) {
  if (const p::Collective* out = FromWire(kCollectives, c)) return *out;
  return absl::InvalidArgumentError(
      Cat(field, ": must be a COLLECTIVE_* value other than UNSPECIFIED (got ", static_cast<int>(c),
          ")"));
}

v1::Collective CollectiveToProto(p::Collective c) {
  return ToWire(kCollectives, c, v1::COLLECTIVE_UNSPECIFIED);
}

std::string_view CollectiveLabel(v1::Collective c) {
  const p::Collective* out = FromWire(kCollectives, c);
  return out != nullptr ? p::CollectiveName(*out) : "unspecified";
}

v1::Schedule ScheduleToProto(p::Schedule s) {
  return ToWire(kSchedules, s, v1::SCHEDULE_UNSPECIFIED);
}

absl::StatusOr<p::Schedule> ScheduleFromProto(v1::Schedule s) {
  if (const p::Schedule* out = FromWire(kSchedules, s)) return *out;
  return absl::InvalidArgumentError(
      Cat("schedules: must be SCHEDULE_DEFAULT, SCHEDULE_S1 or SCHEDULE_S2 (got ",
          static_cast<int>(s), ")"));
}

std::string_view ScheduleLabel(v1::Schedule s) {
  const p::Schedule* out = FromWire(kSchedules, s);
  return out != nullptr ? p::ScheduleName(*out) : "unspecified";
}

void AddOpTimings(const p::OpGraph& graph, const p::SimResult& sim,
                  google::protobuf::RepeatedPtrField<v1::OpTiming>* out) {
  out->Reserve(graph.size());
  for (int i = 0; i < graph.size(); ++i) {
    const p::Op& op = graph.op(i);
    const p::OpTime& time = sim.times[static_cast<size_t>(i)];
    v1::OpTiming* o = out->Add();
    o->set_name(op.Name());
    o->set_resource(p::ResourceMaskName(op.resources));
    o->set_start_us(time.start_us);
    o->set_end_us(time.end_us);
    o->set_phase(op.phase == p::Phase::kForward ? v1::PHASE_FORWARD : v1::PHASE_BACKWARD);
    o->set_kind(op.kind == p::OpKind::kCompute ? "compute" : "comm");
    o->set_term(std::string(p::TermName(op.term)));
    o->set_bytes(op.bytes);
    o->set_inter_node_bytes(op.inter_node_bytes);
    o->set_critical(time.critical);
  }
}

void AddCriticalTerms(const p::SimResult& sim,
                      google::protobuf::RepeatedPtrField<v1::TermTime>* out) {
  for (int t = 0; t < p::kNumTerms; ++t) {
    if (sim.critical_term_us[static_cast<size_t>(t)] == 0.0) continue;
    v1::TermTime* tt = out->Add();
    tt->set_term(std::string(p::TermName(static_cast<p::Term>(t))));
    tt->set_us(sim.critical_term_us[static_cast<size_t>(t)]);
  }
}

void PlanToProto(const p::LayerPlan& plan, const p::ClusterProfile& profile, bool include_timeline,
                 v1::PlanLayerResponse* out) {
  out->Clear();
  out->set_profile_name(profile.name);
  out->set_profile_version(profile.version);
  v1::DerivedShape* d = out->mutable_derived();
  d->set_tokens(plan.derived.tokens);
  d->set_capacity(plan.derived.capacity);
  d->set_activation_bytes(plan.derived.activation_bytes);
  d->set_dispatch_bytes(plan.derived.dispatch_bytes);
  for (const p::Candidate& c : plan.candidates) {
    v1::CandidatePlan* cp = out->add_candidates();
    cp->set_schedule(ScheduleToProto(c.schedule));
    cp->set_forward_us(c.forward_us());
    cp->set_backward_us(c.backward_us());
    cp->set_total_us(c.total_us());
    cp->set_comm_us(c.sim.comm_busy_us);
    cp->set_hidden_comm_us(c.sim.hidden_comm_us);
    cp->set_exposed_comm_us(c.sim.exposed_comm_us);
    cp->set_compute_us(c.sim.compute_busy_us);
    cp->set_inter_node_bytes(c.sim.inter_node_bytes);
    AddCriticalTerms(c.sim, cp->mutable_critical_terms());
    if (!include_timeline) continue;
    AddOpTimings(c.graph(), c.sim, cp->mutable_ops());
  }
  out->set_best_schedule(ScheduleToProto(plan.decision.best));
  v1::Decision* dec = out->mutable_decision();
  dec->set_best(ScheduleToProto(plan.decision.best));
  if (plan.decision.has_runner_up) dec->set_runner_up(ScheduleToProto(plan.decision.runner_up));
  dec->set_margin_us(plan.decision.margin_us);
  dec->set_margin_pct(plan.decision.margin_pct);
  dec->set_speedup_over_default(plan.decision.speedup_over_default);
  for (const p::TermDelta& td : plan.decision.deciding_terms) {
    v1::TermDelta* t = dec->add_deciding_terms();
    t->set_term(std::string(p::TermName(td.term)));
    t->set_delta_us(td.delta_us);
  }
  dec->set_summary(plan.decision.summary);
}

// ---- Whole models (docs/model.md) ----

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
  const v1::MoeConfig& moe = m.moe();
  out.moe.layer_freq = moe.layer_freq();
  out.moe.num_experts = moe.num_experts();
  out.moe.top_k = moe.top_k();
  out.moe.capacity_factor = moe.capacity_factor();
  out.moe.expert_ffn_hidden_size = moe.expert_ffn_hidden_size();
  out.moe.shared_expert_ffn_hidden_size =
      moe.has_shared_expert_ffn_hidden_size() ? moe.shared_expert_ffn_hidden_size() : 0;
  const p::Gate* gate = FromWire(kGates, moe.gate());
  if (gate == nullptr) {
    return absl::InvalidArgumentError(
        Cat("moe.gate: must be GATE_TOP_K, GATE_SWITCH or GATE_BATCH_PRIORITIZED (got ",
            static_cast<int>(moe.gate()), ")"));
  }
  out.moe.gate = *gate;
  MOEPLAN_ASSIGN_OR_RETURN(out.parallel, ParallelFromProto(m.parallel()));
  out.global_batch_size = m.has_global_batch_size() ? m.global_batch_size() : 0;
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
  v1::MoeConfig* moe = out.mutable_moe();
  moe->set_layer_freq(m.moe.layer_freq);
  moe->set_num_experts(static_cast<int32_t>(m.moe.num_experts));
  moe->set_top_k(static_cast<int32_t>(m.moe.top_k));
  moe->set_capacity_factor(m.moe.capacity_factor);
  moe->set_expert_ffn_hidden_size(static_cast<int32_t>(m.moe.expert_ffn_hidden_size));
  moe->set_shared_expert_ffn_hidden_size(static_cast<int32_t>(m.moe.shared_expert_ffn_hidden_size));
  moe->set_gate(ToWire(kGates, m.moe.gate, v1::GATE_UNSPECIFIED));
  v1::ParallelLayout* par = out.mutable_parallel();
  par->set_mp(m.parallel.mp);
  par->set_ep(m.parallel.ep);
  par->set_esp(m.parallel.esp);
  par->set_dp(m.parallel.dp);
  par->set_pp(m.parallel.pp);
  if (m.global_batch_size > 0) out.set_global_batch_size(static_cast<int32_t>(m.global_batch_size));
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
              "]: must be ALLTOALL_ALGORITHM_LINEAR or ALLTOALL_ALGORITHM_HIERARCHICAL (got ",
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

absl::StatusOr<v1::Layout> LayoutFromSpec(std::string_view spec) {
  v1::Layout l;
  static constexpr std::string_view kKeys =
      "dp, tp, pp, ep, esp, microbatches, zero, family, pipeline, v, recompute";
  std::vector<std::string> seen;
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t end = std::min(spec.find(',', begin), spec.size());
    const std::string item(spec.substr(begin, end - begin));
    begin = end + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          Cat("--layout: expected key=value, got '", item, "' (keys: ", kKeys, ")"));
    }
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return absl::InvalidArgumentError(Cat("--layout: '", key, "' given twice"));
    }
    seen.push_back(key);
    if (key == "family") {
      l.set_family(value);
      continue;
    }
    if (key == "pipeline") {
      l.set_pipeline(value);
      continue;
    }
    int n = 0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || ptr != value.data() + value.size()) {
      return absl::InvalidArgumentError(
          Cat("--layout: ", key, " must be an integer (got '", value, "')"));
    }
    if (key == "dp") {
      l.set_dp(n);
    } else if (key == "tp") {
      l.set_tp(n);
    } else if (key == "pp") {
      l.set_pp(n);
    } else if (key == "ep") {
      l.set_ep(n);
    } else if (key == "esp") {
      l.set_esp(n);
    } else if (key == "microbatches") {
      l.set_microbatches(n);
    } else if (key == "zero") {
      l.set_zero_stage(n);
    } else if (key == "v") {
      l.set_virtual_stages(n);
    } else if (key == "recompute") {
      if (n != 0 && n != 1) {
        return absl::InvalidArgumentError(Cat("--layout: recompute must be 0 or 1 (got ", n, ")"));
      }
      l.set_recompute(n == 1);
    } else {
      return absl::InvalidArgumentError(
          Cat("--layout: unknown key '", key, "' (keys: ", kKeys, ")"));
    }
  }
  for (std::string_view need : {"dp", "tp", "pp", "ep", "esp"}) {
    if (std::find(seen.begin(), seen.end(), need) == seen.end()) {
      return absl::InvalidArgumentError(Cat("--layout: ", need, "= is required"));
    }
  }
  return l;
}

absl::StatusOr<p::Layout> LayoutFromProto(const v1::Layout& m) {
  p::Layout l;
  l.dp = m.dp();
  l.tp = m.tp();
  l.pp = m.pp();
  l.ep = m.ep();
  l.esp = m.esp();
  l.microbatches = m.microbatches();
  l.zero_stage = m.zero_stage();
  l.virtual_stages = m.virtual_stages() == 0 ? 1 : m.virtual_stages();
  l.recompute = m.recompute();
  if (m.family().empty()) {
    l.family = p::InferFamily(l);
  } else if (!p::ParseFamily(m.family(), &l.family)) {
    return absl::InvalidArgumentError(
        Cat("layout.family: must be dpmoe, ppmoe or parm (got '", m.family(), "')"));
  }
  if (m.pipeline().empty()) {
    l.pipeline =
        l.virtual_stages > 1 ? p::PipelineSchedule::kInterleaved : p::PipelineSchedule::k1F1B;
  } else if (!p::ParsePipelineSchedule(m.pipeline(), &l.pipeline)) {
    return absl::InvalidArgumentError(
        Cat("layout.pipeline: must be gpipe, 1f1b or interleaved (got '", m.pipeline(), "')"));
  }
  return l;
}

v1::Layout LayoutToProto(const p::Layout& l, int64_t micro_batch_size) {
  v1::Layout o;
  o.set_dp(l.dp);
  o.set_tp(l.tp);
  o.set_pp(l.pp);
  o.set_ep(l.ep);
  o.set_esp(l.esp);
  o.set_microbatches(l.microbatches);
  o.set_zero_stage(l.zero_stage);
  o.set_family(std::string(p::FamilyName(l.family)));
  o.set_pipeline(std::string(p::PipelineScheduleName(l.pipeline)));
  o.set_virtual_stages(l.virtual_stages);
  o.set_recompute(l.recompute);
  o.set_micro_batch_size(static_cast<int32_t>(micro_batch_size));
  return o;
}

p::MemoryOptions MemoryFromProto(const v1::MemoryOptions& m) {
  p::MemoryOptions o;
  if (m.has_param_bytes()) o.param_bytes = m.param_bytes();
  if (m.has_grad_bytes()) o.grad_bytes = m.grad_bytes();
  if (m.has_optimizer_bytes()) o.optimizer_bytes = m.optimizer_bytes();
  if (m.has_gpu_memory_gib()) o.gpu_memory_bytes = m.gpu_memory_gib() * 1024.0 * 1024.0 * 1024.0;
  return o;
}

absl::StatusOr<p::SearchOptions> SearchFromProto(const v1::SearchOptions& m) {
  p::SearchOptions o;
  if (m.has_top()) o.top = m.top();
  if (m.has_gpus()) o.gpus = m.gpus();
  for (const std::string& f : m.families()) {
    p::Family fam;
    if (!p::ParseFamily(f, &fam)) {
      return absl::InvalidArgumentError(
          Cat("search.families: each must be dpmoe, ppmoe or parm (got '", f, "')"));
    }
    if (std::find(o.families.begin(), o.families.end(), fam) != o.families.end()) {
      return absl::InvalidArgumentError(Cat("search.families: each may be listed once (", f, ")"));
    }
    o.families.push_back(fam);
  }
  for (const std::string& name : m.pipelines()) {
    p::PipelineSchedule ps;
    if (!p::ParsePipelineSchedule(name, &ps)) {
      return absl::InvalidArgumentError(
          Cat("search.pipelines: each must be gpipe, 1f1b or interleaved (got '", name, "')"));
    }
    if (std::find(o.pipelines.begin(), o.pipelines.end(), ps) != o.pipelines.end()) {
      return absl::InvalidArgumentError(
          Cat("search.pipelines: each may be listed once (", name, ")"));
    }
    o.pipelines.push_back(ps);
  }
  o.zero_stages.assign(m.zero_stages().begin(), m.zero_stages().end());
  if (m.has_max_microbatches()) o.max_microbatches = m.max_microbatches();
  if (!m.virtual_stages().empty()) {
    o.virtual_stages.assign(m.virtual_stages().begin(), m.virtual_stages().end());
  }
  o.exhaustive = m.exhaustive();
  MOEPLAN_RETURN_IF_ERROR(p::ValidateSearchOptions(o));
  return o;
}

void CandidateToProto(const p::LayoutCandidate& c, int rank, v1::LayoutCandidate* o) {
  *o->mutable_layout() = LayoutToProto(c.layout, c.micro_batch_size);
  o->set_family(std::string(p::FamilyName(c.layout.family)));
  o->set_feasible(c.feasible);
  o->set_infeasible_reason(c.infeasible_reason);
  o->set_iteration_us(c.iteration_us);
  o->set_tokens_per_s_per_gpu(c.tokens_per_s_per_gpu);
  o->set_memory_bytes_per_gpu(std::round(c.memory.total));
  v1::MemoryBreakdown* m = o->mutable_memory();
  auto b = [](double x) { return std::round(x); };
  m->set_params_bytes(b(c.memory.params));
  m->set_grads_bytes(b(c.memory.grads));
  m->set_optimizer_bytes(b(c.memory.optimizer));
  m->set_activations_bytes(b(c.memory.activations));
  m->set_capacity_buffer_bytes(b(c.memory.capacity_buffers));
  m->set_total_bytes(b(c.memory.total));
  m->set_limit_bytes(b(c.memory.limit));
  m->set_in_flight_microbatches(c.memory.in_flight);
  m->set_activation_bytes_per_microbatch(b(c.memory.activation_per_microbatch));
  m->set_stage(c.memory.stage);
  o->set_variant(std::string(p::VariantName(c.variant)));
  o->set_schedule(ScheduleToProto(c.schedule));
  o->set_alltoall(AllToAllAlgoToProto(c.algo));
  o->set_compute_us(c.compute_us);
  for (const p::CandidateTerm& t : c.exposed_comm) {
    v1::TermTime* tt = o->add_exposed_comm();
    tt->set_term(std::string(p::TermName(t.term)));
    tt->set_us(t.us);
  }
  o->set_grad_sync_us(c.grad_sync_us);
  o->set_optimizer_us(c.optimizer_us);
  o->set_bubble_us(c.bubble_us);
  o->set_bubble_fraction(c.bubble_fraction);
  o->set_stage_forward_us(c.stage_forward_us);
  o->set_stage_backward_us(c.stage_backward_us);
  o->set_rank(rank);
}

}  // namespace moeplan::proto
