// Helpers shared by the `moeplan` commands (commands.h).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/planner/types.h"
#include "moeplan/v1/layer.pb.h"

namespace moeplan::client {

// Parses --schedules: a comma-separated subset of default,s1,s2, each at most
// once, or "all" (or empty), returned as an empty list. InvalidArgument naming
// --schedules otherwise.
absl::StatusOr<std::vector<planner::Schedule>> ParseSchedules(const std::string& list);

// Reads a grid file (moeplan.v1.LayerGrid JSON) into `grid` and expands it into
// its configs; an expansion error is InvalidArgument prefixed with `path`.
absl::StatusOr<std::vector<v1::LayerConfig>> ReadGrid(const std::string& path, v1::LayerGrid* grid);

// Writes `text` to stdout and flushes it: InternalError "stdout: write failed".
absl::Status WriteStdout(const std::string& text);

}  // namespace moeplan::client
