// moeplan-server --listen ADDR --data-dir DIR [--tls-cert F --tls-key F] [--token-file F]
// [--threads N] [--cache-entries N] ... (--help lists them)
// Serves until SIGTERM or SIGINT, then drains in-flight calls and exits 0.
#include <fmt/format.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "moeplan/base/flags.h"
#include "moeplan/base/strings.h"
#include "moeplan/server/server.h"

namespace {

namespace server = ::moeplan::server;
using ::moeplan::View;

// The command line: the server's options, and the flags given in other units
// than ServerOptions holds them.
struct Flags {
  server::ServerOptions options;
  int drain_ms = 10000;
  size_t cache_mib = 0;
  size_t max_message_mib = 0;
  double max_plan_seconds = 0.0;
  bool quiet = false;
};

// Where it listens and who may call: address, TLS, token, data, threads.
void AddServingOptions(CLI::App& app, Flags* f) {
  server::ServerOptions& options = f->options;
  app.add_option("--listen", options.listen,
                 "host:port to listen on (port 0: any free port); loopback unless --allow-public")
      ->check(moeplan::flags::NonEmpty())
      ->capture_default_str();
  app.add_flag("--allow-public", options.allow_public,
               "Allow listening on a non-loopback address; needs --tls-cert, --tls-key and "
               "--token-file");
  app.add_option("--tls-cert", options.tls_cert_file,
                 "PEM certificate chain: serve over TLS (with --tls-key)")
      ->check(moeplan::flags::NonEmpty());
  app.add_option("--tls-key", options.tls_key_file, "PEM private key of --tls-cert")
      ->check(moeplan::flags::NonEmpty());
  app.add_option(
         "--token-file", options.token_file,
         "File whose first line is the bearer token PutProfile, ReportMeasurement and "
         "RefitProfile need (metadata 'authorization: Bearer <token>'; at least 16 characters)")
      ->check(moeplan::flags::NonEmpty());
  app.add_flag("--token-for-reads", options.token_for_reads,
               "Require the token for every RPC, reads included");
  app.add_option("--metrics", options.metrics_listen,
                 "host:port to serve Prometheus metrics on (GET /metrics; port 0: any free port), "
                 "on --listen's rules: loopback unless --allow-public, HTTPS with --tls-cert, the "
                 "token with --token-for-reads")
      ->check(moeplan::flags::NonEmpty());
  app.add_option("--data-dir", options.data_dir, "Directory for stored profiles and measurements")
      ->required()
      ->check(moeplan::flags::NonEmpty());
  app.add_option("--threads", options.threads,
                 "Cap on the threads that run requests (synchronous gRPC API); 0: gRPC's callback "
                 "API on its own pool, the fastest")
      ->check(moeplan::flags::IntInRange(0, 4096))
      ->capture_default_str();
}

// The limits on its work (cache, messages, plans), refits, draining and the log.
void AddLimitOptions(CLI::App& app, Flags* f) {
  server::ServerOptions& options = f->options;
  app.add_option("--cache-entries", options.cache_entries, "Plan cache size (0 disables it)")
      ->check(moeplan::flags::IntInRange(0, 100000000))
      ->capture_default_str();
  f->cache_mib = options.cache_bytes >> 20;
  app.add_option("--cache-mib", f->cache_mib,
                 "Plan cache bound in MiB (keys plus serialised responses; 0 disables it)")
      ->check(moeplan::flags::IntInRange(0, 1 << 20))
      ->capture_default_str();
  f->max_message_mib = options.handlers.max_response_bytes >> 20;
  app.add_option("--max-message-mib", f->max_message_mib,
                 "Largest response in MiB (a larger one is refused RESOURCE_EXHAUSTED, never "
                 "cached); the bundled clients accept this much")
      ->check(moeplan::flags::IntInRange(1, 2047))
      ->capture_default_str();
  app.add_option("--max-model-plans", options.handlers.max_model_plans,
                 "Uncached PlanModel calls (whole models, layouts, searches) run at once; one more "
                 "is refused RESOURCE_EXHAUSTED (0: the machine's hardware threads)")
      ->check(moeplan::flags::IntInRange(0, 4096))
      ->capture_default_str();
  f->max_plan_seconds = options.handlers.max_plan_time.count() / 1000.0;
  app.add_option("--max-plan-seconds", f->max_plan_seconds,
                 "Longest one plan may run before it is stopped DEADLINE_EXCEEDED (the call's own "
                 "deadline applies when earlier)")
      ->check(moeplan::flags::FiniteInRange(0.001, 86400.0))
      ->capture_default_str();
  app.add_option("--refit-every", options.handlers.refit_every,
                 "Refit a stored profile from its reported measurements after every N reported "
                 "against it (as RefitProfile, in the background; 0: only when asked)")
      ->check(moeplan::flags::IntInRange(0, 1 << 30))
      ->capture_default_str();
  app.add_option("--refit-window", options.handlers.refit_window,
                 "A refit fits on a profile's newest N reported measurements (older ones stay "
                 "stored); bounds a refit's memory and time as the log grows")
      ->check(moeplan::flags::IntInRange(1, 1000000))
      ->capture_default_str();
  app.add_option("--drain-ms", f->drain_ms,
                 "On SIGTERM/SIGINT, how long in-flight calls may finish")
      ->check(moeplan::flags::IntInRange(0, 3600000))
      ->capture_default_str();
  app.add_flag("--no-request-log", f->quiet, "Do not log one line per request on stderr");
}

// The flags kept in other units, into the options.
void ApplyFlags(Flags* f) {
  server::ServerOptions& options = f->options;
  options.handlers.log_requests = !f->quiet;
  options.handlers.max_response_bytes = f->max_message_mib << 20;
  options.handlers.max_plan_time =
      std::chrono::milliseconds(static_cast<int64_t>(f->max_plan_seconds * 1000.0));
  options.cache_bytes = f->cache_mib << 20;
}

// Starts the server, announces it and serves until SIGTERM or SIGINT; then
// drains. The exit status.
// The stop signals, blocked in the calling thread: main blocks them before
// it starts any thread (the trimmer's, gRPC's inherit the mask), or one that
// left them open could take a SIGTERM and end the process undrained.
sigset_t BlockStopSignals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return stop;
}

int Serve(const server::ServerOptions& options, int drain_ms) {
  // Blocked in every thread since main began; waited for here.
  sigset_t stop = BlockStopSignals();

  server::ProfileStore::OpenReport report;
  absl::StatusOr<std::unique_ptr<server::PlannerServer>> srv =
      server::PlannerServer::Start(options, &report);
  for (const std::string& skipped : report.skipped) {
    fmt::print(stderr, "moeplan-server: warning: {}\n", skipped);
  }
  if (!srv.ok()) {
    fmt::print(stderr, "moeplan-server: error: {}\n", View(srv.status().message()));
    return 1;
  }
  fmt::print(stderr, "moeplan-server: {} stored profile(s) loaded from {}\n", report.loaded.size(),
             options.data_dir);
  if (!(*srv)->metrics_url().empty()) {
    fmt::print(stderr, "moeplan-server: metrics at {}\n", (*srv)->metrics_url());
  }
  // The one line on stdout: scripts wait for it to know the port.
  fmt::print("moeplan-server listening on {}\n", (*srv)->address());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop, &sig);
  fmt::print(stderr, "moeplan-server: {} received, draining (up to {} ms)\n",
             sig == SIGTERM ? "SIGTERM" : "SIGINT", drain_ms);
  (*srv)->Shutdown(std::chrono::milliseconds(drain_ms));
  (*srv)->Wait();
  fmt::print(stderr, "moeplan-server: stopped\n");
  return 0;
}

// glibc's allocator, set for a server whose memory is a bounded cache plus a
// working set (docs/service.md "Memory"); before any thread starts:
// - blocks of 128 KiB and more are mapped and unmapped on their own. Left to
//   itself, glibc raises this threshold to the largest block freed (up to
//   32 MiB), after which each multi-MiB response buffer is carved from an
//   arena and its pages stay with the process after it is freed;
// - at most 2 arenas: each thread that allocates under contention gets one,
//   and every arena keeps its free pages.
void TuneAllocator() {
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
  mallopt(M_ARENA_MAX, 2);
}

// A response's parsed form is many small blocks; freed, they leave whole free
// pages inside the arenas that only malloc_trim hands back. Every 2 s.
void StartTrimmer() {
  std::thread([] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      malloc_trim(0);
    }
  }).detach();
}

}  // namespace

int main(int argc, char** argv) {
  TuneAllocator();
  Flags flags;
  CLI::App app{"moeplan-server: the moeplan planner over gRPC (moeplan.v1.Planner)"};
  app.set_version_flag("--version", "moeplan-server " MOEPLAN_VERSION);
  AddServingOptions(app, &flags);
  AddLimitOptions(app, &flags);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("moeplan-server: error: {} (see --help)\n", e.what());
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  ApplyFlags(&flags);
  BlockStopSignals();  // before the first thread
  StartTrimmer();
  // Debian's abseil checks every absl::Mutex acquisition for lock-order cycles
  // (~3% of server CPU under load); the server's locking is flat.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return Serve(flags.options, flags.drain_ms);
}
