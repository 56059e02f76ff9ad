// The gRPC translation unit of the server: the Planner service, health,
// reflection, start and shutdown. The handlers (handlers.h, no gRPC) are shared
// by two thin adapters: the callback API (default; handlers answer inline on
// gRPC's own pool: a cached plan is its cached bytes sent as they are, an
// uncached one ~10 us of planning) and the synchronous API, used when --threads
// caps the handler threads (gRPC 1.51's resource quota bounds only the
// synchronous server's threads).
#include "moeplan/server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "metrics_endpoint.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/proto/json.h"
#include "moeplan/server/handlers.h"
#include "moeplan/v1/service.grpc.pb.h"

namespace moeplan::server {
namespace {

absl::Status Invalid(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

// absl and gRPC share the canonical status codes one to one.
grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// gRPC's server context as the handlers see it.
class GrpcCall final : public CallContext {
 public:
  explicit GrpcCall(grpc::ServerContextBase* ctx) : ctx_(*ctx) {}
  bool IsCancelled() const override { return ctx_.IsCancelled(); }
  std::chrono::system_clock::time_point deadline() const override { return ctx_.deadline(); }
  std::string_view Authorization() const override {
    const auto& md = ctx_.client_metadata();
    const auto it = md.find("authorization");
    if (it == md.end()) return {};
    return {it->second.data(), it->second.size()};
  }

 private:
  grpc::ServerContextBase& ctx_;
};

// Threads for uncached whole-model plans (milliseconds to seconds each), so
// that gRPC's own threads, which the callback API runs handlers on and which
// number about the machine's cores, stay free for the cheap calls. At most
// `queue` calls wait for a thread; one more is refused.
class PlanPool {
 public:
  PlanPool(int threads, int queue) : queue_(static_cast<size_t>(queue)) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~PlanPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  bool Submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || jobs_.size() >= queue_) return false;
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
    return true;
  }
  int threads() const { return static_cast<int>(threads_.size()); }
  size_t queue() const { return queue_; }
  int waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(jobs_.size());
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  const size_t queue_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// A request's bytes as gRPC received them: a view of its one slice (the usual
// case: no copy), or its slices joined.
class RequestBytes {
 public:
  explicit RequestBytes(const grpc::ByteBuffer& buffer) {
    ok_ = buffer.Dump(&slices_).ok();
    if (slices_.size() == 1) {
      bytes_ =
          std::string_view(reinterpret_cast<const char*>(slices_[0].begin()), slices_[0].size());
      return;
    }
    for (const grpc::Slice& s : slices_) {
      joined_.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    bytes_ = joined_;
  }
  bool ok() const { return ok_; }
  std::string_view bytes() const { return bytes_; }

 private:
  bool ok_ = false;
  std::vector<grpc::Slice> slices_;
  std::string joined_;
  std::string_view bytes_;
};

// A cached response sent as it is: the slice holds a reference to the cache's
// bytes (released when gRPC is done with them), copying and serialising nothing.
void SendBytes(const PlanCache::Value& value, grpc::ByteBuffer* out) {
  auto* held = new PlanCache::Value(value);
  grpc::Slice slice(
      const_cast<char*>((*held)->data()), (*held)->size(),
      [](void* p) { delete static_cast<PlanCache::Value*>(p); }, held);
  grpc::ByteBuffer buffer(&slice, 1);
  out->Swap(&buffer);
}

absl::Status Unreadable() { return absl::InternalError("the request's bytes could not be read"); }

// The callback API: handlers run inline on gRPC's pool and finish at once,
// except uncached whole-model plans, which run on the PlanPool. The plan RPCs
// take and send bytes (gRPC's raw callback methods): a repeated request is
// answered from the bytes cached for its bytes, as cheaply as gRPC's own
// empty health Check (docs/service.md "Plan cache").
using CallbackBase = v1::Planner::WithRawCallbackMethod_PlanLayer<
    v1::Planner::WithRawCallbackMethod_PlanModel<v1::Planner::CallbackService>>;
class CallbackPlanner final : public CallbackBase {
 public:
  CallbackPlanner(Handlers* core, PlanPool* pool) : core_(*core), pool_(*pool) {}
  grpc::ServerUnaryReactor* PlanLayer(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override {
    const auto arrived = std::chrono::steady_clock::now();
    const RequestBytes bytes(*req);
    if (!bytes.ok()) return Unanswered(ctx, Method::kPlanLayer, Unreadable(), arrived);
    PlanCache::Value out;
    const absl::Status s = core_.PlanLayerBytes(GrpcCall(ctx), bytes.bytes(), &out);
    if (s.ok()) SendBytes(out, resp);
    return Finish(ctx, s);
  }
  grpc::ServerUnaryReactor* PlanModel(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override {
    const auto arrived = std::chrono::steady_clock::now();
    {
      const RequestBytes bytes(*req);
      if (!bytes.ok()) return Unanswered(ctx, Method::kPlanModel, Unreadable(), arrived);
      PlanCache::Value out;
      const absl::Status s =
          core_.PlanModelBytes(GrpcCall(ctx), bytes.bytes(), /*plan_miss=*/false, &out);
      if (!s.ok() || out != nullptr) {
        if (s.ok()) SendBytes(out, resp);
        return Finish(ctx, s);
      }
    }
    // A miss: planned on the PlanPool, as the second half of this call (its
    // latency from `arrived`, its cache lookups counted once).
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    // ctx, req and resp live until the reactor finishes.
    const bool queued = pool_.Submit([this, ctx, req, resp, reactor, arrived] {
      const RequestBytes bytes(*req);
      PlanCache::Value out;
      absl::Status planned = absl::OkStatus();
      if (bytes.ok()) {
        planned = core_.PlanModelBytes(GrpcCall(ctx), bytes.bytes(), true, &out, arrived);
      } else {
        planned = Unreadable();
        core_.Answered(Method::kPlanModel, planned, arrived);
      }
      if (planned.ok()) SendBytes(out, resp);
      reactor->Finish(ToGrpc(planned));
    });
    if (!queued) Busy(reactor, Method::kPlanModel, arrived);
    return reactor;
  }
  grpc::ServerUnaryReactor* ListProfiles(grpc::CallbackServerContext* ctx,
                                         const v1::ListProfilesRequest* req,
                                         v1::ListProfilesResponse* resp) override {
    return Finish(ctx, core_.ListProfiles(GrpcCall(ctx), *req, resp));
  }
  grpc::ServerUnaryReactor* GetProfile(grpc::CallbackServerContext* ctx,
                                       const v1::GetProfileRequest* req,
                                       v1::ClusterProfile* resp) override {
    return Finish(ctx, core_.GetProfile(GrpcCall(ctx), *req, resp));
  }
  grpc::ServerUnaryReactor* PutProfile(grpc::CallbackServerContext* ctx,
                                       const v1::PutProfileRequest* req,
                                       v1::PutProfileResponse* resp) override {
    return Finish(ctx, core_.PutProfile(GrpcCall(ctx), *req, resp));
  }
  grpc::ServerUnaryReactor* ReportMeasurement(grpc::CallbackServerContext* ctx,
                                              const v1::ReportMeasurementRequest* req,
                                              v1::ReportMeasurementResponse* resp) override {
    return Finish(ctx, core_.ReportMeasurement(GrpcCall(ctx), *req, resp));
  }
  // A refit re-plans every reported run: on the planning threads, like model plans.
  grpc::ServerUnaryReactor* RefitProfile(grpc::CallbackServerContext* ctx,
                                         const v1::RefitProfileRequest* req,
                                         v1::RefitProfileResponse* resp) override {
    const auto arrived = std::chrono::steady_clock::now();
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    const bool queued = pool_.Submit([this, ctx, req, resp, reactor] {
      reactor->Finish(ToGrpc(core_.RefitProfile(GrpcCall(ctx), *req, resp)));
    });
    if (!queued) Busy(reactor, Method::kRefitProfile, arrived);
    return reactor;
  }

 private:
  // The planning queue is full: refused at once, counted and logged.
  void Busy(grpc::ServerUnaryReactor* reactor, Method m,
            std::chrono::steady_clock::time_point arrived) {
    const absl::Status s = absl::ResourceExhaustedError(
        Cat("server busy: ", pool_.threads(), " plans are running and ", pool_.queue(),
            " waiting (moeplan-server --max-model-plans); retry later"));
    core_.metrics().Refuse(Refusal::kModelPlansBusy);
    core_.Answered(m, s, arrived);
    reactor->Finish(ToGrpc(s));
  }
  // A call the handlers never saw (its bytes unreadable): counted and logged.
  grpc::ServerUnaryReactor* Unanswered(grpc::CallbackServerContext* ctx, Method m,
                                       const absl::Status& s,
                                       std::chrono::steady_clock::time_point arrived) {
    core_.Answered(m, s, arrived);
    return Finish(ctx, s);
  }
  static grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& s) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  Handlers& core_;
  PlanPool& pool_;
};

// The synchronous API: gRPC's thread manager, bounded by the resource quota.
class SyncPlanner final : public v1::Planner::Service {
 public:
  explicit SyncPlanner(Handlers* core) : core_(*core) {}
  grpc::Status PlanLayer(grpc::ServerContext* ctx, const v1::PlanLayerRequest* req,
                         v1::PlanLayerResponse* resp) override {
    return ToGrpc(core_.PlanLayer(GrpcCall(ctx), *req, resp));
  }
  grpc::Status PlanModel(grpc::ServerContext* ctx, const v1::PlanModelRequest* req,
                         v1::PlanModelResponse* resp) override {
    return ToGrpc(core_.PlanModel(GrpcCall(ctx), *req, resp));
  }
  grpc::Status ListProfiles(grpc::ServerContext* ctx, const v1::ListProfilesRequest* req,
                            v1::ListProfilesResponse* resp) override {
    return ToGrpc(core_.ListProfiles(GrpcCall(ctx), *req, resp));
  }
  grpc::Status GetProfile(grpc::ServerContext* ctx, const v1::GetProfileRequest* req,
                          v1::ClusterProfile* resp) override {
    return ToGrpc(core_.GetProfile(GrpcCall(ctx), *req, resp));
  }
  grpc::Status PutProfile(grpc::ServerContext* ctx, const v1::PutProfileRequest* req,
                          v1::PutProfileResponse* resp) override {
    return ToGrpc(core_.PutProfile(GrpcCall(ctx), *req, resp));
  }
  grpc::Status ReportMeasurement(grpc::ServerContext* ctx, const v1::ReportMeasurementRequest* req,
                                 v1::ReportMeasurementResponse* resp) override {
    return ToGrpc(core_.ReportMeasurement(GrpcCall(ctx), *req, resp));
  }
  grpc::Status RefitProfile(grpc::ServerContext* ctx, const v1::RefitProfileRequest* req,
                            v1::RefitProfileResponse* resp) override {
    return ToGrpc(core_.RefitProfile(GrpcCall(ctx), *req, resp));
  }

 private:
  Handlers& core_;
};

}  // namespace

absl::Status CheckListenAddress(const std::string& listen, bool allow_public,
                                std::string_view flag) {
  if (listen.rfind("unix:", 0) == 0) return absl::OkStatus();
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == listen.size()) {
    return Invalid(Cat(flag, ": must be host:port or unix:PATH (got '", listen, "')"));
  }
  const std::string port = listen.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      std::stoi(port) > 65535) {
    return Invalid(Cat(flag, ": port must be 0..65535 (got '", port, "')"));
  }
  const std::string host = listen.substr(0, colon);
  const bool loopback = host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]";
  if (!loopback && !allow_public) {
    return Invalid(Cat(flag, ": '", host,
                       "' is not a loopback address; pass --allow-public to serve beyond this "
                       "machine"));
  }
  return absl::OkStatus();
}

struct PlannerServer::Impl {
  std::unique_ptr<Handlers> core;
  std::unique_ptr<PlanPool> pool;  // destroyed after the server (its jobs finish calls)
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<grpc::Server> server;
  std::once_flag shutdown_once;
  // Reads the others when scraped: stopped first.
  std::unique_ptr<MetricsEndpoint> metrics;
};

const std::string& PlannerServer::metrics_url() const {
  static const std::string kNone;
  return impl_->metrics ? impl_->metrics->url() : kNone;
}

namespace {

// The bearer token: the file's first line, at least 16 printable characters.
absl::StatusOr<std::string> ReadToken(const std::string& path) {
  MOEPLAN_ASSIGN_OR_RETURN(std::string token, proto::ReadTokenFile(path));
  if (token.size() < 16) {
    return Invalid(
        Cat("--token-file: the token (the file's first line) must be at least 16 "
            "characters (got ",
            token.size(), ")"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return Invalid("--token-file: the token must be printable ASCII without spaces");
    }
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const ServerOptions& o) {
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return Invalid("--tls-cert and --tls-key: give both (the certificate chain and its key)");
  }
  if (o.allow_public && (o.tls_cert_file.empty() || o.token_file.empty())) {
    return Invalid(
        "--allow-public: serving beyond this machine needs TLS and a token for writes: give "
        "--tls-cert, --tls-key and --token-file");
  }
  if (o.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert = proto::ReadFile(o.tls_cert_file, 1 << 20);
  if (!cert.ok()) return Invalid(Cat("--tls-cert: ", View(cert.status().message())));
  absl::StatusOr<std::string> key = proto::ReadFile(o.tls_key_file, 1 << 20);
  if (!key.ok()) return Invalid(Cat("--tls-key: ", View(key.status().message())));
  if (cert->find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
    return Invalid(Cat("--tls-cert: ", o.tls_cert_file, " holds no PEM certificate"));
  }
  if (key->find("PRIVATE KEY-----") == std::string::npos) {
    return Invalid(Cat("--tls-key: ", o.tls_key_file, " holds no PEM private key"));
  }
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PlannerServer>> PlannerServer::Start(
    const ServerOptions& options, ProfileStore::OpenReport* report) {
  MOEPLAN_RETURN_IF_ERROR(CheckListenAddress(options.listen, options.allow_public));
  MOEPLAN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                           Credentials(options));
  HandlerOptions handler_options = options.handlers;
  if (!options.token_file.empty()) {
    MOEPLAN_ASSIGN_OR_RETURN(handler_options.token, ReadToken(options.token_file));
  }
  handler_options.token_for_reads = options.token_for_reads;
  if (options.threads > 0) {
    // The synchronous API runs every call on its N threads: model plans may
    // hold at most N - 1 of them, so one is always left for the cheap calls.
    const int most = std::max(1, options.threads - 1);
    if (handler_options.max_model_plans <= 0 || handler_options.max_model_plans > most) {
      handler_options.max_model_plans = most;
    }
  }
  if (options.token_for_reads && options.token_file.empty()) {
    return Invalid("--token-for-reads: needs --token-file");
  }
  if (options.threads < 0)
    return Invalid(Cat("--threads: must be >= 0 (got ", options.threads, ")"));
  std::unique_ptr<PlannerServer> out(new PlannerServer());
  absl::StatusOr<std::unique_ptr<ProfileStore>> store =
      ProfileStore::Open(options.data_dir, report);
  if (!store.ok()) return store.status();
  out->store_ = *std::move(store);
  out->cache_ = std::make_unique<PlanCache>(options.cache_entries, options.cache_bytes);
  out->impl_ = std::make_unique<Impl>();
  out->impl_->core =
      std::make_unique<Handlers>(out->store_.get(), out->cache_.get(), handler_options);
  if (options.threads > 0) {
    out->impl_->service = std::make_unique<SyncPlanner>(out->impl_->core.get());
  } else {
    const int plans = handler_options.max_model_plans > 0
                          ? handler_options.max_model_plans
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    out->impl_->pool = std::make_unique<PlanPool>(plans, 16 * plans);
    out->impl_->service =
        std::make_unique<CallbackPlanner>(out->impl_->core.get(), out->impl_->pool.get());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, credentials, &out->port_);
  builder.SetMaxSendMessageSize(static_cast<int>(
      std::min<size_t>(handler_options.max_response_bytes, std::numeric_limits<int>::max())));
  builder.RegisterService(out->impl_->service.get());
  if (options.threads > 0) {
    // The synchronous thread manager keeps one thread polling: a call that
    // takes the last poller must start a replacement or is refused with
    // RESOURCE_EXHAUSTED. Counting the poller lets N calls run at once; with a
    // cap of exactly N, a sequential client was refused whenever the previous
    // call's thread had not yet returned to the pool (seen under TSan).
    grpc::ResourceQuota quota("moeplan-server");
    quota.SetMaxThreads(options.threads + 1);
    builder.SetResourceQuota(quota);
  }
  out->impl_->server = builder.BuildAndStart();
  if (!out->impl_->server || (out->port_ == 0 && options.listen.rfind("unix:", 0) != 0)) {
    return absl::UnavailableError(
        Cat("--listen: cannot listen on ", options.listen, " (address in use or not available)"));
  }
  if (grpc::HealthCheckServiceInterface* h = out->impl_->server->GetHealthCheckService()) {
    h->SetServingStatus(v1::Planner::service_full_name(), true);
  }
  out->address_ = options.listen.rfind("unix:", 0) == 0
                      ? options.listen
                      : Cat(options.listen.substr(0, options.listen.rfind(':')), ":", out->port_);
  if (!options.metrics_listen.empty()) {
    MOEPLAN_RETURN_IF_ERROR(out->StartMetrics(options, handler_options));
  }
  return out;
}

absl::Status PlannerServer::StartMetrics(const ServerOptions& options,
                                         const HandlerOptions& handlers) {
  MetricsEndpointOptions m;
  m.listen = options.metrics_listen;
  m.allow_public = options.allow_public;
  m.tls_cert_file = options.tls_cert_file;
  m.tls_key_file = options.tls_key_file;
  if (options.token_for_reads) m.token = handlers.token;
  MetricsSources sources;
  sources.cache = cache_.get();
  sources.store = store_.get();
  Handlers* core = impl_->core.get();
  sources.model_plans_running = [core] { return core->model_plans_running(); };
  if (PlanPool* pool = impl_->pool.get()) {
    sources.model_plans_queued = [pool] { return pool->waiting(); };
  }
  sources.max_model_plans =
      handlers.max_model_plans > 0
          ? handlers.max_model_plans
          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto render = [core, sources = std::move(sources)] { return core->metrics().Render(sources); };
  MOEPLAN_ASSIGN_OR_RETURN(impl_->metrics, MetricsEndpoint::Start(m, std::move(render)));
  return absl::OkStatus();
}

PlannerServer::~PlannerServer() {
  if (impl_ && impl_->server) {
    Shutdown(std::chrono::milliseconds(0));
    impl_->server->Wait();
  }
}

void PlannerServer::Shutdown(std::chrono::milliseconds drain) {
  std::call_once(impl_->shutdown_once, [&] {
    if (grpc::HealthCheckServiceInterface* h = impl_->server->GetHealthCheckService()) {
      h->SetServingStatus(false);
    }
    impl_->server->Shutdown(std::chrono::system_clock::now() + drain);
  });
}

void PlannerServer::Wait() { impl_->server->Wait(); }

}  // namespace moeplan::server
