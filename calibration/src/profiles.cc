#include "moeplan/calibration/profiles.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstddef>

#include "absl/strings/str_join.h"
#include "moeplan/base/embedded.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"

namespace moeplan::calibration {
namespace internal {
MOEPLAN_DECLARE_EMBEDDED_FILES();
}  // namespace internal

namespace {

constexpr std::string_view kJsonSuffix = ".json";

std::string_view StemOf(std::string_view file) {
  return file.substr(0, file.size() - kJsonSuffix.size());
}

const EmbeddedFile* FindBuiltin(std::string_view name) {
  for (std::size_t i = 0; i < internal::kNumEmbeddedFiles; ++i) {
    if (StemOf(internal::kEmbeddedFiles[i].name) == name) return &internal::kEmbeddedFiles[i];
  }
  return nullptr;
}

absl::Status Validated(std::string_view what, const v1::ClusterProfile& msg) {
  absl::StatusOr<planner::ClusterProfile> p = proto::ProfileFromProto(msg);
  if (!p.ok()) return absl::InvalidArgumentError(Cat(what, ": ", p.status().message()));
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> BuiltinProfileNames() {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < internal::kNumEmbeddedFiles; ++i) {
    names.emplace_back(StemOf(internal::kEmbeddedFiles[i].name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<v1::ClusterProfile> BuiltinProfile(std::string_view name) {
  const EmbeddedFile* f = FindBuiltin(name);
  if (f == nullptr) {
    return absl::NotFoundError(Cat("cluster: no built-in profile named '", name, "' (built-ins: ",
                                   absl::StrJoin(BuiltinProfileNames(), ", "), ")"));
  }
  v1::ClusterProfile msg;
  const std::string what = Cat("built-in profile ", name);
  if (absl::Status s = proto::ParseJson(f->contents, &msg); !s.ok()) {
    return absl::InternalError(Cat(what, ": ", s.message()));
  }
  if (msg.name() != name) {
    return absl::InternalError(
        Cat(what, ": name field '", msg.name(), "' differs from the file name"));
  }
  if (absl::Status s = Validated(what, msg); !s.ok()) return absl::InternalError(s.message());
  return msg;
}

absl::StatusOr<v1::ClusterProfile> ResolveProfile(std::string_view name_or_path) {
  if (FindBuiltin(name_or_path) != nullptr) return BuiltinProfile(name_or_path);
  const std::string path(name_or_path);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(Cat("cluster: '", name_or_path, "' is neither a built-in profile (",
                                   absl::StrJoin(BuiltinProfileNames(), ", "),
                                   ") nor an existing file"));
  }
  v1::ClusterProfile msg;
  MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(path, &msg));
  MOEPLAN_RETURN_IF_ERROR(Validated(path, msg));
  return msg;
}

absl::StatusOr<LoadedProfile> LoadProfile(std::string_view name_or_path) {
  absl::StatusOr<v1::ClusterProfile> msg = ResolveProfile(name_or_path);
  if (!msg.ok()) return msg.status();
  LoadedProfile out;
  out.message = *std::move(msg);
  absl::StatusOr<planner::ClusterProfile> p = proto::ProfileFromProto(out.message);
  if (!p.ok()) return p.status();
  out.profile = *std::move(p);
  return out;
}

std::string ProvenanceLine(const v1::ClusterProfile& p) {
  if (p.source() == v1::PROFILE_SOURCE_SPEC) {
    return "derived from hardware specifications (not measured)";
  }
  if (!p.has_provenance()) {
    return "no provenance recorded (calibrated before moeplan recorded where and when)";
  }
  const v1::Provenance& w = p.provenance();
  std::string hosts;
  for (const std::string& h : w.hosts()) hosts += Cat(hosts.empty() ? "" : ", ", h);
  std::string what = Cat(w.ranks(), " ranks");
  for (const std::string& part :
       {w.backend(), w.dtype(), w.versions(), w.machine(),
        w.mpi_wait().empty() ? std::string() : Cat("ranks waited: ", w.mpi_wait())}) {
    if (!part.empty()) what += Cat("; ", part);
  }
  return Cat("measured on ", hosts.empty() ? std::string("unknown hosts") : hosts, " (", what,
             ") at ", w.measured_at().empty() ? std::string("an unknown time") : w.measured_at());
}

}  // namespace moeplan::calibration
