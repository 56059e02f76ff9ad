// moeplan-exec --model: a whole model's overlap variants, each planned with
// the prediction's cost model on the job's own shape (ranks, hosts), run by
// the plan interpreter (ModelRunner) and reported next to the prediction in
// plan-model's shape (moeplan.v1.ExecModelReport).
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "exec_common.h"
#include "exec_model_check.h"
#include "exec_report.h"
#include "moeplan/base/stats.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/model_runner.h"
#include "moeplan/executor/mpi_job.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/replan.h"
#include "moeplan/requests/replay.h"

namespace moeplan::exec {
namespace {

namespace ex = executor;
namespace p = planner;

struct ModelSetup {
  p::ModelConfig model;
  v1::ModelConfig model_msg;
  ex::DType dtype = ex::DType::kF32;
  std::vector<p::Variant> variants;
  bool auto_variant = false;
  std::optional<v1::PlanModelResponse> saved;  // --plan
  std::optional<p::Layout> layout;             // --layout
  p::ModelConfig run_model;                    // --layout: the model as each stage runs it
  // --check: the layout held against, its model as each stage runs it and
  // its variants' plans (PlanVariants).
  std::optional<p::Layout> reference;
  p::ModelConfig reference_model;
  std::vector<p::VariantPlan> reference_plans;
};

// --plan's variant `name`.
const v1::VariantPlan* SavedVariant(const v1::PlanModelResponse& saved, std::string_view name) {
  for (const v1::VariantPlan& v : saved.variants()) {
    if (v.name() == name) return &v;
  }
  return nullptr;
}

// --plan: a variants plan saved by plan-model --format json, with its model.
absl::Status ReadSavedPlan(const std::string& file, ModelSetup* s) {
  v1::PlanModelResponse saved;
  MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(file, &saved));
  auto bad = [&](std::string_view why) { return absl::InvalidArgumentError(Cat(file, ": ", why)); };
  if (saved.candidates_size() > 0) {
    // Its layouts run as programs from the model (--layout); say the spec.
    return bad(
        Cat("candidates: a layout or search plan is not run from the file; run its first "
            "layout with --model MODEL.json --layout ",
            proto::LayoutToSpec(saved.candidates(0).layout())));
  }
  if (!saved.has_model()) {
    return bad("model: not set (save the plan with moeplan plan-model --format json)");
  }
  if (saved.variants().empty()) return bad("variants: the plan holds none");
  for (int i = 0; i < saved.variants_size(); ++i) {
    const v1::VariantPlan& v = saved.variants(i);
    p::Variant variant;
    if (!p::ParseVariant(v.name(), &variant)) {
      return bad(Cat("variants[", i, "].name: must be none, tutel, dw, partition or lancet (got '",
                     v.name(), "')"));
    }
    if (v.alltoall() == v1::ALLTOALL_ALGORITHM_HIERARCHICAL) {
      return bad(Cat("variants[", i, "].alltoall: ", v.name(),
                     " uses the hierarchical AlltoAll (2dh), which the executor cannot run yet"));
    }
  }
  s->model_msg = saved.model();
  s->saved = std::move(saved);
  return absl::OkStatus();
}

// Everything that can be checked without talking to other ranks.
absl::Status Prepare(const Args& a, int hosts, ModelSetup* s) {
  MOEPLAN_RETURN_IF_ERROR(CheckRunFlags(a));
  const std::string& file = a.plan.empty() ? a.model : a.plan;
  if (a.plan.empty()) {
    MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(a.model, &s->model_msg));
  } else {
    MOEPLAN_RETURN_IF_ERROR(ReadSavedPlan(a.plan, s));
  }
  const std::string model_field = a.plan.empty() ? "" : "model.";
  auto in_file = [&](const absl::Status& st) {
    return absl::Status(st.code(), Cat(file, ": ", model_field, View(st.message())));
  };
  absl::StatusOr<p::ModelConfig> model = proto::ModelFromProto(s->model_msg);
  if (!model.ok()) return in_file(model.status());
  s->model = *model;
  MOEPLAN_RETURN_IF_ERROR(ResolveDType(a, s->model.bytes_per_element, file, &s->dtype));
  // What runs is what is predicted: the element size follows the dtype.
  s->model.bytes_per_element = static_cast<int>(ex::SizeOf(s->dtype));
  s->model_msg = proto::ModelToProto(s->model);
  const int world = ex::WorldSize();
  const p::ClusterShape cluster =
      world % hosts == 0 ? p::ClusterShape{hosts, world / hosts} : p::ClusterShape{1, world};
  if (!a.layout.empty()) {
    // The layout's rules are checked when its program is built (every rank).
    absl::StatusOr<p::Layout> layout = LayoutOfFlag("--layout", a.layout);
    if (!layout.ok()) return layout.status();
    s->layout = *layout;
    if (absl::Status st = p::ValidateModelShape(s->model); !st.ok()) return in_file(st);
    if (a.check) {
      absl::StatusOr<p::Layout> ref = CheckReference(a, s->model, *layout);
      if (!ref.ok()) return ref.status();
      s->reference = *ref;
    }
  } else {
    if (s->model.parallel.pp > 1) {
      return in_file(absl::InvalidArgumentError(
          Cat("parallel.pp: a pipelined model runs as a layout's program: pass --layout "
              "(e.g. dp=2,tp=1,pp=2,ep=2,esp=1,microbatches=4) (got pp=",
              s->model.parallel.pp, ")")));
    }
    if (absl::Status st = ex::ValidateModelForExecutor(s->model, world); !st.ok()) {
      return in_file(st);
    }
    if (absl::Status st = p::ValidateModel(s->model, cluster); !st.ok()) return in_file(st);
  }
  if (s->saved.has_value()) {
    // The saved plan's variants: all of them, its best (auto), or one it holds.
    std::string held;
    for (const v1::VariantPlan& v : s->saved->variants()) {
      if (a.variant == "all" || (a.variant == "auto" && v.name() == s->saved->best_variant()) ||
          a.variant == v.name()) {
        p::Variant variant;
        p::ParseVariant(v.name(), &variant);  // checked by ReadSavedPlan
        s->variants.push_back(variant);
      }
      held += Cat(held.empty() ? "" : ", ", v.name());
    }
    if (s->variants.empty()) {
      return absl::InvalidArgumentError(
          Cat("--variant: ",
              a.variant == "auto" ? Cat("auto (", s->saved->best_variant(), ")") : a.variant,
              " is not in ", a.plan, " (it holds ", held, ")"));
    }
  } else if (a.variant == "all" || a.variant == "auto") {
    s->variants.assign(std::begin(p::kAllVariants), std::end(p::kAllVariants));
    s->auto_variant = a.variant == "auto";
  } else {
    p::Variant v;
    if (!p::ParseVariant(a.variant, &v)) {
      return absl::InvalidArgumentError(
          Cat("--variant: must be none, tutel, dw, partition, lancet, auto or all (got ", a.variant,
              ")"));
    }
    s->variants = {v};
  }
  return absl::OkStatus();
}

struct Run {
  p::Variant variant = p::Variant::kNone;
  std::vector<ex::OpTime> ops;
  std::vector<IterationTimes> iterations;  // rank 0 only
  std::vector<double> scratch;
};

std::unique_ptr<ex::ModelRunner> CreateRunner(const Args& a, const p::ModelConfig& model,
                                              ex::DType dtype, const p::VariantPlan& plan,
                                              ex::Backend& b) {
  ex::RunOptions opt;
  opt.dtype = dtype;
  opt.seed = a.seed;
  opt.plan_name = Cat(model.name, "'s ", p::VariantName(plan.variant), " plan");
  // What this rank's buffers may take, read now (runners already alive hold theirs).
  SetMemoryLimit(a, *b.device, &opt);
  absl::StatusOr<std::unique_ptr<ex::ModelRunner>> runner = ex::ModelRunner::Create(
      model, plan.graph, opt, b.device.get(), b.kernels.get(), b.world.get());
  if (absl::Status st = Agree(runner.status()); !st.ok()) {
    MPI_Finalize();  // every rank agreed to stop here
    std::exit(1);
  }
  return *std::move(runner);
}

void Warm(ex::ModelRunner& r) {
  if (absl::Status st = r.RunIteration(); !st.ok()) Abort(st);
}

void TimeIteration(const Args& a, int it, ex::ModelRunner& r, ex::SpeedProbe& probe, Run* run) {
  if (absl::Status st = r.RunIteration(); !st.ok()) Abort(st);
  GatherIteration(it, r.timings(), r.forward_us(), r.total_us(), Probe(probe), &run->scratch,
                  &run->iterations);
  if (it + 1 == a.iters) run->ops = r.timings();
}

// Every variant, in order. Interleaved (the default with more than one):
// every runner is built first, then round i runs iteration i of each variant
// back to back, starting one variant later each round, so machine drift lands
// on every variant alike and entry i of two variants are paired samples.
// Sequential: one runner alive at a time (less memory).
std::vector<Run> MeasureAll(const Args& a, const ModelSetup& s,
                            const std::vector<p::VariantPlan>& plans, ex::Backend& b) {
  const size_t n = plans.size();
  std::vector<Run> runs(n);
  for (size_t j = 0; j < n; ++j) runs[j].variant = plans[j].variant;
  absl::StatusOr<ex::SpeedProbe> probe =
      ex::SpeedProbe::Create(b.device.get(), b.kernels.get(), s.dtype);
  if (!probe.ok()) Abort(probe.status());
  if (a.sequential || n == 1) {
    for (size_t j = 0; j < n; ++j) {
      std::unique_ptr<ex::ModelRunner> r = CreateRunner(a, s.model, s.dtype, plans[j], b);
      for (int i = 0; i < a.warmup; ++i) Warm(*r);
      for (int it = 0; it < a.iters; ++it) TimeIteration(a, it, *r, *probe, &runs[j]);
    }
    return runs;
  }
  std::vector<std::unique_ptr<ex::ModelRunner>> runners;
  runners.reserve(n);
  for (const p::VariantPlan& plan : plans)
    runners.push_back(CreateRunner(a, s.model, s.dtype, plan, b));
  for (int i = 0; i < a.warmup; ++i) {
    for (auto& r : runners) Warm(*r);
  }
  for (int it = 0; it < a.iters; ++it) {
    for (size_t k = 0; k < n; ++k) {
      const size_t j = (static_cast<size_t>(it) + k) % n;
      TimeIteration(a, it, *runners[j], *probe, &runs[j]);
    }
  }
  return runs;
}

v1::CandidatePlan OpsOf(const v1::VariantPlan& v) {
  v1::CandidatePlan c;
  *c.mutable_ops() = v.ops();
  return c;
}

// The measured run in plan-model's VariantPlan shape.
v1::VariantPlan MeasuredVariant(const v1::VariantPlan& predicted, const Run& run) {
  const v1::CandidatePlan pred = OpsOf(predicted);
  const v1::CandidatePlan c =
      MeasuredCandidate(predicted.schedule(), run.ops, run.iterations, &pred);
  v1::VariantPlan m;
  m.set_name(predicted.name());
  m.set_iteration_us(c.total_us());
  m.set_forward_us(c.forward_us());
  m.set_backward_us(c.backward_us());
  m.set_compute_us(c.compute_us());
  m.set_comm_us(c.comm_us());
  m.set_hidden_comm_us(c.hidden_comm_us());
  m.set_exposed_comm_us(c.exposed_comm_us());
  m.set_tutel_degree(predicted.tutel_degree());
  m.set_schedule(predicted.schedule());
  m.set_alltoall(predicted.alltoall());
  *m.mutable_layers() = predicted.layers();
  *m.mutable_partition_ranges() = predicted.partition_ranges();
  *m.mutable_dw_placements() = predicted.dw_placements();
  m.set_num_ops(c.ops_size());
  *m.mutable_ops() = c.ops();
  return m;
}

// Every measured variant's op timeline (median durations), each with the
// request that plans it again (pinned to what ran), as reports against the
// profile the prediction used.
absl::StatusOr<std::vector<v1::ReportMeasurementRequest>> ModelReports(
    const calibration::LoadedProfile& profile, const v1::ExecModelReport& report) {
  std::vector<v1::ReportMeasurementRequest> out;
  for (int i = 0; i < report.measured().variants_size(); ++i) {
    const v1::VariantPlan& mv = report.measured().variants(i);
    v1::ReportMeasurementRequest& req = out.emplace_back();
    MOEPLAN_ASSIGN_OR_RETURN(
        *req.mutable_model_plan(),
        requests::PinnedModelRequest(report.model(), report.predicted().variants(i)));
    req.mutable_model_plan()->set_profile_name(profile.message.name());
    req.set_variant(mv.name());
    SetMeasuredOps(mv.ops(), &req);
    req.set_total_us(mv.iteration_us());
  }
  return out;
}

std::string RenderModelTable(const v1::ExecModelReport& r) {
  const v1::ModelConfig& m = r.model();
  std::string out = fmt::format(
      "model {}: {} blocks, hidden {}, {} heads, seq {}, micro-batch {}, {} | "
      "mp={} ep={} esp={} dp={} pp={}\n",
      m.name(), m.num_layers(), m.hidden_size(), m.num_attention_heads(), m.seq_length(),
      m.micro_batch_size(),
      m.has_moe() ? fmt::format("{} experts top-{}", m.moe().num_experts(), m.moe().top_k())
                  : std::string("dense"),
      m.parallel().mp(), m.parallel().ep(), m.parallel().esp(), m.parallel().dp(),
      std::max(1, m.parallel().pp()));
  if (r.has_layout()) {
    const v1::Layout& l = r.layout();
    out += fmt::format(
        "layout: {} pipeline{}, {} micro-batches of {} sequences, ZeRO {}\n", l.pipeline(),
        l.virtual_stages() > 1 ? fmt::format(" (v={})", l.virtual_stages()) : std::string(),
        l.microbatches(), l.micro_batch_size(), l.zero_stage());
  }
  out += fmt::format(
      "backend {} ({}), dtype {}, {} ranks on {} host(s), {} iterations after {} warm-up; "
      "profile {} v{}\n",
      r.backend(), r.versions(), r.dtype(), r.ranks(), r.hosts(), r.iters(), r.warmup(),
      r.predicted().profile_name(), r.predicted().profile_version());
  out += "times: median over iterations of the max over ranks, microseconds\n\n";
  out += fmt::format("  {:<10} {:>12} {:>12} {:>8} {:>12} {:>12} {:>12} {:>12} {:>6} {:>12}\n",
                     "variant", "predicted", "measured", "error", "fwd pred", "fwd meas",
                     "comm meas", "hidden meas", "ops", "replayed");
  for (int i = 0; i < r.measured().variants_size(); ++i) {
    const v1::VariantPlan& pv = r.predicted().variants(i);
    const v1::VariantPlan& mv = r.measured().variants(i);
    const double err = mv.iteration_us() > 0
                           ? 100.0 * (pv.iteration_us() - mv.iteration_us()) / mv.iteration_us()
                           : 0.0;
    const double replayed = i < r.replays_size() ? r.replays(i).replayed_us() : 0.0;
    out += fmt::format(
        "  {:<10} {:>12.1f} {:>12.1f} {:>7.1f}% {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>6} "
        "{:>12}\n",
        mv.name(), pv.iteration_us(), mv.iteration_us(), err, pv.forward_us(), mv.forward_us(),
        mv.comm_us(), mv.hidden_comm_us(), mv.num_ops(),
        replayed > 0.0 ? fmt::format("{:.1f}", replayed) : std::string("-"));
  }
  out +=
      "  (replayed: the measured op durations composed on the plan that ran; against measured, "
      "the composition error)\n";
  if (r.measured().variants_size() > 1) {
    out += fmt::format("\nfastest: predicted {}, measured {}\n", r.predicted().best_variant(),
                       r.measured().best_variant());
  }
  if (r.has_check()) out += RenderLayoutCheck(r.check());
  return out;
}

// --plan: what the saved plan chose for variant `v` (its schedule, Tutel's
// degree), so the graph is rebuilt pinned to it.
absl::StatusOr<p::ModelPlanOptions> SavedChoices(const std::string& file,
                                                 const v1::PlanModelResponse& saved, p::Variant v) {
  p::ModelPlanOptions options;
  const v1::VariantPlan& sv = *SavedVariant(saved, p::VariantName(v));
  absl::StatusOr<p::Schedule> schedule = proto::ScheduleFromProto(sv.schedule());
  if (!schedule.ok()) {
    return absl::InvalidArgumentError(
        Cat(file, ": ", sv.name(), ": schedule: ", View(schedule.status().message())));
  }
  options.schedules = {*schedule};
  if (v == p::Variant::kTutel && sv.tutel_degree() > 0) {
    options.tutel_degrees = {sv.tutel_degree()};
  }
  return options;
}

// Plans every variant of `s` as it will run (every rank plans; no I/O), into
// `plan` with its best; --layout: `s`'s model becomes the one each stage runs.
absl::Status PlanVariants(const std::string& file, const PredictionModel& pm, int hosts,
                          ModelSetup* s, p::ModelPlan* plan) {
  plan->moe_layers = s->model.NumMoeLayers();
  absl::Status planned;
  for (p::Variant v : s->variants) {
    // --plan: the graph is rebuilt pinned to the saved choices, then checked
    // to be the saved plan (CheckSavedPlan).
    p::ModelPlanOptions options;
    if (s->saved.has_value()) {
      absl::StatusOr<p::ModelPlanOptions> saved = SavedChoices(file, *s->saved, v);
      if (!saved.ok()) {
        planned = saved.status();
        break;
      }
      options = *std::move(saved);
    }
    p::ModelConfig run_model;
    absl::StatusOr<p::VariantPlan> vp =
        s->layout.has_value()
            ? ex::PlanLayoutRun(s->model, *s->layout, v, ex::WorldSize(), &pm.cost, &run_model,
                                options)
            : ex::PlanModelRun(s->model, v, ex::WorldSize(), hosts, &pm.cost, options);
    if (!vp.ok()) {
      planned = absl::Status(vp.status().code(), Cat(file, ": ", View(vp.status().message())));
      break;
    }
    plan->variants.push_back(*std::move(vp));
    // What each stage runs: the layout's parallel and micro-batch size.
    if (s->layout.has_value()) s->run_model = run_model;
    if (s->reference.has_value()) {
      vp = ex::PlanLayoutRun(s->model, *s->reference, v, ex::WorldSize(), &pm.cost,
                             &s->reference_model, options);
      if (!vp.ok()) {
        planned =
            absl::Status(vp.status().code(),
                         Cat(file, ": --check's reference layout: ", View(vp.status().message())));
        break;
      }
      s->reference_plans.push_back(*std::move(vp));
    }
  }
  if (s->layout.has_value() && planned.ok()) {
    s->model = s->run_model;
    s->model_msg = proto::ModelToProto(s->model);
  }
  for (size_t i = 1; i < plan->variants.size(); ++i) {
    if (plan->variants[i].iteration_us() <
        plan->variants[static_cast<size_t>(plan->best)].iteration_us())
      plan->best = static_cast<int>(i);
  }
  return planned;
}

// --plan: the prediction in plan-model's shape, made once for the check
// against the saved plan (an error names the first variant that differs) and
// for the report.
absl::Status CheckSavedPlan(const std::string& file, const PredictionModel& pm, const ModelSetup& s,
                            const p::ModelPlan& plan, v1::PlanModelResponse* rebuilt) {
  proto::ModelPlanToProto(plan, s.model, pm.profile.profile, /*include_timeline=*/true, rebuilt);
  for (const v1::VariantPlan& mine : rebuilt->variants()) {
    const std::string diff = requests::PlanDifference(*SavedVariant(*s.saved, mine.name()), mine);
    if (diff.empty()) continue;
    return absl::FailedPreconditionError(
        Cat(file, ": its ", mine.name(), " plan is not what profile ", pm.profile.message.name(),
            " v", pm.profile.message.version(), " plans (", diff,
            "); run with --profile set to the profile it was planned with (",
            s.saved->profile_name(), " v", s.saved->profile_version(), ")"));
  }
  return absl::OkStatus();
}

// The measured side of the report: each run next to its predicted variant
// (report->predicted() is set), its iterations' totals, and the fastest.
void FillMeasured(const std::vector<Run>& runs, v1::ExecModelReport* report) {
  v1::PlanModelResponse* measured = report->mutable_measured();
  measured->set_profile_name(report->predicted().profile_name());
  measured->set_profile_version(report->predicted().profile_version());
  measured->set_ranks(report->predicted().ranks());
  measured->set_gpus(report->predicted().gpus());
  measured->set_moe_layers(report->predicted().moe_layers());
  for (size_t i = 0; i < runs.size(); ++i) {
    const v1::VariantPlan& pv = report->predicted().variants(static_cast<int>(i));
    v1::VariantPlan mv = MeasuredVariant(pv, runs[i]);
    // Same op names as the planner, or the comparison is meaningless: say so.
    for (const std::string& op : MissingOps(OpsOf(pv), OpsOf(mv))) {
      std::fprintf(stderr, "moeplan-exec: warning: predicted op %s was not measured\n", op.c_str());
    }
    *measured->add_variants() = std::move(mv);
    v1::VariantIterations* its = report->add_iterations();
    its->set_variant(pv.name());
    for (const IterationTimes& t : runs[i].iterations) {
      its->add_total_us(t.total_us);
      its->add_probe_gflops(t.probe_gflops);
    }
  }
  int best = 0;
  for (int i = 1; i < measured->variants_size(); ++i) {
    if (measured->variants(i).iteration_us() < measured->variants(best).iteration_us()) best = i;
  }
  measured->set_best_variant(measured->variants(best).name());
}

// Rank 0's report: how the model ran, the prediction (`rebuilt` for --plan,
// else made here from `plan`) and the measurement.
v1::ExecModelReport ModelReport(const Args& a, const ModelSetup& s, int hosts,
                                const p::ModelPlan& plan, const PredictionModel& pm,
                                std::optional<v1::PlanModelResponse> rebuilt,
                                const std::vector<Run>& runs) {
  v1::ExecModelReport report;
  *report.mutable_model() = s.model_msg;
  report.set_backend(a.backend);
  report.set_dtype(std::string(ex::DTypeName(s.dtype)));
  report.set_ranks(ex::WorldSize());
  report.set_hosts(hosts);
  report.set_iters(a.iters);
  report.set_warmup(a.warmup);
  report.set_interleaved(!a.sequential && runs.size() > 1);
  if (a.backend == "mpi") report.set_mpi_wait(a.mpi_wait);
  report.set_host_cores(HostCores());
  report.set_versions(a.backend == "mpi" ? ex::MpiVersion()
                                         : Cat(ex::MpiVersion(), "; ", ex::CudaVersions()));
  if (s.layout.has_value()) {
    *report.mutable_layout() =
        proto::LayoutToProto(p::ResolveLayout(*s.layout), s.model.micro_batch_size);
  }
  if (rebuilt.has_value()) {
    *report.mutable_predicted() = *std::move(rebuilt);
  } else {
    proto::ModelPlanToProto(plan, s.model, pm.profile.profile,
                            /*include_timeline=*/true, report.mutable_predicted());
  }
  FillMeasured(runs, &report);
  // Each variant's measured op durations on the plan that ran (its graph).
  for (size_t i = 0; i < runs.size(); ++i) {
    const v1::VariantPlan& mv = report.measured().variants(static_cast<int>(i));
    absl::StatusOr<v1::Replay> r =
        i < plan.variants.size()
            ? requests::ReplayOnGraph(plan.variants[i].graph, requests::MeasuredTimes(mv.ops()),
                                      mv.iteration_us())
            : absl::StatusOr<v1::Replay>(absl::InternalError("no plan of the variant"));
    if (!r.ok()) {
      std::fprintf(stderr, "moeplan-exec: warning: the %s run does not replay: %s\n",
                   mv.name().c_str(), std::string(View(r.status().message())).c_str());
      r = v1::Replay();
    }
    *report.add_replays() = *std::move(r);
  }
  return report;
}

// Rank 0: prints the report and sends it to --report-to; the exit code.
int PublishModel(const Args& a, const PredictionModel& pm, const v1::ExecModelReport& report) {
  if (!PrintReport(report, a.json, a.json ? std::string() : RenderModelTable(report))) return 1;
  if (report.has_check() && !report.check().passed()) {
    std::fprintf(stderr,
                 "moeplan-exec: check failed: a MoE layer's results differ from the reference "
                 "layout's\n");
    return 1;
  }
  if (a.report_to.empty()) return 0;
  absl::StatusOr<std::vector<v1::ReportMeasurementRequest>> reports =
      ModelReports(pm.profile, report);
  absl::Status st = reports.ok() ? ReportTo(a, pm.profile.message, *std::move(reports), "variant")
                                 : reports.status();
  if (!st.ok()) {
    std::fprintf(stderr, "moeplan-exec: --report-to %s: %s\n", a.report_to.c_str(),
                 std::string(View(st.message())).c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int RunModel(const Args& a) {
  ModelSetup s;
  const int hosts = ex::HostCount();
  if (!Agree(Prepare(a, hosts, &s)).ok()) return 1;

  // The prediction: the same plans that run (every rank plans; no I/O beyond
  // the profile). A profile that does not load is a command-line error.
  // A saved plan is predicted on its own profile unless --profile names one.
  Args pa = a;
  if (s.saved.has_value() && !a.profile_given) pa.profile = s.saved->profile_name();
  absl::StatusOr<PredictionModel> prediction = LoadPredictionModel(pa);
  if (!Agree(prediction.status()).ok()) return 1;
  const std::string& file = a.plan.empty() ? a.model : a.plan;
  p::ModelPlan plan;
  absl::Status planned = PlanVariants(file, *prediction, hosts, &s, &plan);
  std::optional<v1::PlanModelResponse> rebuilt;
  if (planned.ok() && s.saved.has_value()) {
    planned = CheckSavedPlan(file, *prediction, s, plan, &rebuilt.emplace());
  }
  if (!Agree(planned).ok()) return 1;
  if (s.auto_variant) {
    p::VariantPlan best = std::move(plan.variants[static_cast<size_t>(plan.best)]);
    plan.variants.clear();
    plan.variants.push_back(std::move(best));
    plan.best = 0;
  }

  absl::StatusOr<ex::Backend> backend = ex::MakeBackend(a.backend, *ex::ParseMpiWait(a.mpi_wait));
  if (!Agree(backend.status()).ok()) return 1;
  const std::vector<Run> runs = MeasureAll(a, s, plan.variants, *backend);
  std::optional<v1::LayoutCheck> check;
  if (s.reference.has_value()) {
    check =
        CheckLayout(a, {&s.model, plan.variants}, {&s.reference_model, s.reference_plans},
                    *s.reference, s.dtype, [&](const p::ModelConfig& m, const p::VariantPlan& vp) {
                      return CreateRunner(a, m, s.dtype, vp, *backend);
                    });
  }
  // Rank 0 alone says how the check went (exit 1 after printing the report):
  // a peer exiting 1 first could have mpirun stop rank 0 mid-report.
  if (ex::WorldRank() != 0) return 0;
  v1::ExecModelReport report =
      ModelReport(a, s, hosts, plan, *prediction, std::move(rebuilt), runs);
  if (check.has_value()) *report.mutable_check() = *std::move(check);
  return PublishModel(a, *prediction, report);
}

}  // namespace moeplan::exec
