#include "moeplan/client/calibration_cmds.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "moeplan/calibration/fit.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/calibration/validation.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/status_macros.h"
#include "moeplan/planner/strings.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/v1/exec.pb.h"

namespace moeplan::client {

namespace fs = std::filesystem;
namespace p = ::moeplan::planner;

namespace {

absl::Status Print(const std::string& text, std::FILE* to = stdout) {
  if (std::fwrite(text.data(), 1, text.size(), to) != text.size() || std::fflush(to) != 0) {
    return absl::InternalError("write to stdout failed");
  }
  return absl::OkStatus();
}

// The profile's name from the output file: "out/cpu-2x2.json" -> "cpu-2x2".
std::string StemOf(const std::string& path) { return fs::path(path).stem().string(); }

// 'path' for /bin/sh.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

// moeplan-exec next to this binary's build tree (build/client/moeplan ->
// build/executor/moeplan-exec) or installed beside it; else the PATH's.
std::string DefaultExec() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& cand : {self.parent_path().parent_path() / "executor" / "moeplan-exec",
                                 self.parent_path() / "moeplan-exec"}) {
      if (fs::exists(cand, ec)) return cand.string();
    }
  }
  return "moeplan-exec";
}

struct Ran {
  int exit_code = 0;
  std::string out;
};

// Runs `command` under /bin/sh, collecting stdout (stderr goes where the
// command sends it).
absl::StatusOr<Ran> RunCommand(const std::string& command) {
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return absl::InternalError(Cat("cannot start '", command, "': ", std::strerror(errno)));
  }
  Ran r;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string ConfigName(size_t i, const v1::LayerConfig& l) {
  return fmt::format("grid[{}] B={} L={} M={} H={} E={} k={} f={:g} mp={} ep={} esp={}", i,
                     l.batch_size(), l.seq_len(), l.model_dim(), l.hidden_dim(), l.num_experts(),
                     l.top_k(), l.capacity_factor(), l.parallel().mp(), l.parallel().ep(),
                     l.parallel().esp());
}

// The last non-empty line of a log: what moeplan-exec said before it stopped.
std::string LastLine(const std::string& path) {
  absl::StatusOr<std::string> text = proto::ReadFile(path);
  if (!text.ok()) return "";
  std::string s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  const size_t at = s.rfind('\n');
  return at == std::string::npos ? s : s.substr(at + 1);
}

bool HaveGnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

}  // namespace

absl::Status CalibrateCmd(const CalibrateArgs& a) {
  MOEPLAN_ASSIGN_OR_RETURN(std::vector<v1::ProfileSample> samples,
                           calibration::ReadSamples(a.samples));
  calibration::CalibrateOptions options;
  options.name = a.name.empty() ? StemOf(a.out) : a.name;
  options.comment = a.comment;
  options.version = a.version;
  options.tolerance = a.tolerance_pct / 100.0;
  absl::StatusOr<calibration::Calibration> c = calibration::Calibrate(samples, options);
  if (!c.ok()) {
    return absl::Status(c.status().code(), Cat(a.samples, ": ", View(c.status().message())));
  }
  MOEPLAN_ASSIGN_OR_RETURN(std::string json, proto::ToJson(c->profile));
  if (absl::Status s = proto::WriteFileAtomic(a.out, json + "\n"); !s.ok()) {
    return absl::Status(s.code(), Cat("--out: ", View(s.message())));
  }
  std::string text = calibration::RenderFitReport(*c);
  text += fmt::format("wrote {} (profile {}, {} samples, {} collective fits, source: measured)\n",
                      a.out, c->profile.name(), samples.size(), c->profile.collectives_size());
  return Print(text);
}

absl::Status ValidateCmd(const ValidateArgs& a) {
  MOEPLAN_ASSIGN_OR_RETURN(calibration::LoadedProfile profile, calibration::LoadProfile(a.profile));
  MOEPLAN_ASSIGN_OR_RETURN(p::CostModel cost, p::CostModel::Create(profile.profile));
  v1::LayerGrid grid;
  MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(a.layers, &grid));
  absl::StatusOr<std::vector<v1::LayerConfig>> configs = proto::ExpandGrid(grid);
  if (!configs.ok()) {
    return absl::InvalidArgumentError(Cat(a.layers, ": ", View(configs.status().message())));
  }
  if (a.iters < 1) return absl::InvalidArgumentError("--iters: must be >= 1");
  if (a.warmup < 0) return absl::InvalidArgumentError("--warmup: must be >= 0");
  const int nodes = profile.message.nodes();
  const int ranks = a.ranks > 0 ? a.ranks : nodes * profile.message.gpus_per_node();
  const fs::path dir(a.out_dir);
  std::error_code ec;
  for (const char* sub : {"configs", "exec", "logs"}) {
    fs::create_directories(dir / sub, ec);
    if (ec)
      return absl::PermissionDeniedError(
          Cat("--out-dir: ", (dir / sub).string(), ": ", ec.message()));
  }
  const std::string exec = a.exec.empty() ? DefaultExec() : a.exec;
  const std::string launcher = Replace(a.launcher, "{ranks}", std::to_string(ranks));

  p::LayerPlanner planner(cost);
  std::vector<calibration::ValidationInput> inputs;
  std::vector<std::string> skipped;
  int hosts = 0;
  for (size_t i = 0; i < configs->size(); ++i) {
    const v1::LayerConfig& layer = (*configs)[i];
    const std::string stem = fmt::format("{:03d}", i);
    const std::string config_file = (dir / "configs" / (stem + ".json")).string();
    const std::string log_file = (dir / "logs" / (stem + ".log")).string();
    MOEPLAN_ASSIGN_OR_RETURN(std::string layer_json, proto::ToJson(layer));
    MOEPLAN_RETURN_IF_ERROR(proto::WriteFileAtomic(config_file, layer_json + "\n"));
    const std::string name = ConfigName(i, layer);
    const std::string command = fmt::format(
        "{} {} --layer {} --schedule all --json --iters {} --warmup {} --profile {} 2>{}", launcher,
        Quote(exec), Quote(config_file), a.iters, a.warmup, Quote(a.profile), Quote(log_file));
    fmt::print(stderr, "moeplan validate: [{}/{}] {}\n", i + 1, configs->size(), name);
    MOEPLAN_ASSIGN_OR_RETURN(Ran ran, RunCommand(command));
    v1::ExecReport report;
    absl::Status parsed =
        ran.exit_code == 0 ? proto::ParseJson(ran.out, &report) : absl::UnknownError("");
    if (!parsed.ok()) {
      // A layout the executor rejects (or a failed run): listed, not fatal.
      std::string why = LastLine(log_file);
      if (why.empty()) why = Cat("exit code ", ran.exit_code, View(parsed.message()));
      skipped.push_back(fmt::format("{}: {} (log: {})", name, why, log_file));
      fmt::print(stderr, "moeplan validate:   skipped: {}\n", why);
      continue;
    }
    MOEPLAN_RETURN_IF_ERROR(
        proto::WriteFileAtomic((dir / "exec" / (stem + ".json")).string(), ran.out));
    if (report.hosts() != nodes) {
      return absl::FailedPreconditionError(fmt::format(
          "moeplan-exec ran on {} host(s) but profile {} describes {} node(s): validate where the "
          "profile was measured (e.g. inside scripts/testbed/testbed.sh with the same --nodes)",
          report.hosts(), profile.message.name(), nodes));
    }
    hosts = report.hosts();
    // The planner on what ran: the executor's element size, its schedules.
    MOEPLAN_ASSIGN_OR_RETURN(p::LayerConfig ran_layer, proto::LayerFromProto(report.layer()));
    v1::PlanLayerRequest request;
    request.set_profile_name(profile.message.name());
    request.set_include_timeline(true);
    for (const v1::CandidatePlan& c : report.candidates()) request.add_schedules(c.schedule());
    v1::PlanLayerResponse predicted;
    if (absl::Status s =
            proto::AnswerPlanLayer(ran_layer, request, planner, profile.profile, &predicted);
        !s.ok()) {
      skipped.push_back(fmt::format("{}: the planner rejects it: {}", name, View(s.message())));
      continue;
    }
    calibration::ValidationInput in;
    in.name = name;
    in.layer = report.layer();
    in.measured.assign(report.candidates().begin(), report.candidates().end());
    in.predicted.assign(predicted.candidates().begin(), predicted.candidates().end());
    in.iterations.assign(report.iterations().begin(), report.iterations().end());
    in.paired = report.interleaved();
    std::string line = "moeplan validate:  ";
    for (const v1::CandidatePlan& m : in.measured) {
      for (const v1::CandidatePlan& pr : in.predicted) {
        if (pr.schedule() != m.schedule()) continue;
        fmt::format_to(std::back_inserter(line), " {} {:.1f}/{:.1f} ms",
                       View(std::string(p::ScheduleName(*proto::ScheduleFromProto(m.schedule())))),
                       m.total_us() / 1e3, pr.total_us() / 1e3);
      }
    }
    fmt::print(stderr, "{} (measured/predicted)\n", line);
    inputs.push_back(std::move(in));
  }
  if (inputs.empty()) {
    return absl::FailedPreconditionError(Cat("no config of ", a.layers, " ran (", skipped.size(),
                                             " skipped; first: ", skipped.empty() ? "" : skipped[0],
                                             ")"));
  }
  MOEPLAN_ASSIGN_OR_RETURN(v1::ValidationSummary summary,
                           calibration::Summarize(inputs, profile.message.name(), ranks, hosts));

  calibration::ReportContext ctx;
  ctx.command = fmt::format("{} {} --layer CONFIG --schedule all --json --iters {} --warmup {}",
                            launcher, exec, a.iters, a.warmup);
  ctx.profile_comment = profile.message.comment();
  const std::string data_file = (dir / "plot.dat").string();
  const std::string script_file = (dir / "plot.gp").string();
  const std::string png_file = (dir / "plot.png").string();
  MOEPLAN_RETURN_IF_ERROR(proto::WriteFileAtomic(data_file, calibration::PlotData(summary)));
  MOEPLAN_RETURN_IF_ERROR(proto::WriteFileAtomic(
      script_file, calibration::GnuplotScript(summary, data_file, png_file)));
  std::string plot_note;
  if (!HaveGnuplot()) {
    plot_note =
        fmt::format("gnuplot not found (apt-get install gnuplot-nox): plot data in {}", data_file);
  } else if (std::system(Cat("gnuplot ", Quote(script_file)).c_str()) != 0) {
    plot_note = fmt::format("gnuplot failed on {}", script_file);
  } else {
    ctx.plot_file = "plot.png";
  }
  std::string markdown = calibration::RenderMarkdown(summary, ctx);
  if (!skipped.empty()) {
    markdown += fmt::format("\n## Configs not run ({})\n\n", skipped.size());
    for (const std::string& s : skipped) markdown += "- " + s + "\n";
  }
  const std::string report_file = (dir / "report.md").string();
  MOEPLAN_RETURN_IF_ERROR(proto::WriteFileAtomic(report_file, markdown));
  if (!plot_note.empty()) fmt::print(stderr, "moeplan validate: warning: {}\n", plot_note);

  if (a.json) {
    MOEPLAN_ASSIGN_OR_RETURN(std::string json, proto::ToJson(summary));
    return Print(json + "\n");
  }
  return Print(fmt::format(
      "validated {} configs x schedules = {} points on {} ({} ranks, {} hosts){}\n"
      "total time: MAPE {:.1f} %, p90 {:.1f} %, max {:.1f} % ({})\n"
      "selection: predicted best = measured best in {:.1f} % of configs; mean regret {:.2f} %\n"
      "{}"
      "report: {}{}\n",
      summary.configs(), summary.points(), profile.message.name(), ranks, hosts,
      skipped.empty() ? "" : fmt::format("; {} configs not run (see the report)", skipped.size()),
      summary.mape_pct(), summary.p90_pct(), summary.max_pct(), summary.worst_config(),
      summary.selection_accuracy_pct(), summary.mean_regret_pct(),
      summary.paired_configs() == 0
          ? std::string()
          : fmt::format("selection, ties for best counted: {:.1f} % of {} configs ({} with a "
                        "tie)\n",
                        summary.selection_accuracy_tied_pct(), summary.paired_configs(),
                        summary.tied_configs()),
      report_file, ctx.plot_file.empty() ? "" : fmt::format(", plot: {}", png_file)));
}

}  // namespace moeplan::client
