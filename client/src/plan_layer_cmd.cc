// `moeplan plan-layer`: one layer planned locally or on a moeplan-server
// (docs/service.md), printed the same way either way (report.h).
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli_util.h"
#include "commands.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/client/html_report.h"
#include "moeplan/client/planner_client.h"
#include "moeplan/client/report.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/types.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"
#include "moeplan/v1/layer.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "moeplan/v1/profile.pb.h"

namespace moeplan::client {

namespace p = ::moeplan::planner;

namespace {

// Prefixes a layer error with the file it came from; the file *is* the layer, so
// the request path "layer." is dropped.
// Errors about other request fields (profile_name, schedules) pass unchanged.
absl::Status InFile(const std::string& path, const absl::Status& s) {
  std::string_view msg = View(s.message());
  if (msg.rfind("layer.", 0) != 0) return s;
  msg.remove_prefix(6);
  return absl::Status(s.code(), Cat(path, ": ", msg));
}

// Plans on a server: a --cluster that names an existing file is sent inline,
// anything else is a profile name the server resolves (built-in or stored).
absl::Status PlanOnServer(const ClientOptions& server, const std::string& cluster,
                          v1::PlanLayerRequest* request, v1::PlanLayerResponse* response,
                          v1::ClusterProfile* profile) {
  MOEPLAN_ASSIGN_OR_RETURN(std::unique_ptr<PlannerClient> connected,
                           PlannerClient::Connect(server));
  PlannerClient& client = *connected;
  if (SendProfileInline(cluster)) {
    MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(cluster, request->mutable_profile()));
    *profile = request->profile();
  } else {
    request->set_profile_name(cluster);
  }
  MOEPLAN_ASSIGN_OR_RETURN(*response, client.PlanLayer(*request));
  if (request->has_profile()) return absl::OkStatus();
  MOEPLAN_ASSIGN_OR_RETURN(*profile, client.GetProfile(cluster));
  return absl::OkStatus();
}

}  // namespace

absl::Status PlanLayerCmd(const PlanLayerArgs& a) {
  MOEPLAN_RETURN_IF_ERROR(RefuseOutputOverInput({{"--trace", a.trace}, {"--html", a.html}},
                                                {{"--layer", a.layer},
                                                 {"--cluster", a.cluster},
                                                 {"--tls-ca", a.server.tls_ca_file},
                                                 {"--token-file", a.server.token_file}}));
  MOEPLAN_ASSIGN_OR_RETURN(std::vector<p::Schedule> schedules, ParseSchedules(a.schedules));
  v1::PlanLayerRequest request;
  MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(a.layer, request.mutable_layer()));
  for (p::Schedule s : schedules) request.add_schedules(proto::ScheduleToProto(s));
  request.set_include_timeline(!a.no_timeline || !a.trace.empty() || !a.html.empty());
  v1::PlanLayerResponse response;
  v1::ClusterProfile profile_message;
  if (!a.server.address.empty()) {
    absl::Status s = PlanOnServer(a.server, a.cluster, &request, &response, &profile_message);
    if (!s.ok()) return InFile(a.layer, s);
  } else {
    MOEPLAN_ASSIGN_OR_RETURN(calibration::LoadedProfile profile,
                             calibration::LoadProfile(a.cluster));
    request.set_profile_name(profile.message.name());
    MOEPLAN_ASSIGN_OR_RETURN(p::CostModel cost, p::CostModel::Create(profile.profile));
    p::LayerPlanner planner(cost);
    absl::Status s = requests::AnswerPlanLayer(request, planner, profile.profile, &response);
    if (!s.ok()) return InFile(a.layer, s);
    profile_message = std::move(profile.message);
  }
  // Echo the layer with defaults filled in (dp, pp, b, skew) for the table.
  absl::StatusOr<p::LayerConfig> layer = proto::LayerFromProto(request.layer());
  if (!layer.ok()) {
    return absl::Status(layer.status().code(), Cat(a.layer, ": ", View(layer.status().message())));
  }
  const v1::LayerConfig shown = proto::LayerToProto(*layer);

  // Everything is computed before anything is written: an error leaves no output.
  v1::PlanLayerResponse printed = response;
  if (a.no_timeline) {
    for (v1::CandidatePlan& c : *printed.mutable_candidates()) c.clear_ops();
  }
  std::string text;
  if (a.format == "json") {
    MOEPLAN_ASSIGN_OR_RETURN(std::string json, proto::ToJson(printed));
    text = json + "\n";
  } else {
    text = FormatPlanTable(shown, printed, profile_message);
  }
  if (!a.trace.empty()) {
    proto::JsonStyle style;
    style.pretty = false;
    style.preserve_proto_field_names = false;  // Chrome's camelCase keys
    MOEPLAN_ASSIGN_OR_RETURN(std::string trace, proto::ToJson(BuildTrace(response), style));
    absl::Status s = proto::WriteFileAtomic(a.trace, trace + "\n");
    if (!s.ok()) return absl::Status(s.code(), Cat("--trace: ", View(s.message())));
  }
  if (!a.html.empty()) {
    v1::LayerConfig named = shown;
    named.set_name(request.layer().name());
    MOEPLAN_ASSIGN_OR_RETURN(HtmlReport html, PlanLayerReport(named, response, profile_message));
    MOEPLAN_RETURN_IF_ERROR(WriteHtmlReport(a.html, html));
  }
  return WriteStdout(text);
}

}  // namespace moeplan::client
