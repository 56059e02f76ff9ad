// `moeplan calibrate --published`: the spec profiles a dataset of published
// training runs names, calibrated to their software stack (docs/calibration.md
// "Stack calibration"); the report in sample and leave-one-case-out.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/published.h"
#include "moeplan/proto/json.h"
#include "moeplan/v1/published.pb.h"

namespace moeplan::client {
namespace {

namespace fs = std::filesystem;

std::string RenderFit(const v1::PublishedFitReport& r, bool holdout) {
  std::string out = fmt::format(
      "Stack calibration on {} ({} cases, {} fits, {} predictions): each case's error in model "
      "TFLOP/s per GPU on the spec profiles, with the terms fitted on every case (in sample), "
      "and with the terms fitted on every other case (held out)\n\n"
      "| term | profile | spec | fitted | why |\n|---|---|--:|--:|---|\n",
      r.dataset(), r.cases_size(), r.fits(), r.predictions());
  for (const v1::StackTerm& t : r.terms()) {
    out += fmt::format("| {} | {} | {:.4g} | {:.4g} | {} |\n", t.name(),
                       t.profile().empty() ? "(shared)" : t.profile(), t.spec_value(), t.value(),
                       t.why());
  }
  // How far the held-out fits moved each term.
  for (int k = 0; holdout && k < r.terms_size(); ++k) {
    double lo = r.terms(k).value(), hi = lo;
    for (const v1::PublishedFitCase& c : r.cases()) {
      if (k >= c.holdout_terms_size()) continue;
      lo = std::min(lo, c.holdout_terms(k).value());
      hi = std::max(hi, c.holdout_terms(k).value());
    }
    out +=
        fmt::format("{}{}{} {:.4g}-{:.4g}", k == 0 ? "\nheld-out fits: " : ", ", r.terms(k).name(),
                    r.terms(k).profile().empty() ? "" : " (" + r.terms(k).profile() + ")", lo, hi);
  }
  out += fmt::format("{}\n| case | family | profile | published | spec | in sample |{}\n",
                     holdout ? "\n" : "", holdout ? " held out |" : "");
  out += holdout ? "|---|---|---|--:|--:|--:|--:|\n" : "|---|---|---|--:|--:|--:|\n";
  for (const v1::PublishedFitCase& c : r.cases()) {
    out += fmt::format("| {} | {} | {} | {:.1f} | {:+.1f} % | {:+.1f} % |{}\n", c.name(),
                       c.family(), c.profile(), c.published_tflops_per_gpu(), c.spec_error_pct(),
                       c.in_sample_error_pct(),
                       holdout ? fmt::format(" {:+.1f} % |", c.holdout_error_pct()) : "");
  }
  out +=
      "\n| group | cases | errors | MAPE | p90 abs | max abs | bias |\n"
      "|---|--:|---|--:|--:|--:|--:|\n";
  auto rows = [&](const char* what, const auto& summaries) {
    for (const v1::PublishedSummary& s : summaries) {
      out += fmt::format("| {} | {} | {} | {:.1f} % | {:.1f} % | {:.1f} % | {:+.1f} % |\n",
                         s.group(), s.cases(), what, s.mape_pct(), s.p90_abs_pct(), s.max_abs_pct(),
                         s.bias_pct());
    }
  };
  rows("spec", r.spec());
  rows("in sample", r.in_sample());
  if (holdout) rows("held out", r.holdout());
  return out;
}

}  // namespace

absl::Status CalibratePublishedCmd(const CalibrateArgs& a) {
  for (const auto& [flag, set] : {std::pair<const char*, bool>{"--out", !a.out.empty()},
                                  {"--name", !a.name.empty()},
                                  {"--comm-from", !a.comm_from.empty()},
                                  {"--profile", !a.profile.empty()}}) {
    if (set) {
      return absl::InvalidArgumentError(
          Cat(flag,
              ": not used with --published (profiles go to --out-dir, named as the ones "
              "they calibrate)"));
    }
  }
  std::error_code ec;
  if (!a.out_dir.empty() && fs::exists(a.out_dir, ec) &&
      fs::equivalent(a.out_dir, a.published, ec)) {
    return absl::InvalidArgumentError(
        "--out-dir: must not be the --published directory (its profiles would be read as cases)");
  }
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<calibration::PublishedEntry> cases,
                           calibration::ReadPublished(a.published));
  calibration::StackFitOptions options;
  options.dataset = a.published;
  options.holdout = !a.no_holdout;
  MOEPLAN_ASSIGN_OR_RETURN(calibration::StackFit fit, calibration::FitPublished(cases, options));
  if (!a.out_dir.empty()) {
    fs::create_directories(a.out_dir, ec);
    if (ec) return absl::InvalidArgumentError(Cat("--out-dir: ", a.out_dir, ": ", ec.message()));
    // Every profile serialised before the first is written.
    std::vector<std::pair<std::string, std::string>> files;
    for (const v1::ClusterProfile& p : fit.profiles) {
      MOEPLAN_ASSIGN_OR_RETURN(std::string json, proto::ToJson(p));
      files.emplace_back((fs::path(a.out_dir) / (p.name() + ".json")).string(), json + "\n");
    }
    for (const auto& [path, json] : files) {
      absl::Status s = proto::WriteFileAtomic(path, json);
      if (!s.ok()) return absl::Status(s.code(), Cat("--out-dir: ", View(s.message())));
      fit.report.add_written(path);
    }
    std::string note;
    MOEPLAN_ASSIGN_OR_RETURN(
        const std::string png,
        DrawScatter(calibration::PublishedFitScatter(fit.report), a.out_dir, "fit", &note));
    fit.report.add_written((fs::path(a.out_dir) / (png.empty() ? "fit.dat" : png)).string());
    if (!note.empty()) fmt::print(stderr, "moeplan calibrate: warning: {}\n", note);
  }
  if (a.json) {
    MOEPLAN_ASSIGN_OR_RETURN(std::string json, proto::ToJson(fit.report));
    return WriteStdout(json + "\n");
  }
  std::string text = RenderFit(fit.report, options.holdout);
  text += fit.report.written().empty()
              ? "\nno profile written (give --out-dir)\n"
              : fmt::format(
                    "\nwrote {} (validate --published {} --profile-overrides FILE,... "
                    "predicts with them)\n",
                    fmt::join(fit.report.written(), ", "), a.published);
  return WriteStdout(text);
}

}  // namespace moeplan::client
