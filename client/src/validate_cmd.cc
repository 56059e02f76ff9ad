// `moeplan validate`: moeplan-exec run (under a launcher, mpirun by default) on
// every config of a grid (layer configs or whole models: validate_subject.h),
// the planner's prediction of the same runs, and the error between them
// (calibration/validation.h, docs/calibration.md).
#include <fmt/format.h>
#include <sys/wait.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli_util.h"
#include "commands.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/context_fit.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/calibration/validation.h"
#include "moeplan/client/html_report.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/types.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/replay.h"
#include "moeplan/v1/exec.pb.h"
#include "moeplan/v1/layer.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/v1/validation.pb.h"
#include "validate_subject.h"

namespace moeplan::client {

namespace fs = std::filesystem;
namespace p = ::moeplan::planner;

void PrintTimes(const std::vector<CandidateTimes>& times, const calibration::ValidationInput& in) {
  std::string line = "moeplan validate:  ";
  for (const CandidateTimes& t : times) {
    fmt::format_to(std::back_inserter(line), " {} {:.1f}/{:.1f}", t.name, t.measured_us / 1e3,
                   t.predicted_us / 1e3);
    for (const calibration::ValidationInput::CandidateReplay& r : in.replays) {
      if (r.candidate == t.name) {
        fmt::format_to(std::back_inserter(line), "/{:.1f}", r.replay.replayed_us() / 1e3);
      }
    }
    line += " ms";
  }
  fmt::print(stderr, "{} (measured/predicted{})\n", line, in.replays.empty() ? "" : "/replayed");
}

namespace {

// What moeplan-exec said before it stopped: its own error line in the log,
// not the banner mpirun prints after it (FailureReason).
std::string ExecFailure(const std::string& path) {
  absl::StatusOr<std::string> text = proto::ReadFile(path);
  return text.ok() ? FailureReason(*text, "moeplan-exec") : "";
}

// Every file validate writes under --out-dir for `configs` configs must not be
// one it reads (--profile, the grid, --exec).
absl::Status RefuseOutputsOverInputs(const ValidateArgs& a, size_t configs) {
  const fs::path dir(a.out_dir);
  std::vector<NamedPath> outputs;
  for (const char* name : {"report.md", "plot.png", "plot.dat", "plot.gp"}) {
    outputs.push_back({"--out-dir", (dir / name).string()});
  }
  if (a.holdout > 0.0) outputs.push_back({"--out-dir", (dir / "refit-profile.json").string()});
  for (size_t i = 0; i < configs; ++i) {
    const std::string stem = fmt::format("{:03d}", i);
    outputs.push_back({"--out-dir", (dir / "configs" / (stem + ".json")).string()});
    outputs.push_back({"--out-dir", (dir / "logs" / (stem + ".log")).string()});
    if (a.from_runs.empty()) {
      outputs.push_back({"--out-dir", (dir / "exec" / (stem + ".json")).string()});
    }
  }
  return RefuseOutputOverInput(outputs, {{"--profile", a.profile},
                                         {"--layers", a.layers},
                                         {"--models", a.models},
                                         {"--exec", a.exec}});
}

// moeplan-exec's --skew, when asked for, and on the mpi backend its
// --mpi-wait: as given, else as the profile was measured (spin before the
// profiler had the flag).
std::string ExecFlags(const ValidateArgs& a, const v1::ClusterProfile& profile) {
  std::string flags = a.skew > 0.0 ? fmt::format(" --skew {:g}", a.skew) : std::string();
  if (a.backend == "mpi") {
    const std::string& measured = profile.provenance().mpi_wait();
    flags += " --mpi-wait " + (!a.mpi_wait.empty() ? a.mpi_wait
                               : measured.empty()  ? std::string("spin")
                                                   : measured);
  }
  return flags;
}

// Where and how the configs run, once the arguments are checked.
struct Setup {
  std::optional<ScratchDir> scratch;  // --out-dir, else a temporary directory
  fs::path dir;          // --out-dir, with configs/, exec/ and logs/ in it
  int ranks = 0;         // --ranks, or the profile's nodes x GPUs
  std::string exec;      // the moeplan-exec binary
  std::string launcher;  // --launcher with {ranks} replaced
};

// Checks --iters and --warmup, creates the output directories, and resolves the
// rank count, the launcher and moeplan-exec.
absl::StatusOr<Setup> Prepare(const ValidateArgs& a, const v1::ClusterProfile& profile) {
  if (a.iters < 1) return absl::InvalidArgumentError("--iters: must be >= 1");
  if (a.warmup < 0) return absl::InvalidArgumentError("--warmup: must be >= 0");
  Setup setup;
  MOEPLAN_ASSIGN_OR_RETURN(setup.scratch, ScratchDir::Make(a.out_dir, "validate"));
  setup.dir = fs::path(setup.scratch->path());
  std::error_code ec;
  for (const char* sub : {"configs", "exec", "logs"}) {
    fs::create_directories(setup.dir / sub, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          Cat("--out-dir: ", (setup.dir / sub).string(), ": ", ec.message()));
    }
  }
  setup.ranks = a.ranks > 0 ? a.ranks : profile.nodes() * profile.gpus_per_node();
  setup.exec = a.exec.empty() ? SiblingBinary("executor", "moeplan-exec") : a.exec;
  setup.launcher = LauncherFor(a.launcher, setup.ranks);
  return setup;
}

// The prediction of a measured config; one the planner cannot predict is
// listed (and said on stderr), not fatal.
absl::StatusOr<ConfigRun> PredictRun(const ValidationSubject& subject,
                                     calibration::ValidationInput in,
                                     const calibration::LoadedProfile& profile,
                                     const p::CostModel& cost, bool replay) {
  MOEPLAN_ASSIGN_OR_RETURN(ConfigRun run, subject.Predict(std::move(in), profile, cost, replay));
  if (!run.input.has_value()) fmt::print(stderr, "moeplan validate:   skipped: {}\n", run.skipped);
  return run;
}

// Writes config `i`, runs moeplan-exec on it under the launcher (or, with
// --from-runs, reads the earlier run's report), keeps its report and predicts
// it. A run that fails (e.g. a layout the executor rejects) skips the config;
// one on another host count than the profile's is an error.
absl::StatusOr<ConfigRun> RunConfig(const ValidateArgs& a, const Setup& setup,
                                    const calibration::LoadedProfile& profile,
                                    const p::CostModel& cost, const ValidationSubject& subject,
                                    size_t i) {
  const std::string stem = fmt::format("{:03d}", i);
  const std::string config_file = (setup.dir / "configs" / (stem + ".json")).string();
  const std::string log_file = (setup.dir / "logs" / (stem + ".log")).string();
  MOEPLAN_ASSIGN_OR_RETURN(std::string config_json, subject.ConfigJson(i));
  MOEPLAN_RETURN_IF_ERROR(proto::WriteFileAtomic(config_file, config_json + "\n"));
  const std::string name = subject.Name(i);
  std::string json;
  if (!a.from_runs.empty()) {
    // An earlier run's report of the same config: re-predicted, not re-run.
    const std::string earlier = (fs::path(a.from_runs) / "exec" / (stem + ".json")).string();
    std::error_code ec;
    if (!fs::exists(earlier, ec)) {
      return ConfigRun{std::nullopt,
                       fmt::format("{}: not in --from-runs ({} missing)", name, earlier)};
    }
    MOEPLAN_ASSIGN_OR_RETURN(json, proto::ReadFile(earlier));
    fmt::print(stderr, "moeplan validate: [{}/{}] {} (from {})\n", i + 1, subject.size(), name,
               earlier);
    absl::StatusOr<Measured> m = subject.Parse(i, json);
    if (!m.ok()) {
      return absl::Status(m.status().code(),
                          Cat("--from-runs: ", earlier, ": ", View(m.status().message())));
    }
    return PredictRun(subject, std::move(m->input), profile, cost, a.replay);
  }
  const std::string command = fmt::format(
      "{} {} {} --backend {} --json --iters {} --warmup {}{} --profile {} 2>{}", setup.launcher,
      ShellQuote(setup.exec), subject.ExecArgs(i, config_file), a.backend, a.iters, a.warmup,
      ExecFlags(a, profile.message), ShellQuote(a.profile), ShellQuote(log_file));
  fmt::print(stderr, "moeplan validate: [{}/{}] {}\n", i + 1, subject.size(), name);
  MOEPLAN_ASSIGN_OR_RETURN(Ran ran, RunCommand(command));
  absl::StatusOr<Measured> m =
      ran.exit_code == 0 ? subject.Parse(i, ran.out) : absl::UnknownError("");
  if (!m.ok()) {
    // A layout the executor rejects (or a failed run): listed, not fatal.
    // A run that succeeded but whose report does not read says why.
    std::string why = ran.exit_code == 0
                          ? Cat("its report does not read: ", View(m.status().message()))
                          : ExecFailure(log_file);
    if (why.empty()) why = Cat("exit code ", ran.exit_code);
    fmt::print(stderr, "moeplan validate:   skipped: {}\n", why);
    // A temporary directory's log is gone when the command returns.
    const std::string log =
        setup.scratch->temporary() ? std::string() : fmt::format(" (log: {})", log_file);
    return ConfigRun{std::nullopt, fmt::format("{}: {}{}", name, why, log)};
  }
  MOEPLAN_RETURN_IF_ERROR(
      proto::WriteFileAtomic((setup.dir / "exec" / (stem + ".json")).string(), ran.out));
  if (m->hosts != profile.message.nodes()) {
    return absl::FailedPreconditionError(fmt::format(
        "moeplan-exec ran on {} host(s) but profile {} describes {} node(s): validate where the "
        "profile was measured (e.g. inside scripts/testbed/testbed.sh with the same --nodes)",
        m->hosts, profile.message.name(), profile.message.nodes()));
  }
  return PredictRun(subject, std::move(m->input), profile, cost, a.replay);
}

// The files written next to the runs' files.
struct Written {
  std::string report;  // report.md
  std::string plot;    // plot.png; empty: gnuplot did not draw it
};

// Writes plot.dat and plot.gp, draws plot.png with gnuplot where it can (a
// warning on stderr where not), and writes report.md, which lists the configs
// not run last.
absl::StatusOr<Written> WriteReport(const ValidateArgs& a, const Setup& setup,
                                    const ValidationSubject& subject,
                                    const v1::ClusterProfile& profile,
                                    const v1::ValidationSummary& summary,
                                    const std::vector<std::string>& skipped,
                                    const std::string& section) {
  Written written;
  if (!a.html.empty()) {
    MOEPLAN_ASSIGN_OR_RETURN(HtmlReport html, ValidateReport(summary));
    MOEPLAN_RETURN_IF_ERROR(WriteHtmlReport(a.html, html));
  }
  if (setup.scratch->temporary()) return written;  // no --out-dir: no report file
  calibration::ReportContext ctx;
  if (a.from_runs.empty()) {
    ctx.command =
        fmt::format("{} {} {} --backend {} --json --iters {} --warmup {}{}", setup.launcher,
                    setup.exec, subject.ExecArgs(ValidationSubject::kAnyConfig, "CONFIG"),
                    a.backend, a.iters, a.warmup, ExecFlags(a, profile));
  } else {
    ctx.from_runs = a.from_runs;
  }
  ctx.profile_comment = profile.comment();
  ctx.provenance = calibration::ProvenanceLine(profile);
  ctx.section = section;
  std::string plot_note;
  MOEPLAN_ASSIGN_OR_RETURN(ctx.plot_file, DrawScatter(calibration::ValidationScatter(summary),
                                                      setup.dir.string(), "plot", &plot_note));
  std::string markdown = calibration::RenderMarkdown(summary, ctx);
  if (!skipped.empty()) {
    markdown += fmt::format("\n## Configs not run ({})\n\n", skipped.size());
    for (const std::string& s : skipped) markdown += "- " + s + "\n";
  }
  written.report = (setup.dir / "report.md").string();
  MOEPLAN_RETURN_IF_ERROR(proto::WriteFileAtomic(written.report, markdown));
  if (!plot_note.empty()) fmt::print(stderr, "moeplan validate: warning: {}\n", plot_note);
  if (!ctx.plot_file.empty()) written.plot = (setup.dir / ctx.plot_file).string();
  return written;
}

// The summary on stdout: a few lines, or with --json the whole
// moeplan.v1.ValidationSummary.
absl::Status PrintSummary(bool json, const v1::ValidationSummary& summary, size_t skipped,
                          const Written& written) {
  if (json) {
    MOEPLAN_ASSIGN_OR_RETURN(std::string text, proto::ToJson(summary));
    return WriteStdout(text + "\n");
  }
  // Selection needs two or more candidates of a config measured (the report
  // says the same); one-rank layer grids have one schedule.
  const std::string_view noun = summary.models() ? "variant" : "schedule";
  int choice = 0;
  for (const v1::ValidationConfig& c : summary.results()) choice += c.points_size() >= 2 ? 1 : 0;
  const std::string selection =
      choice == 0 ? fmt::format("selection: not measured (no config ran two or more {}s)\n", noun)
                  : fmt::format(
                        "selection: predicted best = measured best in {:.1f} % of {} configs; "
                        "mean regret {:.2f} %\n",
                        summary.selection_accuracy_pct(), choice, summary.mean_regret_pct());
  return WriteStdout(fmt::format(
      "validated {} configs x {}s = {} points on {} ({} ranks, {} hosts){}\n"
      "total time: MAPE {:.1f} %, p90 {:.1f} %, max {:.1f} % ({})\n"
      "{}"
      "{}"
      "{}{}\n",
      summary.configs(), noun, summary.points(), summary.profile(), summary.ranks(),
      summary.hosts(),
      skipped == 0 ? ""
                   : fmt::format("; {} configs not run ({})", skipped,
                                 written.report.empty() ? "why: above" : "see the report"),
      summary.mape_pct(), summary.p90_pct(), summary.max_pct(), summary.worst_config(), selection,
      summary.paired_configs() == 0
          ? std::string()
          : fmt::format("selection, ties for best counted: {:.1f} % of {} configs ({} with a "
                        "tie)\n",
                        summary.selection_accuracy_tied_pct(), summary.paired_configs(),
                        summary.tied_configs()),
      written.report.empty()
          ? "report: not written (--out-dir keeps report.md, plot.png and the runs' files)"
          : "report: " + written.report,
      written.plot.empty() ? "" : fmt::format(", plot: {}", written.plot)));
}

}  // namespace

namespace {

// The --holdout split: within each layout (parallel mp/ep/esp, and dp for
// models), a seeded shuffle, the first round(fraction x n) held out (at least
// one config stays in the fit part). True at index i: held out.
std::vector<bool> HoldoutSplit(const ValidationSubject& subject,
                               const std::vector<calibration::ValidationInput>& inputs,
                               double fraction, uint64_t seed) {
  std::map<std::string, std::vector<size_t>> layouts;
  for (size_t i = 0; i < inputs.size(); ++i) layouts[subject.Layout(inputs[i])].push_back(i);
  std::vector<bool> held(inputs.size(), false);
  std::mt19937_64 rng(seed);
  for (auto& [layout, idx] : layouts) {
    // Fisher-Yates with the engine's raw output: the same split on every
    // standard library (std::shuffle's algorithm is unspecified).
    for (size_t k = idx.size(); k > 1; --k) std::swap(idx[k - 1], idx[rng() % k]);
    const size_t n =
        std::min(idx.size() - 1, static_cast<size_t>(std::llround(fraction * double(idx.size()))));
    for (size_t k = 0; k < n; ++k) held[idx[k]] = true;
  }
  return held;
}

std::vector<calibration::ValidationInput> Part(const std::vector<calibration::ValidationInput>& all,
                                               const std::vector<bool>& held, bool want_held) {
  std::vector<calibration::ValidationInput> out;
  for (size_t i = 0; i < all.size(); ++i) {
    if (held[i] == want_held) out.push_back(all[i]);
  }
  return out;
}

// The inputs again with the predictions of `profile` (the measurements
// unchanged), each next to its prediction by the profile alone; configs it
// cannot predict (a model whose plans it would change) go to `dropped`.
struct Repredicted {
  std::vector<calibration::ValidationInput> refit, base;
};
absl::StatusOr<Repredicted> Repredict(const ValidationSubject& subject,
                                      const std::vector<calibration::ValidationInput>& inputs,
                                      const calibration::LoadedProfile& profile,
                                      const p::CostModel& cost, std::vector<std::string>* dropped) {
  Repredicted out;
  for (const calibration::ValidationInput& in : inputs) {
    // The replays `in` holds are the runs' own: kept, not replayed again.
    MOEPLAN_ASSIGN_OR_RETURN(ConfigRun run, subject.Predict(in, profile, cost, false));
    if (!run.input.has_value()) {
      dropped->push_back(std::move(run.skipped));
      continue;
    }
    out.refit.push_back(*std::move(run.input));
    out.base.push_back(in);
  }
  return out;
}

std::string SummaryRow(std::string_view part, std::string_view model,
                       const v1::ValidationSummary& s) {
  return fmt::format(
      "| {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {} | {:.2f} | {:.1f} |\n", part, model,
      s.configs(), s.mape_pct(), s.p90_pct(), s.max_pct(), s.selection_accuracy_pct(),
      s.paired_configs() == 0 ? std::string("-")
                              : fmt::format("{:.1f}", s.selection_accuracy_tied_pct()),
      s.mean_regret_pct(), s.max_regret_pct());
}

}  // namespace

absl::Status ValidateCmd(const ValidateArgs& a) {
  if (a.layers.empty() == a.models.empty()) {
    return absl::InvalidArgumentError(
        "give one of --layers GRID (layer configs), --models GRID (whole models) or --published "
        "DATASET (published training runs)");
  }
  if (a.profile.empty()) {
    return absl::InvalidArgumentError("--profile: required with --layers or --models");
  }
  MOEPLAN_ASSIGN_OR_RETURN(calibration::LoadedProfile profile, calibration::LoadProfile(a.profile));
  if (a.holdout < 0.0 || a.holdout > 0.9) {
    return absl::InvalidArgumentError(Cat("--holdout: must be in [0, 0.9] (got ", a.holdout, ")"));
  }
  const bool holdout = a.holdout > 0.0;
  if (holdout && a.out_dir.empty()) {
    return absl::InvalidArgumentError(
        "--holdout: writes the refitted profile (refit-profile.json): give --out-dir");
  }
  if (holdout && profile.message.context().ops_size() > 0) {
    // The corrections are fitted against the profile's own model: start from
    // it without the old ones.
    fmt::print(stderr,
               "moeplan validate: --holdout: ignoring the {} op corrections profile {} has and "
               "fitting new ones\n",
               profile.message.context().ops_size(), profile.message.name());
    profile.message.mutable_context()->clear_ops();
    profile.message.mutable_context()->clear_ops_fitted_on();
    MOEPLAN_ASSIGN_OR_RETURN(profile.profile, proto::ProfileFromProto(profile.message));
  }
  MOEPLAN_ASSIGN_OR_RETURN(p::CostModel cost, p::CostModel::Create(profile.profile));
  const std::string& grid_file = a.layers.empty() ? a.models : a.layers;
  MOEPLAN_ASSIGN_OR_RETURN(std::unique_ptr<ValidationSubject> subject,
                           a.layers.empty() ? ModelSubject(a.models) : LayerSubject(a.layers));
  if (!a.out_dir.empty()) MOEPLAN_RETURN_IF_ERROR(RefuseOutputsOverInputs(a, subject->size()));
  MOEPLAN_ASSIGN_OR_RETURN(Setup setup, Prepare(a, profile.message));

  std::vector<calibration::ValidationInput> inputs;
  std::vector<std::string> skipped;
  for (size_t i = 0; i < subject->size(); ++i) {
    MOEPLAN_ASSIGN_OR_RETURN(ConfigRun run, RunConfig(a, setup, profile, cost, *subject, i));
    if (run.input.has_value()) {
      inputs.push_back(*std::move(run.input));
    } else {
      skipped.push_back(std::move(run.skipped));
    }
  }
  if (inputs.empty()) {
    return absl::FailedPreconditionError(Cat("no config of ", grid_file, " ran (", skipped.size(),
                                             " skipped; first: ", skipped.empty() ? "" : skipped[0],
                                             ")"));
  }
  const std::string& name = profile.message.name();
  const int hosts = profile.message.nodes();
  const std::string& profiled = profile.message.provenance().mpi_wait();
  if (!profiled.empty() && !inputs.front().mpi_wait.empty() &&
      inputs.front().mpi_wait != profiled) {
    fmt::print(stderr,
               "moeplan validate: warning: the runs waited with --mpi-wait {}, the profile was "
               "measured with {}: their times are not comparable\n",
               inputs.front().mpi_wait, profiled);
  }
  // Every run kept ran on the profile's nodes (RunConfig fails otherwise).
  if (!holdout) {
    MOEPLAN_ASSIGN_OR_RETURN(v1::ValidationSummary summary,
                             calibration::Summarize(inputs, name, setup.ranks, hosts));
    MOEPLAN_ASSIGN_OR_RETURN(
        Written written, WriteReport(a, setup, *subject, profile.message, summary, skipped, ""));
    return PrintSummary(a.json, summary, skipped.size(), written);
  }

  // --holdout: fit op corrections on one part, judge them on the other.
  const std::vector<bool> held = HoldoutSplit(*subject, inputs, a.holdout, a.seed);
  const std::vector<calibration::ValidationInput> fit_part = Part(inputs, held, false);
  const std::vector<calibration::ValidationInput> held_part = Part(inputs, held, true);
  if (held_part.empty()) {
    return absl::FailedPreconditionError(
        Cat("--holdout ", a.holdout, ": no config is held out of the ", inputs.size(),
            " that ran (each layout keeps at least one for the fit); raise --holdout"));
  }
  calibration::OpContextOptions fit_options;
  fit_options.seed = a.seed;
  MOEPLAN_ASSIGN_OR_RETURN(std::vector<v1::OpContext> ops,
                           calibration::FitOpContexts(fit_part, fit_options));
  calibration::LoadedProfile refit;
  refit.message = profile.message;
  refit.message.set_version(profile.message.version() + 1);
  v1::ContextModel* ctx = refit.message.mutable_context();
  for (v1::OpContext& c : ops) *ctx->add_ops() = c;
  ctx->set_ops_fitted_on(fmt::format(
      "moeplan validate --holdout {} --seed {}: {} of the {} {}s of {} ({}), measured on {} "
      "host(s) x {} ranks",
      a.holdout, a.seed, fit_part.size(), inputs.size(), subject->noun(), grid_file,
      subject->grid_name(), hosts, setup.ranks));
  MOEPLAN_ASSIGN_OR_RETURN(refit.profile, proto::ProfileFromProto(refit.message));
  MOEPLAN_ASSIGN_OR_RETURN(p::CostModel refit_cost, p::CostModel::Create(refit.profile));
  std::vector<std::string> dropped;
  MOEPLAN_ASSIGN_OR_RETURN(const Repredicted fit,
                           Repredict(*subject, fit_part, refit, refit_cost, &dropped));
  MOEPLAN_ASSIGN_OR_RETURN(const Repredicted held_out,
                           Repredict(*subject, held_part, refit, refit_cost, &dropped));
  if (held_out.refit.empty() || fit.refit.empty()) {
    return absl::FailedPreconditionError(Cat(
        "--holdout: the refitted profile plans other plans than ran for every config of one part "
        "(first: ",
        dropped.empty() ? "" : dropped[0], "): validate again with it instead"));
  }
  const std::string refit_file = (setup.dir / "refit-profile.json").string();
  MOEPLAN_ASSIGN_OR_RETURN(std::string refit_json, proto::ToJson(refit.message));
  MOEPLAN_RETURN_IF_ERROR(proto::WriteFileAtomic(refit_file, refit_json + "\n"));

  MOEPLAN_ASSIGN_OR_RETURN(v1::ValidationSummary s_held,
                           calibration::Summarize(held_out.refit, name, setup.ranks, hosts));
  MOEPLAN_ASSIGN_OR_RETURN(v1::ValidationSummary s_held_base,
                           calibration::Summarize(held_out.base, name, setup.ranks, hosts));
  MOEPLAN_ASSIGN_OR_RETURN(v1::ValidationSummary s_fit,
                           calibration::Summarize(fit.refit, name, setup.ranks, hosts));
  MOEPLAN_ASSIGN_OR_RETURN(v1::ValidationSummary s_fit_base,
                           calibration::Summarize(fit.base, name, setup.ranks, hosts));
  std::string section = fmt::format(
      "## Held-out validation\n\n"
      "`--holdout {} --seed {}`: of the {} configs that ran, {} (a seeded {:.0f} % of each layout) "
      "were held out; in-context op corrections (offset + scale × the profile's cost of the op, "
      "docs/cost-model.md \"In context\") were fitted on the other {} and written with the "
      "profile as `refit-profile.json` (version {}). The rest of this report is about the "
      "held-out configs, predicted with the refitted profile: configs the fit never saw.\n\n",
      a.holdout, a.seed, inputs.size(), held_part.size(), a.holdout * 100.0, fit_part.size(),
      refit.message.version());
  if (!dropped.empty()) {
    fmt::format_to(std::back_inserter(section),
                   "{} config{} left out of the comparison: the refitted profile plans another "
                   "plan than ran (measure {} again with it):\n\n",
                   dropped.size(), dropped.size() == 1 ? " is" : "s are",
                   dropped.size() == 1 ? "it" : "them");
    for (const std::string& d : dropped) section += "- " + d + "\n";
    section += "\n";
  }
  section +=
      "| configs | model | n | MAPE % | p90 % | max % | selection % | ties counted % | mean "
      "regret % | max regret % |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  section += SummaryRow("held out", "refitted", s_held);
  section += SummaryRow("held out", "profile alone", s_held_base);
  section += SummaryRow("fit", "refitted", s_fit);
  section += SummaryRow("fit", "profile alone", s_fit_base);
  section += "\nCorrections fitted (scale ± is the half-width of its bootstrap 95 % interval):\n\n";
  section += calibration::RenderOpContexts(ops);
  section += "\n";
  MOEPLAN_ASSIGN_OR_RETURN(
      Written written, WriteReport(a, setup, *subject, refit.message, s_held, skipped, section));
  fmt::print(stderr,
             "moeplan validate: held out {} of {} configs; fit part: MAPE {:.1f} % (profile "
             "alone {:.1f} %); held out with the profile alone: MAPE {:.1f} %; refitted profile: "
             "{}\n",
             held_part.size(), inputs.size(), s_fit.mape_pct(), s_fit_base.mape_pct(),
             s_held_base.mape_pct(), refit_file);
  return PrintSummary(a.json, s_held, skipped.size(), written);
}

absl::Status AddDrift(const calibration::ValidationInput& in, double reference_gflops,
                      const planner::OpGraph& graph,
                      calibration::ValidationInput::CandidateReplay* r) {
  const double run = calibration::RunProbeGflops(in, r->candidate);
  if (!(run > 0.0) || !(reference_gflops > 0.0) || !std::isfinite(reference_gflops)) {
    return absl::OkStatus();
  }
  MOEPLAN_ASSIGN_OR_RETURN(const double us,
                           requests::ScaledComputeMakespan(graph, reference_gflops / run));
  r->has_drift = true;
  r->drift_pct = 100.0 * (run / reference_gflops - 1.0);
  r->drift_corrected_us = us;
  return absl::OkStatus();
}

}  // namespace moeplan::client
