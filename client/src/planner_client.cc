#include "moeplan/client/planner_client.h"

#include <grpcpp/grpcpp.h>

#include "moeplan/base/strings.h"
#include "moeplan/v1/service.grpc.pb.h"

namespace moeplan::client {

struct PlannerClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Planner::Stub> stub;
};

PlannerClient::PlannerClient(const std::string& address, std::chrono::milliseconds timeout)
    : address_(address), timeout_(timeout), impl_(std::make_unique<Impl>()) {
  impl_->channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  impl_->stub = v1::Planner::NewStub(impl_->channel);
}

PlannerClient::~PlannerClient() = default;

namespace {

template <class Response, class Call>
absl::StatusOr<Response> Invoke(const std::string& address, std::chrono::milliseconds timeout,
                                Call call) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  Response response;
  const grpc::Status s = call(&ctx, &response);
  if (s.ok()) return response;
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(code, Cat("server ", address, ": ", s.error_message()));
  }
  return absl::Status(code, s.error_message());
}

}  // namespace

absl::StatusOr<v1::PlanLayerResponse> PlannerClient::PlanLayer(
    const v1::PlanLayerRequest& request) {
  return Invoke<v1::PlanLayerResponse>(address_, timeout_, [&](auto* ctx, auto* resp) {
    return impl_->stub->PlanLayer(ctx, request, resp);
  });
}

absl::StatusOr<v1::PlanModelResponse> PlannerClient::PlanModel(
    const v1::PlanModelRequest& request) {
  return Invoke<v1::PlanModelResponse>(address_, timeout_, [&](auto* ctx, auto* resp) {
    return impl_->stub->PlanModel(ctx, request, resp);
  });
}

absl::StatusOr<v1::ListProfilesResponse> PlannerClient::ListProfiles() {
  return Invoke<v1::ListProfilesResponse>(address_, timeout_, [&](auto* ctx, auto* resp) {
    return impl_->stub->ListProfiles(ctx, v1::ListProfilesRequest(), resp);
  });
}

absl::StatusOr<v1::ClusterProfile> PlannerClient::GetProfile(const std::string& name) {
  v1::GetProfileRequest request;
  request.set_name(name);
  return Invoke<v1::ClusterProfile>(address_, timeout_, [&](auto* ctx, auto* resp) {
    return impl_->stub->GetProfile(ctx, request, resp);
  });
}

absl::StatusOr<v1::PutProfileResponse> PlannerClient::PutProfile(
    const v1::ClusterProfile& profile) {
  v1::PutProfileRequest request;
  *request.mutable_profile() = profile;
  return Invoke<v1::PutProfileResponse>(address_, timeout_, [&](auto* ctx, auto* resp) {
    return impl_->stub->PutProfile(ctx, request, resp);
  });
}

absl::StatusOr<v1::ReportMeasurementResponse> PlannerClient::ReportMeasurement(
    const v1::ReportMeasurementRequest& request) {
  return Invoke<v1::ReportMeasurementResponse>(address_, timeout_, [&](auto* ctx, auto* resp) {
    return impl_->stub->ReportMeasurement(ctx, request, resp);
  });
}

}  // namespace moeplan::client
