// moeplan validate --published: every case of a dataset of published training
// runs (docs/calibration.md "Published runs") predicted at its layout, no
// execution, and compared in model TFLOP/s per GPU.
#include <fmt/format.h>
#include <fmt/ranges.h>

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

std::string RenderPublished(const v1::PublishedReport& r) {
  std::string out =
      "Published runs against moeplan's predictions (model TFLOP/s per GPU, Megatron-LM's "
      "convention; each case on its own profile)\n\n"
      "| case | family | GPUs | profile | published | predicted | error | compute ms | of which "
      "recompute | exposed comm ms, by kind | grad sync ms | bubble ms | iteration ms | GiB/GPU "
      "|\n"
      "|---|---|--:|---|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|\n";
  for (const v1::PublishedCase& c : r.cases()) {
    const v1::LayoutCandidate& p = c.predicted();
    std::string comm;
    for (const v1::TermTime& t : p.exposed_comm()) {
      comm += fmt::format("{}{} {:.0f}", comm.empty() ? "" : ", ", t.term(), t.us() / 1e3);
    }
    // A layout the memory model says does not fit (it ran nonetheless): "(over)".
    out += fmt::format(
        "| {} | {} | {} | {} | {:.1f} | {:.1f} | {:+.1f} % | {:.0f} | {:.0f} | {} | {:.0f} | "
        "{:.0f} | {:.0f} | {:.1f}{} |\n",
        c.name(), c.family(), c.gpus(), c.profile(), c.published_tflops_per_gpu(),
        c.predicted_tflops_per_gpu(), c.error_pct(), p.compute_us() / 1e3, p.recompute_us() / 1e3,
        comm.empty() ? "none" : comm, p.grad_sync_us() / 1e3, p.bubble_us() / 1e3,
        p.iteration_us() / 1e3, p.memory_bytes_per_gpu() / (1024.0 * 1024 * 1024),
        p.feasible() ? "" : " (over)");
  }
  bool searched = false;
  for (const v1::PublishedCase& c : r.cases()) searched = searched || c.has_searched();
  if (searched) {
    out +=
        "\n| case | search's best layout (predicted) | TFLOP/s | vs the published layout |\n"
        "|---|---|--:|--:|\n";
    for (const v1::PublishedCase& c : r.cases()) {
      if (!c.has_searched()) continue;
      out += fmt::format("| {} | `{}` | {:.1f} | {:+.1f} % |\n", c.name(), c.searched_layout(),
                         c.searched().tflops_per_gpu(), c.searched_gain_pct());
    }
  }
  for (const v1::PublishedRanking& k : r.rankings()) {
    out += fmt::format("\nranking {}: published {}, predicted {}: {}\n", k.comparison(),
                       fmt::join(k.published_order(), " > "), fmt::join(k.predicted_order(), " > "),
                       k.same() ? "same" : "DIFFERENT");
  }
  out += "\n| group | cases | MAPE | p90 abs | max abs | bias |\n|---|--:|--:|--:|--:|--:|\n";
  for (const v1::PublishedSummary& s : r.summaries()) {
    if (s.cases() == 0) continue;
    out += fmt::format("| {} | {} | {:.1f} % | {:.1f} % | {:.1f} % | {:+.1f} % |\n", s.group(),
                       s.cases(), s.mape_pct(), s.p90_abs_pct(), s.max_abs_pct(), s.bias_pct());
  }
  return out;
}

}  // namespace

absl::Status ValidatePublishedCmd(const ValidateArgs& a) {
  // Everything is read, checked and predicted before anything is printed.
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<calibration::PublishedEntry> cases,
                           calibration::ReadPublished(a.published));
  calibration::PublishedProfiles profiles;
  for (const std::string& file : a.profile_overrides) {
    MOEPLAN_RETURN_IF_ERROR(profiles.Override(file));
  }
  MOEPLAN_ASSIGN_OR_RETURN(const v1::PublishedReport report,
                           calibration::PredictAllPublished(cases, a.search, profiles));
  MOEPLAN_ASSIGN_OR_RETURN(const std::string json, proto::ToJson(report));
  std::string text = RenderPublished(report);
  if (a.out_dir_given) {
    std::error_code ec;
    std::filesystem::create_directories(a.out_dir, ec);
    if (ec) return absl::InvalidArgumentError(Cat("--out-dir: ", a.out_dir, ": ", ec.message()));
    const std::filesystem::path dir(a.out_dir);
    std::string note;
    MOEPLAN_ASSIGN_OR_RETURN(
        const std::string png,
        DrawScatter(calibration::PublishedScatter(report), a.out_dir, "plot", &note));
    std::string markdown = text;
    if (!png.empty()) markdown += Cat("\n![predicted vs published](", png, ")\n");
    MOEPLAN_RETURN_IF_ERROR(proto::WriteFileAtomic((dir / "report.md").string(), markdown));
    MOEPLAN_RETURN_IF_ERROR(proto::WriteFileAtomic((dir / "report.json").string(), json + "\n"));
    if (!note.empty()) fmt::print(stderr, "moeplan validate: warning: {}\n", note);
    text += Cat("\nwrote ", (dir / "report.md").string(), ", report.json",
                png.empty() ? "" : ", " + png, " in ", a.out_dir, "\n");
  }
  return WriteStdout(a.json ? json + "\n" : text);
}

}  // namespace moeplan::client
