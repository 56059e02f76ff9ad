// moeplan: the command-line planner (DESIGN §7). Plans locally against built-in
// or file profiles; the --server mode arrives with the service issue.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/client/calibration_cmds.h"
#include "moeplan/client/planner_client.h"
#include "moeplan/client/report.h"
#include "moeplan/client/sweep.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/strings.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"

namespace moeplan::client {
namespace {

namespace p = ::moeplan::planner;

// One line on stderr, non-zero exit.
int Fail(const absl::Status& s) {
  std::string msg(View(s.message()));
  for (char& c : msg) {
    if (c == '\n') c = ' ';
  }
  fmt::print(stderr, "moeplan: error: {}\n", msg);
  return 1;
}

absl::StatusOr<std::vector<p::Schedule>> ParseSchedules(const std::string& list) {
  std::vector<p::Schedule> out;
  if (list.empty() || list == "all") return out;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    p::Schedule s;
    const std::string_view name = View(part);
    if (!p::ParseSchedule(name, &s)) {
      return absl::InvalidArgumentError(
          Cat("--schedules: unknown schedule '", name, "' (use default, s1, s2 or all)"));
    }
    if (std::find(out.begin(), out.end(), s) != out.end()) {
      return absl::InvalidArgumentError(Cat("--schedules: '", name, "' listed twice"));
    }
    out.push_back(s);
  }
  return out;
}

// Prefixes a layer error with the file it came from; the file *is* the layer, so
// the request path "layer." is dropped.
// Errors about other request fields (profile_name, schedules) pass unchanged.
absl::Status InFile(const std::string& path, const absl::Status& s) {
  std::string_view msg = View(s.message());
  if (msg.rfind("layer.", 0) != 0) return s;
  msg.remove_prefix(6);
  return absl::Status(s.code(), Cat(path, ": ", msg));
}

absl::Status WriteStdout(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    return absl::InternalError("stdout: write failed");
  }
  return absl::OkStatus();
}

struct PlanLayerArgs {
  std::string layer;
  std::string cluster = std::string(calibration::kDefaultProfileName);
  std::string schedules = "all";
  std::string format = "table";
  std::string trace;
  bool no_timeline = false;
  std::string server;  // empty: plan locally
};

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Plans on a server: a --cluster that names an existing file is sent inline,
// anything else is a profile name the server resolves (built-in or stored).
absl::Status PlanOnServer(const std::string& server, const std::string& cluster,
                          v1::PlanLayerRequest* request, v1::PlanLayerResponse* response,
                          v1::ClusterProfile* profile) {
  PlannerClient client(server);
  if (IsFile(cluster) && !calibration::BuiltinProfile(cluster).ok()) {
    if (absl::Status s = proto::ReadJsonFile(cluster, request->mutable_profile()); !s.ok())
      return s;
    *profile = request->profile();
  } else {
    request->set_profile_name(cluster);
  }
  absl::StatusOr<v1::PlanLayerResponse> r = client.PlanLayer(*request);
  if (!r.ok()) return r.status();
  *response = *std::move(r);
  if (request->has_profile()) return absl::OkStatus();
  absl::StatusOr<v1::ClusterProfile> p = client.GetProfile(cluster);
  if (!p.ok()) return p.status();
  *profile = *std::move(p);
  return absl::OkStatus();
}

absl::Status PlanLayerCmd(const PlanLayerArgs& a) {
  absl::StatusOr<std::vector<p::Schedule>> schedules = ParseSchedules(a.schedules);
  if (!schedules.ok()) return schedules.status();
  v1::PlanLayerRequest request;
  if (absl::Status s = proto::ReadJsonFile(a.layer, request.mutable_layer()); !s.ok()) return s;
  for (p::Schedule s : *schedules) request.add_schedules(proto::ScheduleToProto(s));
  request.set_include_timeline(!a.no_timeline || !a.trace.empty());
  v1::PlanLayerResponse response;
  v1::ClusterProfile profile_message;
  if (!a.server.empty()) {
    if (absl::Status s = PlanOnServer(a.server, a.cluster, &request, &response, &profile_message);
        !s.ok()) {
      return InFile(a.layer, s);
    }
  } else {
    absl::StatusOr<calibration::LoadedProfile> profile = calibration::LoadProfile(a.cluster);
    if (!profile.ok()) return profile.status();
    request.set_profile_name(profile->message.name());
    absl::StatusOr<p::CostModel> cost = p::CostModel::Create(profile->profile);
    if (!cost.ok()) return cost.status();
    p::LayerPlanner planner(*cost);
    if (absl::Status s = proto::AnswerPlanLayer(request, planner, profile->profile, &response);
        !s.ok()) {
      return InFile(a.layer, s);
    }
    profile_message = std::move(profile->message);
  }
  // Echo the layer with defaults filled in (dp, pp, b, skew) for the table.
  absl::StatusOr<p::LayerConfig> layer = proto::LayerFromProto(request.layer());
  if (!layer.ok())
    return absl::Status(layer.status().code(), Cat(a.layer, ": ", View(layer.status().message())));
  const v1::LayerConfig shown = proto::LayerToProto(*layer);

  // Everything is computed before anything is written: an error leaves no output.
  v1::PlanLayerResponse printed = response;
  if (a.no_timeline) {
    for (v1::CandidatePlan& c : *printed.mutable_candidates()) c.clear_ops();
  }
  std::string text;
  if (a.format == "json") {
    absl::StatusOr<std::string> json = proto::ToJson(printed);
    if (!json.ok()) return json.status();
    text = *std::move(json) + "\n";
  } else {
    text = FormatPlanTable(shown, printed, profile_message);
  }
  if (!a.trace.empty()) {
    proto::JsonStyle style;
    style.pretty = false;
    style.preserve_proto_field_names = false;  // Chrome's camelCase keys
    absl::StatusOr<std::string> trace = proto::ToJson(BuildTrace(response), style);
    if (!trace.ok()) return trace.status();
    if (absl::Status s = proto::WriteFileAtomic(a.trace, *trace + "\n"); !s.ok()) {
      return absl::Status(s.code(), Cat("--trace: ", View(s.message())));
    }
  }
  return WriteStdout(text);
}

struct SweepArgs {
  std::string grid;
  std::string cluster = std::string(calibration::kDefaultProfileName);
  std::string schedules = "all";
  std::string out;
  bool skip_invalid = false;
};

absl::Status SweepCmd(const SweepArgs& a) {
  SweepOptions options;
  absl::StatusOr<std::vector<p::Schedule>> schedules = ParseSchedules(a.schedules);
  if (!schedules.ok()) return schedules.status();
  options.schedules = *std::move(schedules);
  options.skip_invalid = a.skip_invalid;
  v1::LayerGrid grid;
  if (absl::Status s = proto::ReadJsonFile(a.grid, &grid); !s.ok()) return s;
  absl::StatusOr<std::vector<v1::LayerConfig>> configs = proto::ExpandGrid(grid);
  if (!configs.ok())
    return absl::InvalidArgumentError(Cat(a.grid, ": ", View(configs.status().message())));
  absl::StatusOr<calibration::LoadedProfile> profile = calibration::LoadProfile(a.cluster);
  if (!profile.ok()) return profile.status();
  absl::StatusOr<p::CostModel> cost = p::CostModel::Create(profile->profile);
  if (!cost.ok()) return cost.status();

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<SweepResult> result = RunSweep(*configs, *cost, options);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!result.ok()) {
    return absl::Status(result.status().code(),
                        Cat(a.grid, ": ", View(result.status().message()),
                            a.skip_invalid ? "" : "; pass --skip-invalid to skip such configs"));
  }
  if (absl::Status s = proto::WriteFileAtomic(a.out, SweepCsv(*result)); !s.ok()) {
    return absl::Status(s.code(), Cat("--out: ", View(s.message())));
  }
  std::string text = fmt::format("sweep {} on {} (v{}): planned in {:.1f} ms ({:.1f} us/config)\n",
                                 grid.name().empty() ? a.grid : grid.name(),
                                 profile->message.name(), profile->message.version(), ms,
                                 result->configs ? 1000.0 * ms / result->configs : 0.0);
  text += SweepSummary(*result);
  text += fmt::format("wrote {} ({} rows)\n", a.out, result->rows.size());
  return WriteStdout(text);
}

absl::StatusOr<v1::ListProfilesResponse> LocalProfiles() {
  v1::ListProfilesResponse out;
  for (const std::string& name : calibration::BuiltinProfileNames()) {
    absl::StatusOr<v1::ClusterProfile> prof = calibration::BuiltinProfile(name);
    if (!prof.ok()) return prof.status();
    v1::ProfileSummary* s = out.add_profiles();
    s->set_name(prof->name());
    s->set_version(prof->version());
    s->set_source(prof->source());
    s->set_nodes(prof->nodes());
    s->set_gpus_per_node(prof->gpus_per_node());
    s->set_comment(prof->comment());
  }
  return out;
}

absl::Status ProfilesListCmd(const std::string& server) {
  absl::StatusOr<v1::ListProfilesResponse> list =
      server.empty() ? LocalProfiles() : PlannerClient(server).ListProfiles();
  if (!list.ok()) return list.status();
  std::string text = fmt::format("{:<16}{:<10}{:>8}{:>8}{:>6}  {}\n", "name", "source", "version",
                                 "nodes", "gpus", "summary");
  for (const v1::ProfileSummary& prof : list->profiles()) {
    std::string summary = prof.comment().substr(0, prof.comment().find(". "));
    if (prof.name() == calibration::kDefaultProfileName) summary += " [default]";
    fmt::format_to(std::back_inserter(text), "{:<16}{:<10}{:>8}{:>8}{:>6}  {}\n", prof.name(),
                   prof.source() == v1::PROFILE_SOURCE_SPEC ? "spec" : "measured", prof.version(),
                   prof.nodes(), prof.gpus_per_node(), summary);
  }
  return WriteStdout(text);
}

absl::Status ProfilesShowCmd(const std::string& name, const std::string& server) {
  absl::StatusOr<v1::ClusterProfile> prof =
      server.empty() ? calibration::ResolveProfile(name) : PlannerClient(server).GetProfile(name);
  if (!prof.ok()) return prof.status();
  absl::StatusOr<std::string> json = proto::ToJson(*prof);
  if (!json.ok()) return json.status();
  return WriteStdout(*json + "\n");
}

absl::Status ProfilesPutCmd(const std::string& file, const std::string& server) {
  if (server.empty()) {
    return absl::InvalidArgumentError(
        "--server: profiles put stores a profile on a server; give its address");
  }
  v1::ClusterProfile prof;
  if (absl::Status s = proto::ReadJsonFile(file, &prof); !s.ok()) return s;
  absl::StatusOr<v1::PutProfileResponse> r = PlannerClient(server).PutProfile(prof);
  if (!r.ok()) return absl::Status(r.status().code(), Cat(file, ": ", View(r.status().message())));
  return WriteStdout(
      fmt::format("stored profile {} version {} on {}\n", r->name(), r->version(), server));
}

int Main(int argc, char** argv) {
  CLI::App app{"moeplan: plan communication schedules for distributed MoE training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moeplan 0.1.0");
  // Usage errors on one line too, like every other error.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("moeplan: error: {} (see moeplan --help)\n", e.what());
  });

  PlanLayerArgs pl;
  CLI::App* plan = app.add_subcommand(
      "plan-layer",
      "Simulate default, S1 and S2 for one MoE layer (forward + backward) and rank them");
  plan->add_option("--layer", pl.layer, "Layer config (moeplan.v1.LayerConfig JSON)")->required();
  plan->add_option("--cluster", pl.cluster,
                   "Built-in profile name (see `moeplan profiles list`) or profile JSON file")
      ->capture_default_str();
  plan->add_option("--schedules", pl.schedules, "Comma-separated subset of default,s1,s2, or all")
      ->capture_default_str();
  plan->add_option("--format", pl.format, "Output format")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  plan->add_option("--trace", pl.trace,
                   "Write a Chrome trace (open in Perfetto / chrome://tracing) to this file");
  plan->add_flag("--no-timeline", pl.no_timeline, "Leave the per-op timelines out of the output");
  plan->add_option("--server", pl.server,
                   "Plan on a moeplan-server at host:port instead of locally (same output)");

  SweepArgs sw;
  CLI::App* sweep = app.add_subcommand(
      "sweep",
      "Plan every config of a grid (cartesian product of lists) and summarise the choices");
  sweep->add_option("--grid", sw.grid, "Grid file (moeplan.v1.LayerGrid JSON)")->required();
  sweep->add_option("--cluster", sw.cluster, "Built-in profile name or profile JSON file")
      ->capture_default_str();
  sweep->add_option("--schedules", sw.schedules, "Comma-separated subset of default,s1,s2, or all")
      ->capture_default_str();
  sweep->add_option("--out", sw.out, "CSV file to write (one row per config)")->required();
  sweep->add_flag("--skip-invalid", sw.skip_invalid,
                  "Skip configs that fail validation (counted in the summary) instead of failing");

  CLI::App* profiles = app.add_subcommand("profiles", "Cluster profiles (built-in, or a server's)");
  profiles->require_subcommand(1);
  std::string server, profile_name, profile_file;
  CLI::App* list = profiles->add_subcommand("list", "List the profiles");
  list->add_option("--server", server, "List a moeplan-server's profiles (host:port)");
  CLI::App* show = profiles->add_subcommand("show", "Print a profile (name or file) as JSON");
  show->add_option("name", profile_name, "Profile name or file")->required();
  show->add_option("--server", server, "Ask a moeplan-server (host:port)");
  CLI::App* get = profiles->add_subcommand("get", "Print a profile as JSON (same as show)");
  get->add_option("name", profile_name, "Profile name or file")->required();
  get->add_option("--server", server, "Ask a moeplan-server (host:port)");
  CLI::App* put = profiles->add_subcommand("put", "Store a profile file on a moeplan-server");
  put->add_option("file", profile_file, "Profile JSON (moeplan.v1.ClusterProfile)")->required();
  put->add_option("--server", server, "The moeplan-server (host:port)")->required();

  CalibrateArgs ca;
  CLI::App* calibrate = app.add_subcommand(
      "calibrate",
      "Fit a measured cluster profile (alpha-beta per collective and link, GEMM efficiency, "
      "memory bandwidth) from moeplan-profile samples and report how well each fit holds");
  calibrate->add_option("--samples", ca.samples, "Samples from moeplan-profile (JSON Lines)")
      ->required();
  calibrate->add_option("--out", ca.out, "Profile JSON to write")->required();
  calibrate->add_option("--name", ca.name, "Profile name (default: the --out file's stem)");
  calibrate->add_option("--comment", ca.comment, "Free text added to the profile's comment");
  calibrate
      ->add_option("--version", ca.version,
                   "Profile version: bump it when re-calibrating a profile of the same name, so "
                   "servers and clients see the numbers changed")
      ->check(CLI::Range(1u, 1000000u))
      ->capture_default_str();
  calibrate
      ->add_option("--tolerance", ca.tolerance_pct,
                   "Relative error (%) under which a fit counts as holding")
      ->capture_default_str();

  ValidateArgs va;
  CLI::App* validate = app.add_subcommand(
      "validate",
      "Run moeplan-exec (under mpirun) on every config of a grid and schedule, predict the same "
      "with the planner, and report the error (Markdown + PNG scatter plot)");
  validate->add_option("--profile", va.profile, "Profile to validate (name or file)")->required();
  validate->add_option("--layers", va.layers, "Layer grid (moeplan.v1.LayerGrid JSON)")->required();
  validate->add_option("--ranks", va.ranks,
                       "Ranks to launch (default: the profile's nodes x GPUs)");
  validate
      ->add_option("--launcher", va.launcher,
                   "Shell text that launches moeplan-exec; {ranks} is replaced")
      ->capture_default_str();
  validate->add_option("--exec", va.exec, "moeplan-exec binary (default: next to moeplan)");
  validate->add_option("--iters", va.iters, "Timed iterations per schedule")->capture_default_str();
  validate->add_option("--warmup", va.warmup, "Untimed iterations first")->capture_default_str();
  validate
      ->add_option("--out-dir", va.out_dir, "Directory for report.md, plot.png and the runs' files")
      ->capture_default_str();
  validate->add_flag("--json", va.json, "Print the summary as JSON (moeplan.v1.ValidationSummary)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  absl::Status status;
  if (plan->parsed()) {
    status = PlanLayerCmd(pl);
  } else if (sweep->parsed()) {
    status = SweepCmd(sw);
  } else if (calibrate->parsed()) {
    status = CalibrateCmd(ca);
  } else if (validate->parsed()) {
    status = ValidateCmd(va);
  } else if (show->parsed() || get->parsed()) {
    status = ProfilesShowCmd(profile_name, server);
  } else if (put->parsed()) {
    status = ProfilesPutCmd(profile_file, server);
  } else {
    status = ProfilesListCmd(server);
  }
  return status.ok() ? 0 : Fail(status);
}

}  // namespace
}  // namespace moeplan::client

int main(int argc, char** argv) { return moeplan::client::Main(argc, argv); }
