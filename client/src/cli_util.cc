#include "cli_util.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"

namespace moeplan::client {

namespace p = ::moeplan::planner;

absl::StatusOr<std::vector<p::Schedule>> ParseSchedules(const std::string& list) {
  return ParseNameList<p::Schedule>("--schedules", "schedule", list, p::ParseSchedule, "default, s1, s2");
}

bool SendProfileInline(const std::string& cluster) {
  struct stat st;
  return ::stat(cluster.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         !calibration::BuiltinProfile(cluster).ok();
}

absl::StatusOr<std::vector<v1::LayerConfig>> ReadGrid(const std::string& path,
                                                      v1::LayerGrid* grid) {
  MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(path, grid));
  absl::StatusOr<std::vector<v1::LayerConfig>> configs = proto::ExpandGrid(*grid);
  if (!configs.ok()) {
    return absl::InvalidArgumentError(Cat(path, ": ", View(configs.status().message())));
  }
  return configs;
}

absl::Status WriteStdout(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    return absl::InternalError("stdout: write failed");
  }
  return absl::OkStatus();
}

}  // namespace moeplan::client
