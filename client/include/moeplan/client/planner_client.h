// moeplan::client::PlannerClient: a synchronous C++ client of moeplan.v1.Planner
// for launchers and the CLI. gRPC stays out of this header. Errors are the
// server's status (same code, same one-line message naming the field); a server
// that cannot be reached is Unavailable naming the address.
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

class PlannerClient {
 public:
  // `address` is host:port (or unix:PATH). Every call gets `timeout` as deadline.
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

  const std::string& address() const { return address_; }

 private:
  struct Impl;
  std::string address_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::client
