#include "moeplan/client/planner_client.h"

#include <grpcpp/grpcpp.h>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/proto/json.h"
#include "moeplan/v1/service.grpc.pb.h"

namespace moeplan::client {

struct PlannerClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Planner::Stub> stub;
};

namespace {

// gRPC's retry policy (A6): the idempotent methods, while UNAVAILABLE.
constexpr char kServiceConfig[] = R"({
  "methodConfig": [{
    "name": [
      {"service": "moeplan.v1.Planner", "method": "PlanLayer"},
      {"service": "moeplan.v1.Planner", "method": "PlanModel"},
      {"service": "moeplan.v1.Planner", "method": "ListProfiles"},
      {"service": "moeplan.v1.Planner", "method": "GetProfile"},
      {"service": "moeplan.v1.Planner", "method": "PutProfile"}
    ],
    "retryPolicy": {
      "maxAttempts": 5,
      "initialBackoff": "1s",
      "maxBackoff": "4s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
})";

std::shared_ptr<grpc::Channel> MakeChannel(const ClientOptions& o,
                                           std::shared_ptr<grpc::ChannelCredentials> creds) {
  grpc::ChannelArguments args;
  args.SetServiceConfigJSON(kServiceConfig);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  // Reconnect soon after a server comes back (gRPC's default waits 1 s, then
  // longer), so that the retries above find it.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<size_t>(o.max_message_bytes, std::numeric_limits<int>::max())));
  return grpc::CreateCustomChannel(o.address, creds, args);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PlannerClient>> PlannerClient::Connect(
    const ClientOptions& options) {
  std::unique_ptr<PlannerClient> c(new PlannerClient());
  c->options_ = options;
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = proto::ReadFile(options.tls_ca_file, 1 << 20);
    if (!ca.ok()) {
      return absl::InvalidArgumentError(Cat("--tls-ca: ", View(ca.status().message())));
    }
    if (ca->find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
      return absl::InvalidArgumentError(
          Cat("--tls-ca: ", options.tls_ca_file, " holds no PEM certificate"));
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *ca;
    creds = grpc::SslCredentials(ssl);
  }
  if (!options.token_file.empty()) {
    MOEPLAN_ASSIGN_OR_RETURN(std::string token, proto::ReadTokenFile(options.token_file));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          Cat("--token-file: ", options.token_file, " holds no token on its first line"));
    }
    c->authorization_ = Cat("Bearer ", token);
  }
  c->impl_ = std::make_unique<Impl>();
  c->impl_->channel = MakeChannel(options, creds);
  c->impl_->stub = v1::Planner::NewStub(c->impl_->channel);
  return c;
}

PlannerClient::PlannerClient(const std::string& address, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  options_.address = address;
  options_.timeout = timeout;
  impl_->channel = MakeChannel(options_, grpc::InsecureChannelCredentials());
  impl_->stub = v1::Planner::NewStub(impl_->channel);
}

PlannerClient::~PlannerClient() = default;

template <class Response, class Call>
absl::StatusOr<Response> PlannerClient::Invoke(Call call) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + options_.timeout);
  if (!authorization_.empty()) ctx.AddMetadata("authorization", authorization_);
  Response response;
  const grpc::Status s = call(&ctx, &response);
  if (s.ok()) return response;
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(code, Cat("server ", options_.address, ": ", s.error_message()));
  }
  return absl::Status(code, s.error_message());
}

absl::StatusOr<v1::PlanLayerResponse> PlannerClient::PlanLayer(
    const v1::PlanLayerRequest& request) {
  return Invoke<v1::PlanLayerResponse>(
      [&](auto* ctx, auto* resp) { return impl_->stub->PlanLayer(ctx, request, resp); });
}

absl::StatusOr<v1::PlanModelResponse> PlannerClient::PlanModel(
    const v1::PlanModelRequest& request) {
  return Invoke<v1::PlanModelResponse>(
      [&](auto* ctx, auto* resp) { return impl_->stub->PlanModel(ctx, request, resp); });
}

absl::StatusOr<v1::ListProfilesResponse> PlannerClient::ListProfiles() {
  return Invoke<v1::ListProfilesResponse>([&](auto* ctx, auto* resp) {
    return impl_->stub->ListProfiles(ctx, v1::ListProfilesRequest(), resp);
  });
}

absl::StatusOr<v1::ClusterProfile> PlannerClient::GetProfile(const std::string& name) {
  v1::GetProfileRequest request;
  request.set_name(name);
  return Invoke<v1::ClusterProfile>(
      [&](auto* ctx, auto* resp) { return impl_->stub->GetProfile(ctx, request, resp); });
}

absl::StatusOr<v1::PutProfileResponse> PlannerClient::PutProfile(
    const v1::ClusterProfile& profile) {
  v1::PutProfileRequest request;
  *request.mutable_profile() = profile;
  return Invoke<v1::PutProfileResponse>(
      [&](auto* ctx, auto* resp) { return impl_->stub->PutProfile(ctx, request, resp); });
}

absl::StatusOr<v1::ReportMeasurementResponse> PlannerClient::ReportMeasurement(
    const v1::ReportMeasurementRequest& request) {
  return Invoke<v1::ReportMeasurementResponse>(
      [&](auto* ctx, auto* resp) { return impl_->stub->ReportMeasurement(ctx, request, resp); });
}

absl::StatusOr<v1::RefitProfileResponse> PlannerClient::RefitProfile(
    const v1::RefitProfileRequest& request) {
  return Invoke<v1::RefitProfileResponse>(
      [&](auto* ctx, auto* resp) { return impl_->stub->RefitProfile(ctx, request, resp); });
}

}  // namespace moeplan::client
