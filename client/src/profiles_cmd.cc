// `moeplan profiles list|show|get|put`: the built-in profiles, or a
// moeplan-server's (docs/service.md).
#include <fmt/format.h>

#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli_util.h"
#include "commands.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/client/planner_client.h"
#include "moeplan/proto/json.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/v1/service.pb.h"

namespace moeplan::client {

namespace {

absl::StatusOr<v1::ListProfilesResponse> LocalProfiles() {
  v1::ListProfilesResponse out;
  for (const std::string& name : calibration::BuiltinProfileNames()) {
    MOEPLAN_ASSIGN_OR_RETURN(v1::ClusterProfile prof, calibration::BuiltinProfile(name));
    v1::ProfileSummary* s = out.add_profiles();
    s->set_name(prof.name());
    s->set_version(prof.version());
    s->set_source(prof.source());
    s->set_nodes(prof.nodes());
    s->set_gpus_per_node(prof.gpus_per_node());
    s->set_comment(prof.comment());
  }
  return out;
}

// A profile (built-in name or file), or with `server` the server's profile of
// that name.
absl::StatusOr<v1::ClusterProfile> FindProfile(const std::string& name,
                                               const ClientOptions& server) {
  if (server.address.empty()) return calibration::ResolveProfile(name);
  MOEPLAN_ASSIGN_OR_RETURN(std::unique_ptr<PlannerClient> client, PlannerClient::Connect(server));
  return client->GetProfile(name);
}

}  // namespace

absl::Status ProfilesListCmd(const ClientOptions& server) {
  v1::ListProfilesResponse list;
  if (server.address.empty()) {
    MOEPLAN_ASSIGN_OR_RETURN(list, LocalProfiles());
  } else {
    MOEPLAN_ASSIGN_OR_RETURN(std::unique_ptr<PlannerClient> client, PlannerClient::Connect(server));
    MOEPLAN_ASSIGN_OR_RETURN(list, client->ListProfiles());
  }
  std::string text = fmt::format("{:<16}{:<10}{:>8}{:>8}{:>6}  {}\n", "name", "source", "version",
                                 "nodes", "gpus", "summary");
  for (const v1::ProfileSummary& prof : list.profiles()) {
    std::string summary = prof.comment().substr(0, prof.comment().find(". "));
    if (prof.name() == calibration::kDefaultProfileName) summary += " [default]";
    fmt::format_to(std::back_inserter(text), "{:<16}{:<10}{:>8}{:>8}{:>6}  {}\n", prof.name(),
                   prof.source() == v1::PROFILE_SOURCE_SPEC ? "spec" : "measured", prof.version(),
                   prof.nodes(), prof.gpus_per_node(), summary);
  }
  return WriteStdout(text);
}

absl::Status ProfilesShowCmd(const std::string& name, const ClientOptions& server) {
  MOEPLAN_ASSIGN_OR_RETURN(v1::ClusterProfile prof, FindProfile(name, server));
  MOEPLAN_ASSIGN_OR_RETURN(std::string json, proto::ToJson(prof));
  return WriteStdout(json + "\n");
}

absl::Status ProfilesPutCmd(const std::string& file, const ClientOptions& server) {
  if (server.address.empty()) {
    return absl::InvalidArgumentError(
        "--server: profiles put stores a profile on a server; give its address");
  }
  v1::ClusterProfile prof;
  MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(file, &prof));
  MOEPLAN_ASSIGN_OR_RETURN(std::unique_ptr<PlannerClient> client, PlannerClient::Connect(server));
  absl::StatusOr<v1::PutProfileResponse> r = client->PutProfile(prof);
  if (!r.ok()) return absl::Status(r.status().code(), Cat(file, ": ", View(r.status().message())));
  return WriteStdout(
      fmt::format("stored profile {} version {} on {}\n", r->name(), r->version(),
                  server.address));
}

}  // namespace moeplan::client
