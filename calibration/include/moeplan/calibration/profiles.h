// Cluster profiles by name: the built-in profiles shipped in
// calibration/profiles/*.json (embedded at build time, so the binaries work from
// any directory) and profile files given by path.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/planner/profile.h"
#include "moeplan/v1/profile.pb.h"

namespace moeplan::calibration {

// The profile used when none is named.
inline constexpr std::string_view kDefaultProfileName = "a100-8x8";

// Names of the built-in profiles, sorted.
std::vector<std::string> BuiltinProfileNames();

// A built-in profile by name, parsed and validated. NotFound (listing the
// built-ins) for an unknown name.
absl::StatusOr<v1::ClusterProfile> BuiltinProfile(std::string_view name);

// A built-in profile when `name_or_path` names one; otherwise the JSON file at
// that path. Errors name the profile or file and the failing field; a value that
// is neither gives NotFound listing the built-ins.
absl::StatusOr<v1::ClusterProfile> ResolveProfile(std::string_view name_or_path);

// Where and when a profile was measured, in one line: "measured on node0,
// node1 (4 ranks; mpi, f32; Open MPI v4.1.4; <machine>) at 2026-11-21T05:51:27Z";
// spec profiles and measured ones without provenance say so.
std::string ProvenanceLine(const v1::ClusterProfile& profile);

// Both forms of a resolved profile.
struct LoadedProfile {
  v1::ClusterProfile message;
  planner::ClusterProfile profile;
};
absl::StatusOr<LoadedProfile> LoadProfile(std::string_view name_or_path);

}  // namespace moeplan::calibration
