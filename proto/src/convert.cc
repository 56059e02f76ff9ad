#include "moeplan/proto/convert.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "convert_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/proto/json.h"

namespace moeplan::proto {

namespace p = ::moeplan::planner;

absl::StatusOr<p::ParallelLayout> ParallelFromProto(const v1::ParallelLayout& par) {
  p::ParallelLayout out;
  out.mp = par.mp();
  out.ep = par.ep();
  out.esp = par.esp();
  out.pp = par.has_pp() ? par.pp() : 1;
  out.sequence_parallel = par.sequence_parallel();
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
// them: bounded, so that a name cannot multiply into gigabytes, and free of
// control characters, which would reach a terminal (escaped in JSON, "\u001b",
// they are valid JSON; a binary request needs no escape at all).
absl::Status CheckName(const std::string& name) {
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        Cat("name: must be at most ", kMaxNameBytes, " bytes (got ", name.size(), ")"));
  }
  if (FindControlCharacter(name) != std::string::npos) {
    return absl::InvalidArgumentError(
        Cat("name: must not contain control characters (got ", Quoted(name), ")"));
  }
  return absl::OkStatus();
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
  l.gated_linear_unit = m.gated_linear_unit();
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
  m.set_gated_linear_unit(l.gated_linear_unit);
  v1::ParallelLayout* par = m.mutable_parallel();
  par->set_mp(l.parallel.mp);
  par->set_ep(l.parallel.ep);
  par->set_esp(l.parallel.esp);
  par->set_dp(l.parallel.dp);
  par->set_pp(l.parallel.pp);
  return m;
}

using internal::FromWire;
using internal::kCollectives;
using internal::kSchedules;
using internal::ToWire;

namespace {

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

absl::Status GemmFromProto(const v1::GemmModel& m, p::GemmModel* out) {
  out->peak_tflops = m.peak_tflops();
  out->launch_overhead_us = m.launch_overhead_us();
  if (m.has_fp8_peak_tflops()) {
    // 0 means unset in the planner, so an explicit 0 is refused here, not dropped.
    if (m.fp8_peak_tflops() == 0.0) {
      return absl::InvalidArgumentError(
          "gemm.fp8_peak_tflops: must be > 0 and <= 1e6 when set (leave it unset for no FP8 "
          "peak) (got 0)");
    }
    out->fp8_peak_tflops = m.fp8_peak_tflops();
  }
  out->grid.m.assign(m.m().begin(), m.m().end());
  out->grid.n.assign(m.n().begin(), m.n().end());
  out->grid.k.assign(m.k().begin(), m.k().end());
  out->grid.efficiency.assign(m.efficiency().begin(), m.efficiency().end());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<p::ClusterProfile> ProfileFromProto(const v1::ClusterProfile& m) {
  if (m.schema_version() > 1) {
    return absl::InvalidArgumentError(
        Cat("schema_version: must be 1 (got ", m.schema_version(), ")"));
  }
  // Comments, citations and provenance reach tables and report.md.
  MOEPLAN_RETURN_IF_ERROR(CheckText(m));
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
  MOEPLAN_RETURN_IF_ERROR(GemmFromProto(m.gemm(), &pr.gemm));
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

namespace internal {

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

}  // namespace internal

using internal::AddCriticalTerms;
using internal::AddOpTimings;

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

}  // namespace moeplan::proto
