// The Prometheus endpoint of moeplan-server (--metrics HOST:PORT): GET
// /metrics over HTTP, or HTTPS with the server's own certificate, on the same
// rules as the gRPC port (loopback unless --allow-public; the bearer token with
// --token-for-reads). cpp-httplib serves it on two threads of its own, so a
// scrape never waits on gRPC's threads nor they on it. Private to moeplan::server.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace moeplan::server {

struct MetricsEndpointOptions {
  std::string listen;  // host:port; port 0 picks a free one
  bool allow_public = false;
  std::string tls_cert_file, tls_key_file;  // both: HTTPS
  std::string token;                        // non-empty: scrapes need "Authorization: Bearer"
};

class MetricsEndpoint {
 public:
  // Binds and starts serving `render()` at /metrics.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const MetricsEndpointOptions& options, std::function<std::string()> render);
  ~MetricsEndpoint();  // stops serving and joins its threads
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // "http://host:port/metrics" (https with TLS), the port actually bound.
  const std::string& url() const { return url_; }

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};  // the listening thread is done
  std::string url_;
};

}  // namespace moeplan::server
