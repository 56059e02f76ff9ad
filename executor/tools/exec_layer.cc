// moeplan-exec --layer: one MoE layer forward and backward under the default,
// S1 and S2 schedules (RunLayer, exec_common.h): validated on every rank, the
// ranks agreeing on the outcome before the first collective; each schedule's
// runner timed (interleaved, or one after another with --sequential),
// checked against the default's results with --check, and reported next to
// the planner's prediction in plan-layer's candidate shape.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exec_common.h"
#include "exec_report.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/base/watchdog.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/client/planner_client.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/check.h"
#include "moeplan/executor/mpi_job.h"
#include "moeplan/executor/runner.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/validate.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"
#include "moeplan/requests/replay.h"

namespace moeplan::exec {
namespace {

namespace ex = executor;
namespace p = planner;

v1::Schedule ToProto(p::Schedule s) { return proto::ScheduleToProto(s); }
// Of a schedule this run measured (so a valid one).
p::Schedule FromProto(v1::Schedule s) {
  return proto::ScheduleFromProto(s).value_or(p::Schedule::kDefault);
}

struct Setup {
  p::LayerConfig layer;
  v1::LayerConfig layer_msg;
  ex::DType dtype = ex::DType::kF32;
  std::vector<p::Schedule> schedules;
  bool auto_schedule = false;
  // What the runners' plans are built with: the prediction's cost model and
  // the nodes the ranks run on, so the plan run is the plan predicted.
  int hosts = 1;
  const p::CostModel* cost = nullptr;
};

// Everything that can be checked without talking to other ranks.
absl::Status Prepare(const Args& a, int hosts, Setup* s) {
  MOEPLAN_RETURN_IF_ERROR(CheckRunFlags(a));
  MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(a.layer, &s->layer_msg));
  absl::StatusOr<p::LayerConfig> layer = proto::LayerFromProto(s->layer_msg);
  if (!layer.ok())
    return absl::Status(layer.status().code(), Cat(a.layer, ": ", View(layer.status().message())));
  s->layer = *layer;
  s->layer_msg = proto::LayerToProto(s->layer);  // derived fields (dp, pp, skew) spelled out
  MOEPLAN_RETURN_IF_ERROR(ResolveDType(a, s->layer.bytes_per_element, a.layer, &s->dtype));
  // What runs is what is predicted: the element size follows the dtype.
  s->layer.bytes_per_element = static_cast<int>(ex::SizeOf(s->dtype));
  s->layer_msg.set_bytes_per_element(s->layer.bytes_per_element);

  const int world = ex::WorldSize();
  // The cluster is what the ranks run on: `hosts` nodes (ranks sharing a host),
  // so that the prediction's intra/inter links are the real ones.
  const p::ClusterShape cluster =
      world % hosts == 0 ? p::ClusterShape{hosts, world / hosts} : p::ClusterShape{1, world};
  auto in_file = [&](const absl::Status& st) {
    return absl::Status(st.code(), Cat(a.layer, ": ", View(st.message())));
  };
  if (absl::Status st = ex::ValidateWorld(s->layer, world); !st.ok()) return in_file(st);
  if (absl::Status st = p::ValidateLayer(s->layer, cluster); !st.ok()) return in_file(st);
  auto runnable = [&](p::Schedule sch) -> absl::Status {
    MOEPLAN_RETURN_IF_ERROR(p::ValidateForSchedule(s->layer, sch));
    return ex::ValidateForExecutor(s->layer, sch, world);
  };
  if (a.schedule == "all" || a.schedule == "auto" || a.check) {
    for (p::Schedule sch : p::kAllSchedules) {
      if (runnable(sch).ok()) s->schedules.push_back(sch);
    }
    if (s->schedules.empty()) return in_file(runnable(p::Schedule::kDefault));
    s->auto_schedule = a.schedule == "auto";
    if (a.schedule != "all" && a.schedule != "auto") {
      p::Schedule one;
      if (!p::ParseSchedule(a.schedule, &one)) {
        return absl::InvalidArgumentError(
            Cat("--schedule: must be default, s1, s2, auto or all (got ", a.schedule, ")"));
      }
      if (absl::Status st = runnable(one); !st.ok()) return in_file(st);
    }
    if (a.check && !runnable(p::Schedule::kDefault).ok()) {
      return in_file(runnable(p::Schedule::kDefault));
    }
  } else {
    p::Schedule one;
    if (!p::ParseSchedule(a.schedule, &one)) {
      return absl::InvalidArgumentError(
          Cat("--schedule: must be default, s1, s2, auto or all (got ", a.schedule, ")"));
    }
    if (absl::Status st = runnable(one); !st.ok()) return in_file(st);
    s->schedules.push_back(one);
  }
  return absl::OkStatus();
}

struct Measured {
  p::Schedule schedule = p::Schedule::kDefault;
  std::vector<ex::OpTime> ops;
  std::vector<IterationTimes> iterations;  // rank 0 only
  ex::LayerResults results;
  v1::ExecRouting routing;      // the last iteration's, over every rank
  std::vector<double> scratch;  // TimeIteration's reduce buffers, reused
};

std::unique_ptr<ex::MoeLayerRunner> CreateRunner(const Args& a, const Setup& s,
                                                 p::Schedule schedule, ex::Backend& b) {
  ex::RunOptions opt;
  opt.schedule = schedule;
  opt.hosts = s.hosts;
  opt.cost = s.cost;
  opt.dtype = s.dtype;
  opt.seed = a.seed;
  opt.skew_exponent = a.skew;
  // What this rank's buffers may take, read now (runners already alive hold theirs).
  SetMemoryLimit(a, *b.device, &opt);
  absl::StatusOr<std::unique_ptr<ex::MoeLayerRunner>> runner =
      ex::MoeLayerRunner::Create(s.layer, opt, b.device.get(), b.kernels.get(), b.world.get());
  if (absl::Status st = Agree(runner.status()); !st.ok()) {
    MPI_Finalize();  // every rank agreed to stop here
    std::exit(1);
  }
  return *std::move(runner);
}

// One timed iteration: every op's start and end and the totals, max over
// ranks, recorded on rank 0; the op names of the last one are kept.
void TimeIteration(const Args& a, int it, ex::MoeLayerRunner& runner, ex::SpeedProbe& probe,
                   Measured* m) {
  if (absl::Status st = runner.RunIteration(); !st.ok()) Abort(st);
  GatherIteration(it, runner.timings(), runner.forward_us(), runner.total_us(), Probe(probe),
                  &m->scratch, &m->iterations);
  if (it + 1 == a.iters) m->ops = runner.timings();
}

// An untimed iteration.
void Warm(ex::MoeLayerRunner& runner) {
  if (absl::Status st = runner.RunIteration(); !st.ok()) Abort(st);
}

// The last iteration's routing over every rank (collective): load per EP rank
// and per expert against the mean, and the share dropped by capacity.
v1::ExecRouting Routing(const Setup& s, p::Schedule schedule, ex::MoeLayerRunner& runner) {
  absl::StatusOr<ex::RouteCounts> c = runner.Routing();
  if (!c.ok()) Abort(c.status());
  // Default and S2 gate the MP group's tokens on every MP rank: count once.
  const bool counts = schedule == p::Schedule::kS1 || runner.place().mp_rank == 0;
  const size_t e = c->routed.size();
  std::vector<int64_t> local(e + 1, 0), global(e + 1, 0);
  if (counts) {
    std::copy(c->routed.begin(), c->routed.end(), local.begin());
    local[e] = c->dropped;
  }
  Watchdog::Step("summing the routing over ranks (MPI_Allreduce)");
  MPI_Allreduce(local.data(), global.data(), static_cast<int>(e + 1), MPI_INT64_T, MPI_SUM,
                MPI_COMM_WORLD);
  v1::ExecRouting r;
  r.set_schedule(ToProto(schedule));
  const int ep = s.layer.parallel.ep;
  const size_t per_rank = e / static_cast<size_t>(ep);
  int64_t total = 0, max_expert = 0, max_rank = 0;
  for (size_t r0 = 0; r0 < e; r0 += per_rank) {
    int64_t rank_load = 0;
    for (size_t i = r0; i < r0 + per_rank; ++i) {
      rank_load += global[i];
      max_expert = std::max(max_expert, global[i]);
    }
    max_rank = std::max(max_rank, rank_load);
    total += rank_load;
  }
  if (total > 0) {
    r.set_rank_load_ratio(static_cast<double>(max_rank) * ep / static_cast<double>(total));
    r.set_expert_load_ratio(static_cast<double>(max_expert) * static_cast<double>(e) /
                            static_cast<double>(total));
    r.set_dropped_pct(100.0 * static_cast<double>(global[e]) / static_cast<double>(total));
  }
  return r;
}

void Finish(const Args& a, const Setup& s, ex::MoeLayerRunner& runner, Measured* m) {
  m->routing = Routing(s, m->schedule, runner);
  if (!a.check) return;
  absl::StatusOr<ex::LayerResults> r = runner.Results();
  if (!r.ok()) Abort(r.status());
  m->results = *std::move(r);
}

// Every schedule of `s`, in its order. Interleaved (the default with more than
// one schedule): every runner is built first, then round i runs iteration i of
// each schedule back to back, starting one schedule later each round, so drift
// of the machine (frequency, page cache, a neighbour's job) lands on every
// schedule alike and entry i of two schedules are paired samples. Sequential:
// one runner at a time (less memory; drift between schedules is not controlled).
std::vector<Measured> MeasureAll(const Args& a, const Setup& s, ex::Backend& b) {
  const size_t n = s.schedules.size();
  std::vector<Measured> runs(n);
  for (size_t j = 0; j < n; ++j) runs[j].schedule = s.schedules[j];
  absl::StatusOr<ex::SpeedProbe> probe =
      ex::SpeedProbe::Create(b.device.get(), b.kernels.get(), s.dtype);
  if (!probe.ok()) Abort(probe.status());
  if (a.sequential || n == 1) {
    for (Measured& m : runs) {
      std::unique_ptr<ex::MoeLayerRunner> runner = CreateRunner(a, s, m.schedule, b);
      for (int i = 0; i < a.warmup; ++i) Warm(*runner);
      for (int it = 0; it < a.iters; ++it) TimeIteration(a, it, *runner, *probe, &m);
      Finish(a, s, *runner, &m);
    }
    return runs;
  }
  std::vector<std::unique_ptr<ex::MoeLayerRunner>> runners;
  runners.reserve(n);
  for (const Measured& m : runs) runners.push_back(CreateRunner(a, s, m.schedule, b));
  for (int i = 0; i < a.warmup; ++i) {
    for (auto& r : runners) Warm(*r);
  }
  for (int it = 0; it < a.iters; ++it) {
    for (size_t k = 0; k < n; ++k) {
      const size_t j = (static_cast<size_t>(it) + k) % n;
      TimeIteration(a, it, *runners[j], *probe, &runs[j]);
    }
  }
  for (size_t j = 0; j < n; ++j) Finish(a, s, *runners[j], &runs[j]);
  return runs;
}

// The reference of a dropless layer's --check: the same layer padded at
// capacity_factor E/k, i.e. capacity S, which drops nothing (an expert gets a
// token at most once), under the default schedule, one iteration (collective).
ex::LayerResults PaddedReference(const Args& a, const Setup& s, ex::Backend& b) {
  Setup padded = s;
  padded.layer.dropless = false;
  padded.layer.token_skew = 1.0;
  padded.layer.capacity_factor =
      static_cast<double>(s.layer.num_experts) / static_cast<double>(s.layer.top_k);
  std::unique_ptr<ex::MoeLayerRunner> runner = CreateRunner(a, padded, p::Schedule::kDefault, b);
  Warm(*runner);
  absl::StatusOr<ex::LayerResults> r = runner->Results();
  if (!r.ok()) Abort(r.status());
  return *std::move(r);
}

// Compares every schedule's results with the default's, and a dropless
// default's with `padded`, the padded default that drops nothing (collective).
v1::ExecCheck Check(const Setup& s, const std::vector<Measured>& runs,
                    const ex::LayerResults* padded, ex::DType dtype) {
  v1::ExecCheck ck;
  ck.set_reference(v1::SCHEDULE_DEFAULT);
  ck.set_tolerance(dtype == ex::DType::kF32 ? 1e-4 : 5e-2);
  const ex::RankPlace place = ex::PlaceOf(s.layer.parallel, ex::WorldRank());
  const Measured* ref = nullptr;
  std::vector<int64_t> dropped;
  for (const Measured& m : runs) {
    // Default and S2 gate the MP group's tokens on every MP rank: count once.
    const bool counts = m.schedule == p::Schedule::kS1 || place.mp_rank == 0;
    dropped.push_back(ex::SumOverWorld(counts ? ex::DroppedChoices(m.results) : 0));
    ck.add_schedules(ToProto(m.schedule));
    ck.add_dropped(dropped.back());
    if (m.schedule == p::Schedule::kDefault) ref = &m;
  }
  bool passed = true;
  // One schedule's results against a reference's: routing (experts, and slots
  // where `slots`), then every tensor within the tolerance.
  auto compare = [&](p::Schedule schedule, const ex::LayerResults& want,
                     const ex::LayerResults& got, bool slots, std::string_view note) {
    v1::TensorCheck routing;
    routing.set_schedule(ToProto(schedule));
    routing.set_tensor("routing");
    const bool same = ex::TrueOnAllRanks(ex::SameRouting(want, got, s.layer.top_k, slots));
    routing.set_passed(same);
    if (!same) {
      routing.set_note(slots ? "experts or slots differ" : "expert choices differ");
    } else if (!note.empty()) {
      routing.set_note(std::string(note));
    }
    passed = passed && same;
    *ck.add_tensors() = routing;
    for (const ex::TensorDiff& d : ex::CompareResults(want, got)) {
      v1::TensorCheck tc;
      tc.set_schedule(ToProto(schedule));
      tc.set_tensor(d.tensor);
      tc.set_max_abs_diff(ex::MaxOverWorld(d.max_abs_diff));
      tc.set_max_abs_ref(ex::MaxOverWorld(d.max_abs_ref));
      tc.set_passed(tc.max_abs_diff() <= ck.tolerance() * tc.max_abs_ref());
      if (!note.empty()) tc.set_note(std::string(note));
      passed = passed && tc.passed();
      *ck.add_tensors() = tc;
    }
  };
  if (padded != nullptr && ref != nullptr) {
    compare(p::Schedule::kDefault, *padded, ref->results, /*slots=*/true,
            "dropless against the padded default at capacity_factor E/k (nothing dropped)");
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const Measured& m = runs[i];
    if (ref == nullptr || &m == ref) continue;
    const bool s1 = m.schedule == p::Schedule::kS1;
    const bool drops = dropped[i] > 0 || dropped[0] > 0;
    if (s1 && drops) {
      v1::TensorCheck routing;
      routing.set_schedule(ToProto(m.schedule));
      routing.set_tensor("routing");
      routing.set_passed(true);
      routing.set_note(
          Cat("not compared: s1 applies capacity per rank on S/N tokens, so it drops "
              "other tokens (documented behaviour)"));
      *ck.add_tensors() = routing;
      for (const char* t : {"y", "dx", "dgate", "dw1", "dw2"}) {
        v1::TensorCheck tc = routing;
        tc.set_tensor(t);
        *ck.add_tensors() = tc;
      }
      continue;
    }
    // S2 routes and drops exactly like the default; S1 without drops picks
    // the same experts (its slots differ: capacity per rank).
    compare(m.schedule, ref->results, m.results, /*slots=*/!s1, "");
  }
  ck.set_passed(passed);
  return ck;
}

// Every measured schedule's op timeline (median durations), as reports
// against the profile the prediction used.
std::vector<v1::ReportMeasurementRequest> LayerReports(const calibration::LoadedProfile& profile,
                                                       const v1::ExecReport& report) {
  std::vector<v1::ReportMeasurementRequest> out;
  for (const v1::CandidatePlan& cand : report.candidates()) {
    v1::ReportMeasurementRequest& req = out.emplace_back();
    req.mutable_plan()->set_profile_name(profile.message.name());
    *req.mutable_plan()->mutable_layer() = report.layer();
    req.mutable_plan()->add_schedules(cand.schedule());
    req.set_schedule(cand.schedule());
    SetMeasuredOps(cand.ops(), &req);
    req.set_total_us(cand.total_us());
  }
  return out;
}

// The planner's prediction for the layer under `s.schedules`, with the
// timeline (every rank: cheap, no I/O beyond the profile).
absl::Status PredictLayer(const Setup& s, const PredictionModel& m, v1::PlanLayerResponse* out) {
  p::LayerPlanner planner(m.cost);
  v1::PlanLayerRequest request;
  request.set_profile_name(m.profile.message.name());
  request.set_include_timeline(true);
  for (p::Schedule sch : s.schedules) request.add_schedules(ToProto(sch));
  out->Clear();
  return requests::AnswerPlanLayer(s.layer, request, planner, m.profile.profile, out);
}

// What ran is what is predicted: a dropless layer costs its heaviest EP
// rank's load, which is the measured token_skew; the prediction is redone at it.
void PredictAtMeasuredSkew(const PredictionModel& m, const std::vector<Measured>& runs, Setup* s,
                           v1::PlanLayerResponse* predicted) {
  if (!s->layer.dropless || runs.empty() || !(runs[0].routing.rank_load_ratio() > 0.0)) return;
  s->layer.token_skew = std::max(1.0, runs[0].routing.rank_load_ratio());
  s->layer_msg.set_token_skew(s->layer.token_skew);
  const absl::Status st = PredictLayer(*s, m, predicted);
  if (!st.ok() && ex::WorldRank() == 0) {
    std::fprintf(stderr, "moeplan-exec: no prediction at the measured token_skew %g: %s\n",
                 s->layer.token_skew, std::string(View(st.message())).c_str());
  }
}

// One schedule's measured ops next to its prediction (if any), its
// iterations' totals and its routing.
void AddSchedule(const Measured& m, const v1::PlanLayerResponse& predicted,
                 v1::ExecReport* report) {
  const v1::CandidatePlan* pred = nullptr;
  for (const v1::CandidatePlan& c : predicted.candidates()) {
    if (c.schedule() == ToProto(m.schedule)) pred = &c;
  }
  v1::CandidatePlan c = MeasuredCandidate(ToProto(m.schedule), m.ops, m.iterations, pred);
  if (pred != nullptr) {
    // Same op names as the planner, or the diff is meaningless: say so loudly.
    for (const std::string& op : MissingOps(c, *pred)) {
      std::fprintf(stderr, "moeplan-exec: warning: measured op %s has no predicted op\n",
                   op.c_str());
    }
    for (const std::string& op : MissingOps(*pred, c)) {
      std::fprintf(stderr, "moeplan-exec: warning: predicted op %s was not measured\n", op.c_str());
    }
  }
  *report->add_candidates() = std::move(c);
  v1::ScheduleIterations* its = report->add_iterations();
  its->set_schedule(ToProto(m.schedule));
  for (const IterationTimes& t : m.iterations) {
    its->add_total_us(t.total_us);
    its->add_probe_gflops(t.probe_gflops);
  }
  *report->add_routing() = m.routing;
}

// Rank 0's report of the runs (the check is set already).
void FillReport(const Args& a, const Setup& s, const std::vector<Measured>& runs,
                const v1::PlanLayerResponse& predicted, v1::ExecReport* report) {
  *report->mutable_layer() = s.layer_msg;
  report->set_backend(a.backend);
  report->set_dtype(std::string(ex::DTypeName(s.dtype)));
  report->set_ranks(ex::WorldSize());
  report->set_hosts(s.hosts);
  report->set_iters(a.iters);
  report->set_warmup(a.warmup);
  report->set_interleaved(!a.sequential && runs.size() > 1);
  report->set_skew_exponent(a.skew);
  if (a.backend == "mpi") report->set_mpi_wait(a.mpi_wait);
  report->set_host_cores(HostCores());
  report->set_versions(a.backend == "mpi" ? ex::MpiVersion()
                                          : Cat(ex::MpiVersion(), "; ", ex::CudaVersions()));
  for (const Measured& m : runs) AddSchedule(m, predicted, report);
  // Each schedule's measured op durations on the plan that ran.
  for (const v1::CandidatePlan& c : report->candidates()) {
    absl::StatusOr<v1::Replay> r =
        s.cost == nullptr
            ? absl::StatusOr<v1::Replay>(absl::FailedPreconditionError("no cost model"))
            : requests::ReplayLayerRun(s.layer, FromProto(c.schedule()),
                                       requests::MeasuredTimes(c.ops()), c.total_us(), *s.cost);
    if (!r.ok()) {
      std::fprintf(stderr, "moeplan-exec: warning: the %s run does not replay: %s\n",
                   std::string(proto::ScheduleLabel(c.schedule())).c_str(),
                   std::string(View(r.status().message())).c_str());
      r = v1::Replay();
    }
    *report->add_replays() = *std::move(r);
  }
}

// Rank 0: prints the report, sends it to --report-to, and says whether the
// check failed; the exit code.
int Publish(const Args& a, const calibration::LoadedProfile& profile,
            const v1::ExecReport& report) {
  if (!PrintReport(report, a.json, a.json ? std::string() : RenderTable(report))) return 1;
  if (!a.report_to.empty()) {
    if (absl::Status st = ReportTo(a, profile.message, LayerReports(profile, report), "schedule");
        !st.ok()) {
      std::fprintf(stderr, "moeplan-exec: --report-to %s: %s\n", a.report_to.c_str(),
                   std::string(View(st.message())).c_str());
      return 1;
    }
  }
  if (a.check && !report.check().passed()) {
    std::fprintf(stderr,
                 "moeplan-exec: check failed: a schedule's results differ from the default's\n");
    return 1;
  }
  return 0;
}

}  // namespace

int RunLayer(const Args& a) {
  Setup s;
  const int hosts = ex::HostCount();
  if (!Agree(Prepare(a, hosts, &s)).ok()) return 1;

  // The planner's prediction for the same layer — also what --schedule auto
  // follows. A profile that does not load is an error of the command line
  // (exit 1), not a missing prediction.
  absl::StatusOr<PredictionModel> prediction = LoadPredictionModel(a);
  if (!Agree(prediction.status()).ok()) return 1;
  v1::PlanLayerResponse predicted;
  const absl::Status predict_status = PredictLayer(s, *prediction, &predicted);
  if (s.auto_schedule) {
    if (!Agree(predict_status).ok()) return 1;
    absl::StatusOr<p::Schedule> best = proto::ScheduleFromProto(predicted.best_schedule());
    if (!best.ok()) return 1;
    if (!a.check) s.schedules = {*best};
  } else if (!predict_status.ok() && ex::WorldRank() == 0) {
    std::fprintf(stderr, "moeplan-exec: no prediction with profile %s: %s\n", a.profile.c_str(),
                 std::string(View(predict_status.message())).c_str());
  }

  absl::StatusOr<ex::Backend> backend = ex::MakeBackend(a.backend, *ex::ParseMpiWait(a.mpi_wait));
  if (!Agree(backend.status()).ok()) return 1;
  s.hosts = hosts;
  s.cost = &prediction->cost;

  const std::vector<Measured> runs = MeasureAll(a, s, *backend);
  // Dropless (default schedule only): the reference of --check is the padded
  // default at a capacity that drops nothing, run after the measurement.
  std::optional<ex::LayerResults> padded;
  if (a.check && s.layer.dropless) padded = PaddedReference(a, s, *backend);
  PredictAtMeasuredSkew(*prediction, runs, &s, &predicted);

  v1::ExecReport report;
  if (a.check) *report.mutable_check() = Check(s, runs, padded ? &*padded : nullptr, s.dtype);
  if (ex::WorldRank() != 0) return report.check().passed() || !a.check ? 0 : 1;
  FillReport(a, s, runs, predicted, &report);
  return Publish(a, prediction->profile, report);
}

}  // namespace moeplan::exec
