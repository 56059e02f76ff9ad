// moeplan::client::PlannerClient: a synchronous C++ client of moeplan.v1.Planner
// for launchers and the CLI. gRPC stays out of this header. Errors are the
// server's status (same code, same one-line message naming the field); a server
// that cannot be reached is Unavailable naming the address.
//
// Idempotent calls (plans, list, get, and PutProfile, whose retry of an
// acknowledged put is acknowledged again) are retried by gRPC with
// exponential backoff while the server is UNAVAILABLE (restarting): up to 5
// attempts, 1 s doubling to 4 s (jittered: ~5 s in all), within the call's deadline.
// ReportMeasurement appends, so it is not retried.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "moeplan/v1/model.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/v1/service.pb.h"

namespace moeplan::client {

// How to reach a server.
struct ClientOptions {
  std::string address;                                           // host:port or unix:PATH
  std::chrono::milliseconds timeout = std::chrono::seconds(10);  // every call's deadline
  // PEM file of the CA that signed the server's certificate (moeplan-server
  // --tls-cert): the channel is TLS. Empty: plaintext.
  std::string tls_ca_file;
  // File whose first line is the server's bearer token (--token-file), sent as
  // "authorization: Bearer <token>" with every call. Empty: none.
  std::string token_file;
  // Largest response accepted; the server's --max-message-mib default.
  size_t max_message_bytes = size_t{64} << 20;
};

class PlannerClient {
 public:
  // Reads the CA and token files (InvalidArgument naming --tls-ca or
  // --token-file) and opens the channel (connecting lazily, at the first call).
  static absl::StatusOr<std::unique_ptr<PlannerClient>> Connect(const ClientOptions& options);
  // A plaintext channel without a token.
  explicit PlannerClient(const std::string& address,
                         std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~PlannerClient();
  PlannerClient(const PlannerClient&) = delete;
  PlannerClient& operator=(const PlannerClient&) = delete;

  absl::StatusOr<v1::PlanLayerResponse> PlanLayer(const v1::PlanLayerRequest& request);
  absl::StatusOr<v1::PlanModelResponse> PlanModel(const v1::PlanModelRequest& request);
  absl::StatusOr<v1::ListProfilesResponse> ListProfiles();
  absl::StatusOr<v1::ClusterProfile> GetProfile(const std::string& name);
  absl::StatusOr<v1::PutProfileResponse> PutProfile(const v1::ClusterProfile& profile);
  absl::StatusOr<v1::ReportMeasurementResponse> ReportMeasurement(
      const v1::ReportMeasurementRequest& request);
  // Not retried either: a refit that landed would be done twice.
  absl::StatusOr<v1::RefitProfileResponse> RefitProfile(const v1::RefitProfileRequest& request);

  const std::string& address() const { return options_.address; }

 private:
  struct Impl;
  PlannerClient() = default;
  template <class Response, class Call>
  absl::StatusOr<Response> Invoke(Call call);
  ClientOptions options_;
  std::string authorization_;  // "Bearer <token>", or empty
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::client
