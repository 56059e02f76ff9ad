// moeplan-server: the moeplan.v1.Planner service over gRPC (docs/service.md), with
// the standard health service and server reflection. This header keeps gRPC
// out of its includers; the implementation is the one gRPC translation unit.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "moeplan/server/handlers.h"
#include "moeplan/server/plan_cache.h"
#include "moeplan/server/profile_store.h"

namespace moeplan::server {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // host:port; port 0 picks a free one
  // Needed to listen on a non-loopback address, and then needs TLS and a token.
  bool allow_public = false;
  std::string tls_cert_file, tls_key_file;  // PEM; both or neither: TLS on every call
  std::string token_file;                   // the bearer token writes need (its first line)
  bool token_for_reads = false;             // reads need the token too
  std::string data_dir;
  int threads = 0;  // >0: cap on the threads that run handlers (gRPC resource quota)
  size_t cache_entries = 10000;
  size_t cache_bytes = PlanCache::kDefaultCapacityBytes;  // keys plus serialised responses
  HandlerOptions handlers;  // limits on one request's work, the request log
  // host:port of the Prometheus endpoint (GET /metrics; docs/service.md
  // "Metrics"), on the gRPC port's rules: loopback unless allow_public, HTTPS
  // with the TLS certificate, the token with token_for_reads. Empty: none.
  std::string metrics_listen;
};

// InvalidArgument unless `listen` is host:port on a loopback host (127.0.0.0/8,
// localhost, [::1]) or a unix: socket, or allow_public is set; the message
// names `flag`.
absl::Status CheckListenAddress(const std::string& listen, bool allow_public,
                                std::string_view flag = "--listen");

class PlannerServer {
 public:
  // Opens the store (`report` lists loaded and skipped profile files), binds and
  // starts serving.
  static absl::StatusOr<std::unique_ptr<PlannerServer>> Start(const ServerOptions& options,
                                                              ProfileStore::OpenReport* report);
  ~PlannerServer();

  int port() const { return port_; }
  // "host:port" with the port actually bound.
  const std::string& address() const { return address_; }
  // "http://host:port/metrics" (https with TLS) with the port bound; empty
  // without metrics_listen.
  const std::string& metrics_url() const;
  // Stops accepting calls, lets in-flight calls finish for up to `drain`, then
  // cancels what is left. Idempotent.
  void Shutdown(std::chrono::milliseconds drain);
  // Blocks until the server has shut down.
  void Wait();

  ProfileStore& store() { return *store_; }
  PlanCache& cache() { return *cache_; }

 private:
  struct Impl;
  PlannerServer() = default;
  absl::Status StartMetrics(const ServerOptions& options, const HandlerOptions& handlers);
  std::unique_ptr<ProfileStore> store_;
  std::unique_ptr<PlanCache> cache_;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::string address_;
};

}  // namespace moeplan::server
