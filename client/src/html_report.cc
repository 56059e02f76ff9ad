#include "moeplan/client/html_report.h"

#include <fmt/format.h>
#include <google/protobuf/struct.pb.h>

#include <string>

#include "moeplan/base/embedded.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/proto/json.h"

namespace moeplan::client {
namespace internal {
// The page's assets (client/report/, and Debian's Chart.js), embedded at build
// time (client/CMakeLists.txt).
MOEPLAN_DECLARE_EMBEDDED_FILES();
}  // namespace internal

namespace {

std::string_view Asset(std::string_view name) {
  return FindEmbedded({internal::kEmbeddedFiles, internal::kNumEmbeddedFiles}, name);
}

absl::StatusOr<std::string> Json(const google::protobuf::Message& m) {
  proto::JsonStyle style;
  style.pretty = false;
  return proto::ToJson(m, style);
}

// A JSON string literal of `s` (protobuf's JSON printer escapes it).
std::string JsonString(const std::string& s) {
  google::protobuf::Value v;
  v.set_string_value(s);
  absl::StatusOr<std::string> j = Json(v);
  return j.ok() ? *j : std::string("\"\"");
}

}  // namespace

std::string EscapeScriptJson(std::string_view json) {
  std::string out;
  out.reserve(json.size() + json.size() / 16);
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '<') {
      out += "\\u003c";
    } else if (c == '>') {
      out += "\\u003e";
    } else if (c == '&') {
      out += "\\u0026";
    } else if (c == '\xe2' && i + 2 < json.size() && json[i + 1] == '\x80' &&
               (json[i + 2] == '\xa8' || json[i + 2] == '\xa9')) {
      out += json[i + 2] == '\xa8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHtml(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

absl::StatusOr<HtmlReport> PlanModelReport(const v1::ModelConfig& model,
                                           const v1::PlanModelResponse& plan,
                                           const v1::ClusterProfile& profile) {
  v1::PlanModelResponse shown = plan;
  for (v1::VariantPlan& v : *shown.mutable_variants()) v.clear_ops();
  // The page draws the pipelines of the first kReportPipelines candidates.
  for (int i = kReportPipelines; i < shown.candidates_size(); ++i) {
    shown.mutable_candidates(i)->clear_pipeline();
  }
  MOEPLAN_ASSIGN_OR_RETURN(std::string plan_json, Json(shown));
  MOEPLAN_ASSIGN_OR_RETURN(std::string model_json, Json(model));
  HtmlReport r;
  r.kind = "plan-model";
  r.title = Cat("moeplan plan-model: ", model.name().empty() ? "(unnamed model)" : model.name(),
                " on ", profile.name());
  r.data_json = fmt::format(
      "{{\"model\":{},\"plan\":{},\"profile\":{{\"name\":{},\"version\":{},"
      "\"nodes\":{},\"gpus_per_node\":{}}}}}",
      model_json, plan_json, JsonString(profile.name()), profile.version(), profile.nodes(),
      profile.gpus_per_node());
  return r;
}

absl::StatusOr<HtmlReport> PlanLayerReport(const v1::LayerConfig& layer,
                                           const v1::PlanLayerResponse& plan,
                                           const v1::ClusterProfile& profile) {
  // The ops stay: a layer's are few, and the page draws the best schedule's.
  MOEPLAN_ASSIGN_OR_RETURN(std::string plan_json, Json(plan));
  MOEPLAN_ASSIGN_OR_RETURN(std::string layer_json, Json(layer));
  HtmlReport r;
  r.kind = "plan-layer";
  r.title = Cat("moeplan plan-layer: ", layer.name().empty() ? "(unnamed layer)" : layer.name(),
                " on ", profile.name());
  r.data_json =
      fmt::format("{{\"layer\":{},\"plan\":{},\"profile\":{{\"name\":{},\"version\":{}}}}}",
                  layer_json, plan_json, JsonString(profile.name()), profile.version());
  return r;
}

absl::StatusOr<HtmlReport> ValidateReport(const v1::ValidationSummary& summary) {
  MOEPLAN_ASSIGN_OR_RETURN(std::string json, Json(summary));
  HtmlReport r;
  r.kind = "validate";
  r.title = Cat("moeplan validate: ", summary.profile(), ", ", summary.configs(), " configs");
  r.data_json = fmt::format("{{\"summary\":{}}}", json);
  return r;
}

std::string RenderHtml(const HtmlReport& r) {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<meta name=\"generator\" content=\"moeplan " MOEPLAN_VERSION
      "\">\n"
      "<title>{}</title>\n<style>\n{}</style>\n</head>\n"
      "<body data-kind=\"{}\">\n<h1 id=\"title\">{}</h1>\n<main id=\"app\"></main>\n"
      "<script type=\"application/json\" id=\"moeplan-data\">{}</script>\n"
      "<script>\n{}\n</script>\n<script>\n{}\n</script>\n</body>\n</html>\n",
      EscapeHtml(r.title), Asset("report.css"), EscapeHtml(r.kind), EscapeHtml(r.title),
      EscapeScriptJson(r.data_json), Asset("chart.min.js"), Asset("report.js"));
}

absl::Status WriteHtmlReport(const std::string& path, const HtmlReport& report,
                             std::string_view flag) {
  absl::Status s = proto::WriteFileAtomic(path, RenderHtml(report));
  if (!s.ok()) return absl::Status(s.code(), Cat(flag, ": ", View(s.message())));
  return absl::OkStatus();
}

}  // namespace moeplan::client
