#include "moeplan/base/watchdog.h"

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "fmt/format.h"

namespace moeplan {
namespace {

using Clock = std::chrono::steady_clock;

struct State {
  std::mutex mu;
  std::condition_variable cv;
  std::string program, step = "start";
  int rank = 0, exit_code = 3;
  std::chrono::milliseconds timeout{0};
  Clock::time_point since = Clock::now();
  bool running = false, stop = false;
  std::thread thread;
};

State& S() {
  static State* s = new State();  // never destroyed: the thread may outlive main's statics
  return *s;
}

void Watch() {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.mu);
  while (!s.stop) {
    const Clock::time_point due = s.since + s.timeout;
    if (Clock::now() >= due) {
      const double secs = std::chrono::duration<double>(Clock::now() - s.since).count();
      const std::string line = fmt::format(
          "{}: rank {}: no progress for {:.1f} s in '{}' (a peer rank died or stalled, or this "
          "step takes longer than --watchdog-s); exiting\n",
          s.program, s.rank, secs, s.step);
      // write(2), not stdio: the main thread may hold stdio's locks.
      (void)!::write(2, line.data(), line.size());
      ::_exit(s.exit_code);
    }
    s.cv.wait_until(lock, due);
  }
}

}  // namespace

void Watchdog::Start(std::string_view program, int rank, std::chrono::milliseconds timeout,
                     int exit_code) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.running || timeout.count() <= 0) return;
  s.program = std::string(program);
  s.rank = rank;
  s.timeout = timeout;
  s.exit_code = exit_code;
  s.since = Clock::now();
  s.stop = false;
  s.running = true;
  s.thread = std::thread(Watch);
}

void Watchdog::Step(std::string_view what) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.running) return;
  s.step.assign(what.data(), what.size());
  s.since = Clock::now();
}

void Watchdog::Stop() {
  State& s = S();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.running) return;
    s.stop = true;
    s.running = false;
  }
  s.cv.notify_all();
  s.thread.join();
}

}  // namespace moeplan
