// `moeplan calibrate`: a measured profile fitted from moeplan-profile samples
// (calibration/fit.h, docs/calibration.md).
#include <fmt/format.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli_util.h"
#include "commands.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/fit.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/proto/json.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/v1/samples.pb.h"

namespace moeplan::client {

namespace {

// The profile's name from the output file: "out/cpu-2x2.json" -> "cpu-2x2".
std::string StemOf(const std::string& path) { return std::filesystem::path(path).stem().string(); }

}  // namespace

namespace {

// --from-server: the server refits and stores; the report and, with --out, a
// copy of the new version come back.
absl::Status RefitOnServer(const CalibrateArgs& a) {
  if (a.profile.empty()) {
    return absl::InvalidArgumentError("--profile: required with --from-server (the stored name)");
  }
  for (const auto& [flag, set] : {std::pair<const char*, bool>{"--comm-from", !a.comm_from.empty()},
                                  {"--name", !a.name.empty()},
                                  {"--comment", !a.comment.empty()}}) {
    if (set) return absl::InvalidArgumentError(Cat(flag, ": not used with --from-server"));
  }
  MOEPLAN_ASSIGN_OR_RETURN(std::unique_ptr<PlannerClient> client,
                           PlannerClient::Connect(a.from_server));
  v1::RefitProfileRequest req;
  req.set_profile_name(a.profile);
  absl::StatusOr<v1::RefitProfileResponse> r = client->RefitProfile(req);
  if (!r.ok()) {
    return absl::Status(r.status().code(), Cat("--from-server ", a.from_server.address, ": ",
                                               View(r.status().message())));
  }
  std::string text = r->report();
  if (!a.out.empty()) {
    MOEPLAN_ASSIGN_OR_RETURN(std::string json, proto::ToJson(r->profile()));
    absl::Status s = proto::WriteFileAtomic(a.out, json + "\n");
    if (!s.ok()) return absl::Status(s.code(), Cat("--out: ", View(s.message())));
  }
  text += fmt::format("\nstored profile {} version {} on {} (fitted on {} of {} reported runs){}\n",
                      r->profile().name(), r->profile().version(), a.from_server.address, r->used(),
                      r->measurements(), a.out.empty() ? "" : fmt::format("; wrote {}", a.out));
  return WriteStdout(text);
}

}  // namespace

absl::Status CalibrateCmd(const CalibrateArgs& a) {
  MOEPLAN_RETURN_IF_ERROR(
      RefuseOutputOverInput({{"--out", a.out}}, {{"--samples", a.samples},
                                                 {"--comm-from", a.comm_from},
                                                 {"--tls-ca", a.from_server.tls_ca_file},
                                                 {"--token-file", a.from_server.token_file}}));
  if (!a.from_server.address.empty()) return RefitOnServer(a);
  if (a.samples.empty()) {
    return absl::InvalidArgumentError(
        "--samples: required (or --from-server ADDR --profile NAME to refit a stored profile)");
  }
  if (a.out.empty()) return absl::InvalidArgumentError("--out: required with --samples");
  MOEPLAN_ASSIGN_OR_RETURN(std::vector<v1::ProfileSample> samples,
                           calibration::ReadSamples(a.samples));
  calibration::CalibrateOptions options;
  options.name = a.name.empty() ? StemOf(a.out) : a.name;
  options.comment = a.comment;
  options.version = a.version;
  options.tolerance = a.tolerance_pct / 100.0;
  options.repeat_tolerance = a.repeat_tolerance_pct / 100.0;
  if (!a.comm_from.empty()) {
    absl::StatusOr<v1::ClusterProfile> from = calibration::ResolveProfile(a.comm_from);
    if (!from.ok()) {
      return absl::Status(from.status().code(),
                          Cat("--comm-from: ", View(from.status().message())));
    }
    options.comm_from = *std::move(from);
  }
  absl::StatusOr<calibration::Calibration> c = calibration::Calibrate(samples, options);
  if (!c.ok()) {
    return absl::Status(c.status().code(), Cat(a.samples, ": ", View(c.status().message())));
  }
  MOEPLAN_ASSIGN_OR_RETURN(std::string json, proto::ToJson(c->profile));
  absl::Status s = proto::WriteFileAtomic(a.out, json + "\n");
  if (!s.ok()) return absl::Status(s.code(), Cat("--out: ", View(s.message())));
  std::string text = calibration::RenderFitReport(*c);
  text += fmt::format("wrote {} (profile {}, {} samples, {} collective fits, source: measured)\n",
                      a.out, c->profile.name(), samples.size(), c->profile.collectives_size());
  return WriteStdout(text);
}

}  // namespace moeplan::client
