// Runs the built `moeplan` binary the way a user does (from the source tree, so
// example paths resolve) and captures exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace moeplan::testing {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/moeplan_cli_test.XXXXXX";
    path_ = mkdtemp(tmpl) ? tmpl : "";
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  // Writes `contents` to `name` and returns the path.
  std::string Write(const std::string& name, const std::string& contents) const {
    std::ofstream(File(name)) << contents;
    return File(name);
  }

 private:
  std::string path_;
};

// `args` is passed to the shell verbatim after the binary's path.
inline CliResult RunCli(const std::string& args) {
  TempDir tmp;
  const std::string cmd = "cd '" MOEPLAN_SOURCE_DIR "' && '" MOEPLAN_CLI "' " + args + " >'" +
                          tmp.File("out") + "' 2>'" + tmp.File("err") + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = Slurp(tmp.File("out"));
  r.err = Slurp(tmp.File("err"));
  return r;
}

}  // namespace moeplan::testing
