#include "cli_util.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/grid.h"

namespace moeplan::client {

namespace p = ::moeplan::planner;

absl::StatusOr<std::vector<p::Schedule>> ParseSchedules(const std::string& list) {
  return ParseNameList<p::Schedule>("--schedules", "schedule", list, p::ParseSchedule,
                                    "default, s1, s2");
}

bool SendProfileInline(const std::string& cluster) {
  struct stat st;
  return ::stat(cluster.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         !calibration::BuiltinProfile(cluster).ok();
}

absl::StatusOr<std::vector<v1::LayerConfig>> ReadGrid(const std::string& path,
                                                      v1::LayerGrid* grid) {
  MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(path, grid));
  absl::StatusOr<std::vector<v1::LayerConfig>> configs = requests::ExpandGrid(*grid);
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

std::string SiblingBinary(std::string_view dir, std::string_view name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& cand :
         {self.parent_path().parent_path() / dir / name, self.parent_path() / name}) {
      if (fs::exists(cand, ec)) return cand.string();
    }
  }
  return std::string(name);
}

std::string LauncherFor(std::string launcher, int ranks) {
  const std::string n = std::to_string(ranks);
  for (size_t at = launcher.find("{ranks}"); at != std::string::npos;
       at = launcher.find("{ranks}", at + n.size())) {
    launcher.replace(at, 7, n);
  }
  return launcher;
}

absl::StatusOr<Ran> RunCommand(const std::string& command) {
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return absl::InternalError(Cat("cannot start '", command, "': ", std::strerror(errno)));
  }
  Ran r;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace moeplan::client
