#include "moeplan/client/sweep.h"

#include <fmt/format.h>

#include <algorithm>

#include "moeplan/base/strings.h"
#include "moeplan/planner/planner.h"
#include "moeplan/proto/convert.h"

namespace moeplan::client {

namespace p = ::moeplan::planner;

absl::StatusOr<SweepResult> RunSweep(const std::vector<v1::LayerConfig>& configs,
                                     const p::CostModel& cost, const SweepOptions& options) {
  SweepResult result;
  result.configs = configs.size();
  result.rows.reserve(configs.size());
  p::LayerPlanner planner(cost);
  p::LayerPlan plan;
  for (size_t i = 0; i < configs.size(); ++i) {
    absl::Status status;
    absl::StatusOr<p::LayerConfig> layer = proto::LayerFromProto(configs[i]);
    if (layer.ok()) {
      status = planner.Plan(*layer, options.schedules, &plan);
    } else {
      status = layer.status();
    }
    if (!status.ok()) {
      if (!options.skip_invalid || status.code() != absl::StatusCode::kInvalidArgument) {
        return absl::Status(status.code(), Cat("config #", i, " (", configs[i].name(),
                                               "): ", View(status.message())));
      }
      ++result.skipped;
      const std::string_view msg = View(status.message());
      ++result.skip_reasons[std::string(msg.substr(0, msg.find(" (got")))];
      continue;
    }
    SweepRow& row = result.rows.emplace_back();
    row.index = i;
    row.layer = *std::move(layer);
    for (const p::Candidate& c : plan.candidates) {
      row.total_us[static_cast<int>(c.schedule)] = c.total_us();
    }
    row.best = plan.decision.best;
    row.speedup_vs_default = plan.decision.speedup_over_default;
    row.margin_pct = plan.decision.margin_pct;
  }
  return result;
}

namespace {

// A text cell: RFC 4180 quoting where needed, and a cell that a spreadsheet
// would run as a formula (starting with = + - @, tab or CR) is prefixed with '
// so that it is read as text.
std::string CsvField(const std::string& given) {
  const bool formula = !given.empty() && std::string_view("=+-@\t\r").find(given[0]) !=
                                             std::string_view::npos;
  const std::string s = formula ? "'" + given : given;
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string TimeCell(double us) { return us < 0.0 ? "" : fmt::format("{:.3f}", us); }

}  // namespace

std::string SweepCsv(const SweepResult& r) {
  std::string out =
      "index,name,batch_size,seq_len,model_dim,hidden_dim,num_experts,top_k,capacity_factor,"
      "bytes_per_element,token_skew,dropless,mp,ep,esp,dp,pp,default_us,s1_us,s2_us,best,best_us,"
      "speedup_vs_default,margin_pct\n";
  auto w = std::back_inserter(out);
  for (const SweepRow& row : r.rows) {
    const p::LayerConfig& l = row.layer;
    const p::ParallelLayout& par = l.parallel;
    fmt::format_to(
        w, "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", row.index,
        CsvField(l.name), l.batch_size, l.seq_len, l.model_dim, l.hidden_dim, l.num_experts,
        l.top_k, l.capacity_factor, l.bytes_per_element, l.token_skew, l.dropless, par.mp, par.ep, par.esp,
        par.dp, par.pp, TimeCell(row.total_us[0]), TimeCell(row.total_us[1]),
        TimeCell(row.total_us[2]), p::ScheduleName(row.best),
        TimeCell(row.total_us[static_cast<int>(row.best)]),
        row.speedup_vs_default > 0.0 ? fmt::format("{:.4f}", row.speedup_vs_default) : "",
        fmt::format("{:.2f}", row.margin_pct));
  }
  return out;
}

std::string SweepSummary(const SweepResult& r) {
  std::string out;
  auto w = std::back_inserter(out);
  fmt::format_to(w, "configs: {} in the grid, {} planned, {} skipped as invalid\n", r.configs,
                 r.rows.size(), r.skipped);
  for (const auto& [reason, count] : r.skip_reasons) {
    fmt::format_to(w, "  skipped {}: {}\n", count, reason);
  }
  if (r.rows.empty()) return out;
  size_t wins[p::kNumSchedules] = {};
  std::vector<double> speedups;
  speedups.reserve(r.rows.size());
  for (const SweepRow& row : r.rows) {
    ++wins[static_cast<int>(row.best)];
    if (row.speedup_vs_default > 0.0) speedups.push_back(row.speedup_vs_default);
  }
  out += "chosen schedule:";
  for (p::Schedule s : p::kAllSchedules) {
    const size_t n = wins[static_cast<int>(s)];
    fmt::format_to(w, " {} {} ({:.1f}%)", p::ScheduleName(s), n, 100.0 * n / r.rows.size());
  }
  out += "\n";
  if (!speedups.empty()) {
    std::sort(speedups.begin(), speedups.end());
    const size_t n = speedups.size();
    const double median = n % 2 ? speedups[n / 2] : 0.5 * (speedups[n / 2 - 1] + speedups[n / 2]);
    fmt::format_to(w,
                   "speedup of the chosen schedule over default: min {:.3f}x, median {:.3f}x, "
                   "max {:.3f}x\n",
                   speedups.front(), median, speedups.back());
  }
  return out;
}

}  // namespace moeplan::client
