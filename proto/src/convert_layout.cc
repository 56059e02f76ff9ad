// The codec of layouts (docs/layouts.md): --layout specs, layouts, memory
// and search options, candidates.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "convert_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/proto/convert.h"

namespace moeplan::proto {

namespace p = ::moeplan::planner;

namespace {

// An integer --layout key's field set to `n`; false for an unknown key.
bool SetIntegerKey(std::string_view key, int n, v1::Layout* l) {
  if (key == "dp") {
    l->set_dp(n);
  } else if (key == "tp") {
    l->set_tp(n);
  } else if (key == "pp") {
    l->set_pp(n);
  } else if (key == "cp") {
    l->set_cp(n);
  } else if (key == "ep") {
    l->set_ep(n);
  } else if (key == "esp" || key == "etp") {
    l->set_esp(n);
  } else if (key == "microbatches") {
    l->set_microbatches(n);
  } else if (key == "zero") {
    l->set_zero_stage(n);
  } else if (key == "v") {
    l->set_virtual_stages(n);
  } else if (key == "recompute") {
    l->set_recompute(n == 1);
  } else if (key == "sp") {
    l->set_sequence_parallel(n == 1);
  } else if (key == "a2a_overlap") {
    l->set_a2a_overlap(n == 1);
  } else if (key == "overlap_param_gather") {
    l->set_overlap_param_gather(n == 1);
  } else if (key == "tp_comm_overlap") {
    l->set_tp_comm_overlap(n == 1);
  } else {
    return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<v1::Layout> LayoutFromSpec(std::string_view spec) {
  v1::Layout l;
  static constexpr std::string_view kKeys =
      "dp, tp, cp, pp, ep, esp (or etp), microbatches, zero, family, pipeline, v, recompute (0, 1 "
      "or modules joined by +), sp, "
      "a2a_overlap, overlap_param_gather, tp_comm_overlap, dispatcher, layout (last)";
  std::vector<std::string> seen;
  size_t begin = 0;
  while (begin <= spec.size()) {
    // layout= (a pipeline layout, which may hold commas) takes the rest.
    const bool rest = spec.substr(begin, 7) == "layout=";
    const size_t end = rest ? spec.size() : std::min(spec.find(',', begin), spec.size());
    const std::string item(spec.substr(begin, end - begin));
    begin = end + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          Cat("--layout: expected key=value, got ", Quoted(item), " (keys: ", kKeys, ")"));
    }
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return absl::InvalidArgumentError(Cat("--layout: ", Quoted(key), " given twice"));
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
    if (key == "dispatcher") {
      l.set_dispatcher(value);
      continue;
    }
    if (key == "layout") {
      l.set_pipeline_model_parallel_layout(value);
      continue;
    }
    if (key == "recompute" && value != "0" && value != "1") {
      // Selective: Megatron-Core's module names joined by '+'.
      for (absl::string_view name : absl::StrSplit(value, '+')) {
        l.add_recompute_modules(std::string(name));
      }
      continue;
    }
    int n = 0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || ptr != value.data() + value.size()) {
      return absl::InvalidArgumentError(
          Cat("--layout: ", key, " must be an integer (got ", Quoted(value), ")"));
    }
    if (key == "esp" || key == "etp") {
      // etp: Megatron-Core's --expert-tensor-parallel-size, the same degree.
      if (std::find(seen.begin(), seen.end(), key == "esp" ? "etp" : "esp") != seen.end()) {
        return absl::InvalidArgumentError(
            "--layout: esp and etp name the same degree (etp is Megatron-Core's name); give one");
      }
    }
    if (!SetIntegerKey(key, n, &l)) {
      return absl::InvalidArgumentError(
          Cat("--layout: unknown key ", Quoted(key), " (keys: ", kKeys, ")"));
    }
    if ((key == "recompute" || key == "sp" || key == "a2a_overlap" ||
         key == "overlap_param_gather" || key == "tp_comm_overlap") &&
        n != 0 && n != 1) {
      return absl::InvalidArgumentError(Cat("--layout: ", key, " must be 0 or 1 (got ", n, ")"));
    }
  }
  // ep and esp may be left out: 1, as in a layout message (LayoutFromProto).
  for (std::string_view need : {"dp", "tp", "pp"}) {
    if (std::find(seen.begin(), seen.end(), need) == seen.end()) {
      return absl::InvalidArgumentError(Cat("--layout: ", need, "= is required"));
    }
  }
  return l;
}

std::string LayoutToSpec(const v1::Layout& l) {
  std::string s = Cat("dp=", l.dp(), ",tp=", l.tp(), ",pp=", l.pp());
  auto number = [&](std::string_view key, int n) {
    if (n != 0) s += Cat(",", key, "=", n);
  };
  number("ep", l.ep());
  number("esp", l.esp());
  auto text = [&](std::string_view key, const std::string& v) {
    if (!v.empty()) s += Cat(",", key, "=", v);
  };
  number("cp", l.cp());
  number("microbatches", l.microbatches());
  number("zero", l.zero_stage());
  text("family", l.family());
  text("pipeline", l.pipeline());
  number("v", l.virtual_stages());
  if (l.recompute()) {
    s += ",recompute=1";
  } else if (l.recompute_modules_size() > 0) {
    s += Cat(",recompute=", absl::StrJoin(l.recompute_modules(), "+"));
  }
  number("sp", l.sequence_parallel() ? 1 : 0);
  number("a2a_overlap", l.a2a_overlap() ? 1 : 0);
  number("overlap_param_gather", l.overlap_param_gather() ? 1 : 0);
  number("tp_comm_overlap", l.tp_comm_overlap() ? 1 : 0);
  text("dispatcher", l.dispatcher());
  text("layout", l.pipeline_model_parallel_layout());  // last: it may hold commas
  return s;
}

absl::StatusOr<p::Layout> LayoutFromProto(const v1::Layout& m) {
  p::Layout l;
  l.dp = m.dp();
  l.tp = m.tp();
  l.pp = m.pp();
  // Unset (0): 1, Megatron-Core's default (every rank holds every expert whole).
  l.ep = m.ep() == 0 ? 1 : m.ep();
  l.esp = m.esp() == 0 ? 1 : m.esp();
  l.cp = m.cp() == 0 ? 1 : m.cp();
  l.microbatches = m.microbatches();
  l.zero_stage = m.zero_stage();
  l.virtual_stages = m.virtual_stages() == 0 ? 1 : m.virtual_stages();
  l.recompute = m.recompute();
  for (const std::string& name : m.recompute_modules()) {
    uint8_t bit = 0;
    if (!p::ParseRecomputeModule(name, &bit)) {
      return absl::InvalidArgumentError(
          Cat("layout.recompute_modules: each must be core_attn, layernorm, mlp, moe_act, "
              "shared_experts or mla_up_proj (got ",
              Quoted(name), ")"));
    }
    if (l.recompute_modules & bit) {
      return absl::InvalidArgumentError(
          Cat("layout.recompute_modules: each may be listed once (got ", Quoted(name), " twice)"));
    }
    l.recompute_modules |= bit;
  }
  l.sequence_parallel = m.sequence_parallel();
  l.a2a_overlap = m.a2a_overlap();
  l.overlap_param_gather = m.overlap_param_gather();
  l.tp_comm_overlap = m.tp_comm_overlap();
  if (!m.dispatcher().empty() && !p::ParseDispatcher(m.dispatcher(), &l.dispatcher)) {
    return absl::InvalidArgumentError(
        Cat("layout.dispatcher: must be alltoall, deepep or allgather (got ",
            Quoted(m.dispatcher()), ")"));
  }
  if (!m.pipeline_model_parallel_layout().empty()) {
    absl::StatusOr<std::vector<p::PipelineStageLayers>> stages =
        p::ParsePipelineLayout(m.pipeline_model_parallel_layout());
    if (!stages.ok()) {
      return absl::InvalidArgumentError(Cat("layout.", View(stages.status().message())));
    }
    l.stage_layers = *std::move(stages);
    // Unset virtual stages: as many as the layout names per pipeline rank
    // (ValidateLayout checks what is left over).
    const int n = static_cast<int>(l.stage_layers.size());
    if (m.virtual_stages() == 0 && l.pp > 0 && n % l.pp == 0) l.virtual_stages = n / l.pp;
  }
  if (m.family().empty()) {
    l.family = p::InferFamily(l);
  } else if (!p::ParseFamily(m.family(), &l.family)) {
    return absl::InvalidArgumentError(
        Cat("layout.family: must be dpmoe, ppmoe or parm (got ", Quoted(m.family()), ")"));
  }
  if (m.pipeline().empty()) {
    l.pipeline =
        l.virtual_stages > 1 ? p::PipelineSchedule::kInterleaved : p::PipelineSchedule::k1F1B;
  } else if (!p::ParsePipelineSchedule(m.pipeline(), &l.pipeline)) {
    return absl::InvalidArgumentError(
        Cat("layout.pipeline: must be gpipe, 1f1b, interleaved or dualpipe (got ",
            Quoted(m.pipeline()), ")"));
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
  o.set_cp(l.cp);
  o.set_microbatches(l.microbatches);
  o.set_zero_stage(l.zero_stage);
  o.set_family(std::string(p::FamilyName(l.family)));
  o.set_pipeline(std::string(p::PipelineScheduleName(l.pipeline)));
  o.set_virtual_stages(l.virtual_stages);
  o.set_recompute(l.recompute);
  for (int i = 0; i < p::kNumRecomputeModules; ++i) {
    if (l.recompute_modules & (1u << i))
      o.add_recompute_modules(std::string(p::RecomputeModuleName(i)));
  }
  o.set_sequence_parallel(l.sequence_parallel);
  o.set_a2a_overlap(l.a2a_overlap);
  o.set_overlap_param_gather(l.overlap_param_gather);
  o.set_tp_comm_overlap(l.tp_comm_overlap);
  o.set_dispatcher(std::string(p::DispatcherName(l.dispatcher)));
  o.set_micro_batch_size(static_cast<int32_t>(micro_batch_size));
  if (!l.stage_layers.empty()) {
    o.set_pipeline_model_parallel_layout(p::FormatPipelineLayout(l.stage_layers));
  }
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
          Cat("search.families: each must be dpmoe, ppmoe or parm (got ", Quoted(f), ")"));
    }
    if (std::find(o.families.begin(), o.families.end(), fam) != o.families.end()) {
      return absl::InvalidArgumentError(
          Cat("search.families: each may be listed once (got ", Quoted(f), " twice)"));
    }
    o.families.push_back(fam);
  }
  for (const std::string& name : m.pipelines()) {
    p::PipelineSchedule ps;
    if (!p::ParsePipelineSchedule(name, &ps)) {
      return absl::InvalidArgumentError(
          Cat("search.pipelines: each must be gpipe, 1f1b, interleaved or dualpipe (got ",
              Quoted(name), ")"));
    }
    if (std::find(o.pipelines.begin(), o.pipelines.end(), ps) != o.pipelines.end()) {
      return absl::InvalidArgumentError(
          Cat("search.pipelines: each may be listed once (got ", Quoted(name), " twice)"));
    }
    o.pipelines.push_back(ps);
  }
  o.zero_stages.assign(m.zero_stages().begin(), m.zero_stages().end());
  if (m.has_max_microbatches()) o.max_microbatches = m.max_microbatches();
  if (!m.virtual_stages().empty()) {
    o.virtual_stages.assign(m.virtual_stages().begin(), m.virtual_stages().end());
  }
  o.exhaustive = m.exhaustive();
  o.overlap_param_gather = m.overlap_param_gather();
  o.tp_comm_overlap = m.tp_comm_overlap();
  o.record_points = m.include_points();
  // Only with include_timeline (the caller's): recorded there.
  if (m.has_timeline_top()) o.record_pipelines = m.timeline_top();
  o.sequence_parallel.assign(m.sequence_parallel().begin(), m.sequence_parallel().end());
  o.a2a_overlap.assign(m.a2a_overlap().begin(), m.a2a_overlap().end());
  o.balanced_pipeline.assign(m.balanced_pipeline().begin(), m.balanced_pipeline().end());
  for (const std::string& name : m.dispatchers()) {
    p::Dispatcher d;
    if (!p::ParseDispatcher(name, &d)) {
      return absl::InvalidArgumentError(
          Cat("search.dispatchers: each must be alltoall, deepep or allgather (got ", Quoted(name),
              ")"));
    }
    o.dispatchers.push_back(d);
  }
  o.context_parallel.assign(m.context_parallel().begin(), m.context_parallel().end());
  o.expert_tensor_parallel.assign(m.expert_tensor_parallel().begin(),
                                  m.expert_tensor_parallel().end());
  MOEPLAN_RETURN_IF_ERROR(p::ValidateSearchOptions(o));
  return o;
}

namespace {

void PipeSpanToProto(const p::PipeSpan& s, v1::PipelineSpan* o) {
  using Kind = p::PipeSpan::Kind;
  const bool fwd = s.step.forward;
  o->set_kind(s.kind == Kind::kPair   ? "forward_backward"
              : s.kind == Kind::kTail ? "tail"
              : s.kind == Kind::kSend ? (fwd ? "send_forward" : "send_backward")
                                      : (fwd ? "forward" : "backward"));
  o->set_stage(s.stage);
  if (s.kind != Kind::kTail) {
    o->set_chunk(s.step.chunk);
    o->set_microbatch(s.step.mb);
  }
  if (s.kind == Kind::kPair) {
    o->set_backward_chunk(s.paired.chunk);
    o->set_backward_microbatch(s.paired.mb);
  }
  o->set_start_us(s.start_us);
  o->set_end_us(s.end_us);
}

}  // namespace

void CandidateToProto(const p::LayoutCandidate& c, int rank, v1::LayoutCandidate* o) {
  *o->mutable_layout() = LayoutToProto(c.layout, c.micro_batch_size);
  o->set_family(std::string(p::FamilyName(c.layout.family)));
  o->set_feasible(c.feasible);
  o->set_infeasible_reason(c.infeasible_reason);
  o->set_iteration_us(c.iteration_us);
  o->set_tokens_per_s_per_gpu(c.tokens_per_s_per_gpu);
  o->set_tflops_per_gpu(c.tflops_per_gpu);
  o->set_mfu(c.mfu);
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
  o->set_overlap_hidden_us(c.overlap_hidden_us);
  o->set_recompute_us(c.recompute_us);
  o->set_rank(rank);
  o->mutable_pipeline()->Reserve(static_cast<int>(c.pipeline.size()));
  for (const p::PipeSpan& s : c.pipeline) PipeSpanToProto(s, o->add_pipeline());
}

}  // namespace moeplan::proto
