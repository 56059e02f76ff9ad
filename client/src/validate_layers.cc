// `moeplan validate --layers`: a grid of MoE layer configs, each run by
// moeplan-exec with every schedule its layout allows (validate_subject.h).
#include <fmt/format.h>

#include <iterator>
#include <utility>
#include <vector>

#include "cli_util.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"
#include "moeplan/requests/replay.h"
#include "moeplan/v1/exec.pb.h"
#include "moeplan/v1/layer.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "validate_subject.h"

namespace moeplan::client {
namespace {

namespace p = ::moeplan::planner;

std::string ConfigName(size_t i, const v1::LayerConfig& l) {
  return fmt::format(
      "grid[{}] B={} L={} M={} H={} E={} k={} {} mp={} ep={} esp={}", i, l.batch_size(),
      l.seq_len(), l.model_dim(), l.hidden_dim(), l.num_experts(), l.top_k(),
      l.dropless() ? std::string("dropless") : fmt::format("f={:g}", l.capacity_factor()),
      l.parallel().mp(), l.parallel().ep(), l.parallel().esp());
}

// PrintTimes of the schedules.
void PrintScheduleTimes(const calibration::ValidationInput& in) {
  std::vector<CandidateTimes> times;
  for (const v1::CandidatePlan& m : in.measured) {
    for (const v1::CandidatePlan& pr : in.predicted) {
      if (pr.schedule() == m.schedule()) {
        times.push_back(
            {std::string(proto::ScheduleLabel(m.schedule())), m.total_us(), pr.total_us()});
      }
    }
  }
  PrintTimes(times, in);
}

// Each measured schedule's op durations replayed on its plan: the one the
// prediction made, or, for a schedule the prediction folded into another
// (S1 and S2 at mp = 1 are planned as the default), that schedule planned
// alone (in->replays); with the machine drift against `reference_gflops`
// (AddDrift) on the plan the prediction came from.
absl::Status Replay(const p::LayerConfig& layer, const p::CostModel& cost, const p::LayerPlan& plan,
                    double reference_gflops, calibration::ValidationInput* in) {
  for (const v1::CandidatePlan& c : in->measured) {
    const std::string_view label = proto::ScheduleLabel(c.schedule());
    absl::StatusOr<p::Schedule> schedule = proto::ScheduleFromProto(c.schedule());
    const p::Candidate* planned = schedule.ok() ? plan.Find(*schedule) : nullptr;
    const std::vector<requests::MeasuredOpTime> times = requests::MeasuredTimes(c.ops());
    absl::StatusOr<v1::Replay> r =
        !schedule.ok() ? absl::StatusOr<v1::Replay>(schedule.status())
        : planned != nullptr
            ? requests::ReplayOnGraph(planned->graph(), times, c.total_us())
            : requests::ReplayLayerRun(layer, *schedule, times, c.total_us(), cost);
    if (!r.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("its {} run does not replay: {}", label, View(r.status().message())));
    }
    in->replays.push_back({std::string(label), *std::move(r)});
    // A folded schedule's prediction is the default's.
    const p::Candidate* predicted = planned != nullptr ? planned : plan.Find(p::Schedule::kDefault);
    if (predicted != nullptr) {
      MOEPLAN_RETURN_IF_ERROR(
          AddDrift(*in, reference_gflops, predicted->graph(), &in->replays.back()));
    }
  }
  return absl::OkStatus();
}

class Layers final : public ValidationSubject {
 public:
  Layers(v1::LayerGrid grid, std::vector<v1::LayerConfig> configs)
      : grid_(std::move(grid)), configs_(std::move(configs)) {}

  size_t size() const override { return configs_.size(); }
  std::string grid_name() const override { return grid_.name(); }
  std::string_view noun() const override { return "layer config"; }
  std::string Name(size_t i) const override { return ConfigName(i, configs_[i]); }
  absl::StatusOr<std::string> ConfigJson(size_t i) const override {
    return proto::ToJson(configs_[i]);
  }
  std::string ExecArgs(size_t /*i*/, std::string_view config_file) const override {
    return Cat("--layer ", ShellQuote(std::string(config_file)), " --schedule all");
  }

  absl::StatusOr<Measured> Parse(size_t i, const std::string& json) const override {
    v1::ExecReport report;
    MOEPLAN_RETURN_IF_ERROR(proto::ParseJson(json, &report));
    if (ConfigName(i, report.layer()) != Name(i)) {
      return absl::FailedPreconditionError(
          fmt::format("the report is of {}, not of {}", ConfigName(i, report.layer()), Name(i)));
    }
    Measured m;
    m.hosts = report.hosts();
    m.input.name = Name(i);
    m.input.layer = report.layer();
    m.input.measured.assign(report.candidates().begin(), report.candidates().end());
    m.input.iterations.assign(report.iterations().begin(), report.iterations().end());
    m.input.paired = report.interleaved();
    m.input.mpi_wait = report.mpi_wait();
    m.input.host_cores = report.host_cores();
    return m;
  }

  // The planner on what ran: the executor's element size, its schedules. A
  // layout the planner rejects skips the config.
  absl::StatusOr<ConfigRun> Predict(calibration::ValidationInput in,
                                    const calibration::LoadedProfile& profile,
                                    const p::CostModel& cost, bool replay) const override {
    MOEPLAN_ASSIGN_OR_RETURN(p::LayerConfig ran_layer, proto::LayerFromProto(in.layer));
    v1::PlanLayerRequest request;
    request.set_profile_name(profile.message.name());
    request.set_include_timeline(true);
    for (const v1::CandidatePlan& c : in.measured) request.add_schedules(c.schedule());
    v1::PlanLayerResponse predicted;
    p::LayerPlanner planner(cost);
    p::LayerPlan plan;
    absl::Status s =
        requests::AnswerPlanLayer(ran_layer, request, planner, profile.profile, &predicted, &plan);
    if (!s.ok()) {
      return ConfigRun{std::nullopt,
                       fmt::format("{}: the planner rejects it: {}", in.name, View(s.message()))};
    }
    in.predicted.assign(predicted.candidates().begin(), predicted.candidates().end());
    if (replay) {
      if (absl::Status r =
              Replay(ran_layer, cost, plan, profile.message.provenance().probe_gflops(), &in);
          !r.ok()) {
        return ConfigRun{std::nullopt, fmt::format("{}: {}", in.name, View(r.message()))};
      }
    }
    PrintScheduleTimes(in);
    return ConfigRun{std::move(in), ""};
  }

  std::string Layout(const calibration::ValidationInput& in) const override {
    const v1::ParallelLayout& par = in.layer.parallel();
    return fmt::format("{}/{}/{}", par.mp(), par.ep(), par.esp());
  }

 private:
  v1::LayerGrid grid_;
  std::vector<v1::LayerConfig> configs_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ValidationSubject>> LayerSubject(const std::string& path) {
  v1::LayerGrid grid;
  MOEPLAN_ASSIGN_OR_RETURN(std::vector<v1::LayerConfig> configs, ReadGrid(path, &grid));
  return std::make_unique<Layers>(std::move(grid), std::move(configs));
}

}  // namespace moeplan::client
