// Helpers shared by the `moeplan` commands (commands.h).
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/calibration/validation.h"
#include "moeplan/planner/types.h"
#include "moeplan/v1/layer.pb.h"

namespace moeplan::client {

// Parses --schedules: a comma-separated subset of default,s1,s2, each at most
// once, or "all" (or empty), returned as an empty list. InvalidArgument naming
// --schedules otherwise.
absl::StatusOr<std::vector<planner::Schedule>> ParseSchedules(const std::string& list);

// Parses a comma-separated list of names (each a `noun`) of `flag`, each at most once, or
// "all" (or empty), returned as an empty list. `parse` maps a name;
// `choices` is the help text of the allowed names.
template <class T>
absl::StatusOr<std::vector<T>> ParseNameList(std::string_view flag, std::string_view noun,
                                             const std::string& list,
                                             bool (*parse)(std::string_view, T*),
                                             std::string_view choices) {
  std::vector<T> out;
  if (list.empty() || list == "all") return out;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string_view name = std::string_view(list).substr(begin, end - begin);
    T value;
    if (!parse(name, &value)) {
      return absl::InvalidArgumentError(
          std::string(flag) + ": unknown " + std::string(noun) + " '" + std::string(name) + "' (use " +
          std::string(choices) + " or all)");
    }
    for (const T& seen : out) {
      if (seen == value) {
        return absl::InvalidArgumentError(std::string(flag) + ": '" + std::string(name) +
                                          "' listed twice");
      }
    }
    out.push_back(value);
    begin = end + 1;
  }
  return out;
}

// With --server, a --cluster naming an existing file that is not a built-in
// profile name is sent inline; anything else is a name the server resolves.
bool SendProfileInline(const std::string& cluster);

// Reads a grid file (moeplan.v1.LayerGrid JSON) into `grid` and expands it into
// its configs; an expansion error is InvalidArgument prefixed with `path`.
absl::StatusOr<std::vector<v1::LayerConfig>> ReadGrid(const std::string& path, v1::LayerGrid* grid);

// Writes `text` to stdout and flushes it: InternalError "stdout: write failed".
absl::Status WriteStdout(const std::string& text);

// A scatter plot into `dir`: STEM.dat and STEM.gp written, STEM.png drawn by
// gnuplot where it can. Returns the PNG's file name, or "" with `note` saying
// why there is none (no gnuplot: the data are in STEM.dat).
absl::StatusOr<std::string> DrawScatter(const calibration::Scatter& plot, const std::string& dir,
                                        const std::string& stem, std::string* note);

// A binary of this build tree (build/client/moeplan -> build/<dir>/<name>) or
// installed beside this one; else `name`, found on the PATH.
std::string SiblingBinary(std::string_view dir, std::string_view name);

// A --launcher text with every "{ranks}" replaced by `ranks`.
std::string LauncherFor(std::string launcher, int ranks);

struct Ran {
  int exit_code = 0;
  std::string out;
};
// Runs `command` under /bin/sh, collecting stdout (stderr goes where the
// command sends it).
absl::StatusOr<Ran> RunCommand(const std::string& command);

// A file a command reads or writes, and the flag that names it.
struct NamedPath {
  std::string_view flag;  // "--trace"
  std::string path;       // empty: not given
};

// Refuses an output that would replace one of the command's inputs:
// InvalidArgument "<output flag>: <path> is the input of <input flag>; ...".
// Two paths are the same file when both exist with the same device and inode
// (symbolic links followed, so a link or another spelling is caught), or when
// neither exists yet and they resolve to the same path. Every command that
// writes files calls it before it reads or writes anything.
absl::Status RefuseOutputOverInput(const std::vector<NamedPath>& outputs,
                                   const std::vector<NamedPath>& inputs);

// Why a program run under a launcher failed, from its stderr `log`: the
// program's own error line (the first line starting with "<program>: ", as
// executor::PrintRankError and the program's usage errors write them), else
// the last line outside mpirun's banners (blocks between lines of dashes),
// else the first line of the last banner (mpirun's own reason, e.g. too few
// slots); "" for an empty log. Never a banner's dashes or its "Primary job
// terminated normally" boilerplate when the program said why.
std::string FailureReason(std::string_view log, std::string_view program);

// A directory the command was given (`given`, kept), else a new temporary
// one removed with this object: a command writes nothing where it was not
// asked to. `command` names the command in the error when none can be made.
class ScratchDir {
 public:
  static absl::StatusOr<ScratchDir> Make(const std::string& given, std::string_view command);
  ScratchDir(ScratchDir&& o) noexcept : path_(std::move(o.path_)), owned_(o.owned_) {
    o.owned_ = false;
  }
  ScratchDir& operator=(ScratchDir&& o) noexcept {
    if (this != &o) {
      Remove();
      path_ = std::move(o.path_);
      owned_ = std::exchange(o.owned_, false);
    }
    return *this;
  }
  ~ScratchDir() { Remove(); }
  const std::string& path() const { return path_; }
  bool temporary() const { return owned_; }

 private:
  void Remove();
  ScratchDir(std::string path, bool owned) : path_(std::move(path)), owned_(owned) {}
  std::string path_;
  bool owned_ = false;
};

}  // namespace moeplan::client
