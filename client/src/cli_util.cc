#include "cli_util.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"

namespace moeplan::client {

namespace p = ::moeplan::planner;

absl::StatusOr<std::vector<p::Schedule>> ParseSchedules(const std::string& list) {
  std::vector<p::Schedule> out;
  if (list.empty() || list == "all") return out;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    p::Schedule s;
    const std::string_view name = View(part);
    if (!p::ParseSchedule(name, &s)) {
      return absl::InvalidArgumentError(
          Cat("--schedules: unknown schedule '", name, "' (use default, s1, s2 or all)"));
    }
    if (std::find(out.begin(), out.end(), s) != out.end()) {
      return absl::InvalidArgumentError(Cat("--schedules: '", name, "' listed twice"));
    }
    out.push_back(s);
  }
  return out;
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
