// Starts the real moeplan-server binary as a child process and reads the port
// it announces on stdout.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace moeplan::testing {

class ServerProcess {
 public:
  // Starts `moeplan-server --listen LISTEN --data-dir DIR --no-request-log
  // EXTRA...` and waits (up to 20 s) for "moeplan-server listening on ADDR".
  explicit ServerProcess(const std::string& data_dir, std::vector<std::string> extra = {},
                         const std::string& listen = "127.0.0.1:0") {
    std::vector<std::string> args = {MOEPLAN_SERVER, "--listen",  listen,
                                     "--data-dir",   data_dir,    "--no-request-log"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      close(out[0]);
      close(out[1]);
      execv(MOEPLAN_SERVER, argv.data());
      _exit(127);
    }
    close(out[1]);
    FILE* f = fdopen(out[0], "r");
    char line[256] = {};
    // fgets blocks until the line arrives or the child exits (EOF).
    if (f != nullptr && fgets(line, sizeof line, f) != nullptr) {
      const std::string s = line;
      const std::string prefix = "moeplan-server listening on ";
      if (s.rfind(prefix, 0) == 0) address_ = s.substr(prefix.size(), s.size() - prefix.size() - 1);
    }
    if (f != nullptr) fclose(f);
  }
  ~ServerProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& address() const { return address_; }
  std::string port() const { return address_.substr(address_.rfind(':') + 1); }
  pid_t pid() const { return pid_; }

  // Sends `sig` and returns the exit status (WEXITSTATUS, or 128 + signal).
  int Stop(int sig) {
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string address_;
};

}  // namespace moeplan::testing
