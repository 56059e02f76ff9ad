// One self-contained HTML page per plan or validation (`--html FILE` of
// plan-model, plan-layer and validate; docs/report.md): the data as JSON in the
// page, the project's own script (client/report/report.js) that builds the
// tables and, with Chart.js (Debian's libjs-chart.js, embedded at build time),
// the charts. Nothing is fetched when the page opens. Every string from an
// input file reaches the page as JSON text and is shown with textContent, so a
// model named `<script>` is shown, not run.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/v1/model.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/v1/validation.pb.h"

namespace moeplan::client {

struct HtmlReport {
  std::string kind;       // "plan-model", "plan-layer" or "validate": what report.js draws
  std::string title;      // the page's title and heading (escaped)
  std::string data_json;  // the report's data, a JSON object
};

// The candidates whose pipeline timeline a plan-model page draws (the
// first; the breakdowns' ten).
inline constexpr int kReportPipelines = 10;

// The data of each kind. plan-model: the model (defaults filled in) and the
// plan: variants without their op timelines, candidates with their launcher
// arguments and, the first kReportPipelines, their pipelines; plan-layer:
// the layer and its plan, with each schedule's op timeline; validate: the
// summary.
absl::StatusOr<HtmlReport> PlanModelReport(const v1::ModelConfig& model,
                                           const v1::PlanModelResponse& plan,
                                           const v1::ClusterProfile& profile);
absl::StatusOr<HtmlReport> PlanLayerReport(const v1::LayerConfig& layer,
                                           const v1::PlanLayerResponse& plan,
                                           const v1::ClusterProfile& profile);
absl::StatusOr<HtmlReport> ValidateReport(const v1::ValidationSummary& summary);

// The page.
std::string RenderHtml(const HtmlReport& report);

// `text` safe inside a <script> element: '<', '>', '&' and U+2028/U+2029 as
// JSON \u escapes (valid inside JSON strings, and JSON has them nowhere else).
std::string EscapeScriptJson(std::string_view json);
// `text` safe as HTML element content or an attribute value.
std::string EscapeHtml(std::string_view text);

// Written atomically (a temporary file renamed over `path`); `flag` names the
// option in errors.
absl::Status WriteHtmlReport(const std::string& path, const HtmlReport& report,
                             std::string_view flag = "--html");

}  // namespace moeplan::client
