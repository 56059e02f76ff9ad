#include "cli_util.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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

absl::StatusOr<std::string> DrawScatter(const calibration::Scatter& plot, const std::string& dir,
                                        const std::string& stem, std::string* note) {
  namespace fs = std::filesystem;
  const std::string data_file = (fs::path(dir) / (stem + ".dat")).string();
  const std::string script_file = (fs::path(dir) / (stem + ".gp")).string();
  const std::string png_file = (fs::path(dir) / (stem + ".png")).string();
  MOEPLAN_RETURN_IF_ERROR(proto::WriteFileAtomic(data_file, calibration::ScatterData(plot)));
  MOEPLAN_RETURN_IF_ERROR(
      proto::WriteFileAtomic(script_file, calibration::ScatterScript(plot, data_file, png_file)));
  note->clear();
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    *note = Cat("gnuplot not found (apt-get install gnuplot-nox): plot data in ", data_file);
  } else if (std::system(Cat("gnuplot ", ShellQuote(script_file)).c_str()) != 0) {
    *note = Cat("gnuplot failed on ", script_file);
  } else {
    return stem + ".png";
  }
  return std::string();
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

namespace {

// Same file by device and inode when both exist; the same resolved path when
// neither does yet (an output about to be created next to the input).
bool SameFile(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  struct stat sa, sb;
  const bool has_a = ::stat(a.c_str(), &sa) == 0;
  const bool has_b = ::stat(b.c_str(), &sb) == 0;
  if (has_a && has_b) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (has_a || has_b) return false;
  std::error_code ea, eb;
  const std::filesystem::path ca = std::filesystem::weakly_canonical(a, ea);
  const std::filesystem::path cb = std::filesystem::weakly_canonical(b, eb);
  return !ea && !eb && ca == cb;
}

// A line of mpirun's banners: only dashes (at least 8), maybe indented.
bool IsBannerRule(std::string_view line) {
  const size_t begin = line.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return false;
  line.remove_prefix(begin);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) {
    line.remove_suffix(1);
  }
  return line.size() >= 8 && line.find_first_not_of('-') == std::string_view::npos;
}

bool Blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

}  // namespace

absl::Status RefuseOutputOverInput(const std::vector<NamedPath>& outputs,
                                   const std::vector<NamedPath>& inputs) {
  for (const NamedPath& out : outputs) {
    for (const NamedPath& in : inputs) {
      if (!SameFile(out.path, in.path)) continue;
      return absl::InvalidArgumentError(Cat(out.flag, ": ", out.path, " is the input of ", in.flag,
                                            "; an output never replaces an input (write it "
                                            "elsewhere)"));
    }
  }
  return absl::OkStatus();
}

std::string FailureReason(std::string_view log, std::string_view program) {
  const std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(log.data(), log.size()), '\n');
  const std::string prefix = Cat(program, ": ");
  for (absl::string_view l : lines) {
    if (absl::StartsWith(l, prefix)) return std::string(absl::StripTrailingAsciiWhitespace(l));
  }
  std::string outside, banner_first;
  bool in_banner = false, banner_has_first = false;
  for (absl::string_view l : lines) {
    if (IsBannerRule(std::string_view(l.data(), l.size()))) {
      in_banner = !in_banner;
      if (in_banner) banner_has_first = false;
      continue;
    }
    if (Blank(std::string_view(l.data(), l.size()))) continue;
    const std::string line(absl::StripAsciiWhitespace(l));
    if (!in_banner) {
      outside = line;
    } else if (!banner_has_first) {
      banner_first = line;
      banner_has_first = true;
    }
  }
  return outside.empty() ? banner_first : outside;
}

absl::StatusOr<ScratchDir> ScratchDir::Make(const std::string& given, std::string_view command) {
  if (!given.empty()) return ScratchDir(given, false);
  std::error_code ec;
  std::string tmpl =
      (std::filesystem::temp_directory_path(ec) / Cat("moeplan-", command, "-XXXXXX")).string();
  if (ec || mkdtemp(tmpl.data()) == nullptr) {
    return absl::PermissionDeniedError(
        Cat(command, ": cannot make a temporary directory (", tmpl,
            "); give --out-dir: ", ec ? ec.message() : std::strerror(errno)));
  }
  return ScratchDir(tmpl, true);
}

void ScratchDir::Remove() {
  std::error_code ec;
  if (owned_) std::filesystem::remove_all(path_, ec);
  owned_ = false;
}

}  // namespace moeplan::client
