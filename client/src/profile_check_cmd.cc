// `moeplan profile-check`: re-measures a few points with moeplan-profile --check
// (under a launcher, mpirun by default) and reports each cost-model term's
// drift from a profile (calibration/profile_check.h, docs/calibration.md).
#include <fmt/format.h>

#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "cli_util.h"
#include "commands.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/fit.h"
#include "moeplan/calibration/profile_check.h"
#include "moeplan/calibration/profiles.h"

namespace moeplan::client {

absl::Status ProfileCheckCmd(const ProfileCheckArgs& a) {
  MOEPLAN_ASSIGN_OR_RETURN(v1::ClusterProfile profile, calibration::ResolveProfile(a.profile));
  if (!(a.threshold_pct > 0.0)) {
    return absl::InvalidArgumentError(
        Cat("--threshold-pct: must be > 0 (got ", a.threshold_pct, ")"));
  }
  // Without --out-dir the samples go to a temporary directory, removed when
  // the check is done.
  std::optional<ScratchDir> scratch;
  if (a.samples.empty()) {
    MOEPLAN_ASSIGN_OR_RETURN(scratch, ScratchDir::Make(a.out_dir, "profile-check"));
  }
  const std::string out_dir = scratch ? scratch->path() : a.out_dir;
  std::error_code ec;
  const std::string samples_file = (std::filesystem::path(out_dir) / "check.jsonl").string();
  if (a.samples.empty()) {
    MOEPLAN_RETURN_IF_ERROR(RefuseOutputOverInput(
        {{"--out-dir", samples_file}}, {{"--profile", a.profile}, {"--profiler", a.profiler}}));
    std::filesystem::create_directories(out_dir, ec);
    if (ec) return absl::PermissionDeniedError(Cat("--out-dir: ", out_dir, ": ", ec.message()));
  }
  if (a.samples.empty()) {
    const int ranks = a.ranks > 0 ? a.ranks : profile.nodes() * profile.gpus_per_node();
    const std::string backend =
        profile.provenance().backend().empty() ? "mpi" : profile.provenance().backend();
    const std::string profiler =
        a.profiler.empty() ? SiblingBinary("profiler", "moeplan-profile") : a.profiler;
    const std::string launcher = LauncherFor(a.launcher, ranks);
    const std::string command =
        fmt::format("{} {} --check --rounds 3 --backend {} --watchdog-s 120 --out {} 1>&2",
                    launcher, ShellQuote(profiler), ShellQuote(backend), ShellQuote(samples_file));
    // Judge only what this run measures: a check.jsonl an earlier run left in
    // --out-dir must not stand in for a profiler that wrote nothing.
    for (const std::string& old : {samples_file, samples_file + ".partial"}) {
      std::filesystem::remove(old, ec);
      if (ec) return absl::PermissionDeniedError(Cat("--out-dir: ", old, ": ", ec.message()));
    }
    fmt::print(stderr, "moeplan profile-check: {}\n", command);
    MOEPLAN_ASSIGN_OR_RETURN(Ran ran, RunCommand(command));
    if (ran.exit_code != 0) {
      return absl::UnavailableError(
          Cat("moeplan-profile --check failed (exit code ", ran.exit_code, "); see above"));
    }
    if (!std::filesystem::exists(samples_file, ec)) {
      return absl::UnavailableError(Cat("moeplan-profile --check exited 0 but wrote no samples (",
                                        samples_file, " is missing): nothing was measured"));
    }
  }
  MOEPLAN_ASSIGN_OR_RETURN(std::vector<v1::ProfileSample> samples,
                           calibration::ReadSamples(a.samples.empty() ? samples_file : a.samples));
  MOEPLAN_ASSIGN_OR_RETURN(calibration::ProfileCheckResult r,
                           calibration::CheckProfile(profile, samples, a.threshold_pct));
  MOEPLAN_RETURN_IF_ERROR(
      WriteStdout(calibration::RenderProfileCheck(profile, r, a.threshold_pct)));
  if (r.stale) {
    return absl::FailedPreconditionError(Cat("profile ", profile.name(),
                                             " is stale on this machine (drift beyond ",
                                             a.threshold_pct, " %)"));
  }
  return absl::OkStatus();
}

}  // namespace moeplan::client
