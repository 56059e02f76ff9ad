#include "metrics_endpoint.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/server/handlers.h"
#include "moeplan/server/server.h"

namespace moeplan::server {
namespace {

// The 0.0.4 text exposition format, what Prometheus asks for first.
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const MetricsEndpointOptions& o, std::function<std::string()> render) {
  MOEPLAN_RETURN_IF_ERROR(CheckListenAddress(o.listen, o.allow_public, "--metrics"));
  if (o.listen.rfind("unix:", 0) == 0) {
    return absl::InvalidArgumentError(
        Cat("--metrics: must be host:port (got '", o.listen, "'); Prometheus scrapes over TCP"));
  }
  const size_t colon = o.listen.rfind(':');
  std::string host = o.listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const int port = std::stoi(o.listen.substr(colon + 1));
  const bool tls = !o.tls_cert_file.empty();
  std::unique_ptr<MetricsEndpoint> out(new MetricsEndpoint());
  if (tls) {
    out->http_ =
        std::make_unique<httplib::SSLServer>(o.tls_cert_file.c_str(), o.tls_key_file.c_str());
  } else {
    out->http_ = std::make_unique<httplib::Server>();
  }
  if (!out->http_->is_valid()) {
    return absl::InvalidArgumentError(Cat("--metrics: cannot serve HTTPS with --tls-cert ",
                                          o.tls_cert_file, " and --tls-key ", o.tls_key_file));
  }
  out->http_->new_task_queue = [] { return new httplib::ThreadPool(2); };
  out->http_->set_read_timeout(5);
  out->http_->set_write_timeout(5);
  out->http_->Get("/metrics", [render = std::move(render), token = o.token](
                                  const httplib::Request& req, httplib::Response& res) {
    if (!token.empty() && !BearerTokenMatches(req.get_header_value("Authorization"), token)) {
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_content("/metrics needs the server's bearer token (--token-for-reads)\n",
                      "text/plain");
      return;
    }
    res.set_content(render(), kContentType);
  });
  const int bound = port == 0 ? out->http_->bind_to_any_port(host)
                              : (out->http_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(
        Cat("--metrics: cannot listen on ", o.listen, " (address in use or not available)"));
  }
  const std::string shown = host.find(':') != std::string::npos ? Cat("[", host, "]") : host;
  out->url_ = Cat(tls ? "https" : "http", "://", shown, ":", bound, "/metrics");
  httplib::Server* http = out->http_.get();
  std::atomic<bool>* done = &out->listen_returned_;
  out->thread_ = std::thread([http, done] {
    http->listen_after_bind();
    done->store(true);
  });
  // cpp-httplib 0.11's stop() does nothing until the listening thread has
  // marked the server running (the first thing listen_after_bind does): an
  // endpoint stopped before that would join a thread that accepts forever.
  // Return once it runs, or has returned (then the destructor joins it).
  while (!http->is_running() && !done->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (done->load()) {
    return absl::UnavailableError(Cat("--metrics: the endpoint on ", o.listen, " stopped at once"));
  }
  return out;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace moeplan::server
