// moeplan-exec's command line (the runs: exec_layer.cc, exec_model.cc): runs one
// MoE layer forward and backward under the default, S1 and S2 schedules with
// the bundled executor, or a whole model's variants (--model, --plan), under mpirun:
//   mpirun -np P moeplan-exec --layer FILE.json [--schedule default|s1|s2|auto|all]
//     [--backend mpi|nccl] [--iters N] [--warmup W] [--sequential] [--check] [--json]
// prints per-op and total times (median over iterations of the max over ranks)
// in plan-layer's candidate shape, next to the planner's prediction.
//
// Errors: every rank validates its inputs before the first collective and the
// ranks agree on the outcome (one MPI_Allreduce), so a bad layer or layout makes
// every rank exit 1 with the message printed once — no rank is left waiting.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <chrono>
#include <cstdint>

#include "exec_common.h"
#include "moeplan/base/flags.h"
#include "moeplan/base/watchdog.h"
#include "moeplan/executor/mpi_job.h"

namespace moeplan::exec {
namespace {

// The flags main and the flags' exclusions refer to.
struct Flags {
  CLI::Option *layer, *model, *plan, *layout, *variant, *schedule;
  CLI::Option *skew, *profile, *report_to, *check, *check_against;
};

// What runs: --layer, --model or --plan, and which layout, variants and
// schedules of it.
void AddInputFlags(CLI::App& app, Args* args, Flags* out) {
  Args& a = *args;
  Flags& f = *out;
  f.layer = app.add_option("--layer", a.layer, "layer config (JSON, moeplan.v1.LayerConfig)")
                ->check(flags::NonEmpty());
  f.model = app.add_option(
      "--model", a.model,
      "a whole model instead of a layer (JSON, moeplan.v1.ModelConfig; parallel.pp 1, mp*dp "
      "ranks; pipelines: --layout): runs each --variant's forward, backward, gradient buckets and "
      "optimizer step as "
      "the planner plans it (linear AlltoAll) and reports predicted and measured timelines in "
      "plan-model's shape (moeplan.v1.ExecModelReport); --schedule and --skew are for layers, "
      "--check needs --layout");
  f.model->check(flags::NonEmpty());
  f.model->excludes(f.layer);
  f.plan =
      app.add_option("--plan", a.plan,
                     "a whole-model plan saved by `moeplan plan-model --format json` "
                     "(moeplan.v1.PlanModelResponse, which holds its model): runs its variants "
                     "as it planned them, checked to be the plan --profile (default: the plan's "
                     "own profile) rebuilds; as --model otherwise")
          ->check(flags::NonEmpty());
  f.plan->excludes(f.layer);
  f.plan->excludes(f.model);
  f.layout = app.add_option(
      "--layout", a.layout,
      "with --model: run this layout's program (plan-model --layout's syntax, e.g. "
      "dp=2,tp=1,pp=2,ep=2,esp=1,microbatches=4,pipeline=1f1b; dp*tp*pp ranks; parm or dpmoe "
      "family, sequence parallelism and a2a_overlap included): "
      "every stage's micro-batches in the pipeline schedule's order with their p2p transfers, "
      "then each stage's gradient buckets and optimizer step; the model's parallel and "
      "micro_batch_size are the layout's");
  f.layout->check(flags::NonEmpty());
  f.layout->needs(f.model);
  f.variant =
      app.add_option("--variant", a.variant,
                     "with --model: none, tutel, dw, partition, lancet, auto (the planner's "
                     "choice) or all; with --plan: one of the plan's variants, auto (its best) "
                     "or all")
          ->check(flags::NonEmpty())
          ->capture_default_str();
  f.schedule = app.add_option("--schedule", a.schedule,
                              "default, s1, s2, auto (the planner's choice) or all")
                   ->check(flags::NonEmpty())
                   ->capture_default_str();
}

// How it runs and what is reported.
void AddRunFlags(CLI::App& app, Args* args, Flags* out) {
  Args& a = *args;
  Flags& f = *out;
  app.add_option("--backend", a.backend, "mpi (CPU, host buffers) or nccl (GPU)")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  flags::AddMpiWait(app, &a.mpi_wait);
  app.add_option("--dtype", a.dtype,
                 "auto (mpi: f32; nccl: from bytes_per_element), f32 or bf16; the layer's "
                 "bytes_per_element is set to match")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  app.add_option("--iters", a.iters, "timed iterations")
      ->check(flags::IntInRange(1, 1000000))
      ->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed iterations first")
      ->check(flags::IntInRange(0, 1000000))
      ->capture_default_str();
  app.add_option("--seed", a.seed, "seed of inputs, weights and output gradient")
      ->check(flags::IntInRange(0, INT64_MAX))
      ->capture_default_str();
  f.skew = app.add_option(
                  "--skew", a.skew,
                  "skewed routing: the gate favours experts by a Zipf law of this exponent (expert "
                  "of popularity rank r gets weight 1/(1+r)^skew, the ranking drawn from --seed); "
                  "the report gives the measured heaviest-rank load over the mean, the planner's "
                  "token_skew (0: unbiased gate)")
               ->check(flags::FiniteInRange(0.0, 16.0))
               ->capture_default_str();
  app.add_option("--max-memory-gib", a.max_memory_gib,
                 "Memory one rank's buffers may take; over it the run is refused before anything "
                 "is allocated (0: the GPU's free memory, or the host's available memory divided "
                 "by its ranks)")
      ->check(flags::FiniteInRange(0.0, 1e6))
      ->capture_default_str();
  f.profile =
      app.add_option("--profile", a.profile, "profile for the prediction and --schedule auto")
          ->check(flags::NonEmpty())
          ->capture_default_str();
  app.add_option("--watchdog-s", a.watchdog_s,
                 "a rank that begins no new op for this long (a peer died or stalled) prints the "
                 "op it waits in and exits 3, and mpirun stops the job (0: off)")
      ->check(flags::FiniteInRange(0.0, 86400.0))
      ->capture_default_str();
  f.report_to =
      app.add_option("--report-to", a.report_to,
                     "moeplan-server address (host:port or unix:PATH): rank 0 sends every measured "
                     "schedule's op timeline with ReportMeasurement against --profile, for in-job "
                     "refits; a failed report exits 1 after the report is printed")
          ->check(flags::NonEmpty());
  app.add_option("--tls-ca", a.tls_ca, "with --report-to: CA of the server's TLS certificate")
      ->check(flags::NonEmpty());
  app.add_option("--token-file", a.token_file,
                 "with --report-to: file whose first line is the server's bearer token")
      ->check(flags::NonEmpty());
  f.check = app.add_flag("--check", a.check,
                         "--layer: also run every schedule the layout allows on the same inputs "
                         "and compare outputs, gradients and routing with the default's; --model "
                         "--layout: run the plain layout (no sp, no a2a_overlap, esp=tp, ep=dp) on "
                         "the same inputs and compare every MoE layer's outputs and gradients, "
                         "assembled over all ranks (exit 1 on mismatch)");
  f.check_against =
      app.add_option("--check-against", a.check_against,
                     "with --layout --check: the reference layout instead of the plain one "
                     "(same tp, dp, pp and microbatches)")
          ->check(flags::NonEmpty());
  f.check_against->needs(f.check);
  app.add_flag("--json", a.json,
               "print the report as JSON (moeplan.v1.ExecReport; with --model "
               "moeplan.v1.ExecModelReport)");
  app.add_flag("--sequential", a.sequential,
               "time one schedule (or --model variant) after another, one runner alive at a "
               "time (less memory); by default several are built together and their iterations "
               "interleaved, so machine drift hits all alike and the report's per-iteration "
               "totals are paired");
}

Flags AddFlags(CLI::App& app, Args* a) {
  Flags f;
  AddInputFlags(app, a, &f);
  AddRunFlags(app, a, &f);
  f.layout->excludes(f.report_to);
  for (CLI::Option* o : {f.schedule, f.skew}) {
    f.model->excludes(o);
    f.plan->excludes(o);
  }
  f.plan->excludes(f.check);
  return f;
}

}  // namespace
}  // namespace moeplan::exec

int main(int argc, char** argv) {
  // Threaded lanes (the plan interpreter) drive each communicator from its own thread.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  moeplan::exec::Args a;
  CLI::App app{
      "Runs one MoE layer forward and backward under the default, S1 and S2 schedules, or a "
      "whole model's overlap variants (--model), as the planner plans them (launch with mpirun "
      "-np P, P = mp*dp ranks) and prints per-op times: median over iterations of the max over "
      "ranks, next to the planner's op names and prediction."};
  const moeplan::exec::Flags f = moeplan::exec::AddFlags(app, &a);
  app.set_version_flag("--version", "moeplan-exec " MOEPLAN_VERSION);
  // One line naming the program, as moeplan and moeplan-server print: what
  // moeplan validate / profile-check quote as the reason a run failed.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("moeplan-exec: error: {} (see --help)\n", e.what());
  });
  int rc = 0;
  try {
    app.parse(argc, argv);
    if (a.layer.empty() && a.model.empty() && a.plan.empty()) {
      throw CLI::RequiredError("--layer, --model or --plan");
    }
    if (a.check && !a.model.empty() && a.layout.empty()) {
      throw CLI::ValidationError("--check", "with --model needs --layout (layouts are checked)");
    }
    if (f.variant->count() > 0 && a.model.empty() && a.plan.empty()) {
      throw CLI::ValidationError("--variant", "needs --model or --plan");
    }
    a.profile_given = f.profile->count() > 0;
    moeplan::Watchdog::Start("moeplan-exec", moeplan::executor::WorldRank(),
                             std::chrono::milliseconds(static_cast<int64_t>(a.watchdog_s * 1000)));
    rc =
        a.model.empty() && a.plan.empty() ? moeplan::exec::RunLayer(a) : moeplan::exec::RunModel(a);
    moeplan::Watchdog::Stop();
  } catch (const CLI::ParseError& e) {
    // Every rank parsed the same arguments: all stop here, rank 0 explains.
    if (moeplan::executor::WorldRank() == 0) {
      rc = app.exit(e);
    } else {
      rc = e.get_exit_code();
    }
  }
  MPI_Finalize();
  return rc;
}
