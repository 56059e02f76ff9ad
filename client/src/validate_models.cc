// `moeplan validate --models`: a grid of whole models, each run by
// moeplan-exec --model with every overlap variant (validate_subject.h). What
// ran is the plan moeplan-exec's planner chose on the same profile; the
// prediction plans each variant again here, pinned to the schedule, AlltoAll
// algorithm and Tutel degree that ran (proto::PinnedModelRequest), and checks
// it is the same plan (a
// refitted profile may choose other partitions or dW placements: such a plan
// was never measured, so the config is skipped rather than compared).
#include <fmt/format.h>

#include <iterator>
#include <utility>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/model.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/v1/exec.pb.h"
#include "moeplan/v1/model.pb.h"
#include "validate_subject.h"

namespace moeplan::client {
namespace {

namespace p = ::moeplan::planner;

std::string ConfigName(size_t i, const v1::ModelConfig& m) {
  return fmt::format("models[{}] {} blocks={} M={} E={} k={} mp={} ep={} esp={} dp={}", i, m.name(),
                     m.num_layers(), m.hidden_size(), m.moe().num_experts(), m.moe().top_k(),
                     m.parallel().mp(), m.parallel().ep(), m.parallel().esp(), m.parallel().dp());
}

// "moeplan validate:   none 12.1/10.3 ms ... (measured/predicted)" on stderr.
void PrintTimes(const calibration::ValidationInput& in) {
  std::string line = "moeplan validate:  ";
  for (const v1::VariantPlan& m : in.measured_variants) {
    for (const v1::VariantPlan& pr : in.predicted_variants) {
      if (pr.name() != m.name()) continue;
      fmt::format_to(std::back_inserter(line), " {} {:.1f}/{:.1f} ms", m.name(),
                     m.iteration_us() / 1e3, pr.iteration_us() / 1e3);
    }
  }
  fmt::print(stderr, "{} (measured/predicted)\n", line);
}

class Models final : public ValidationSubject {
 public:
  explicit Models(v1::ModelGrid grid) : grid_(std::move(grid)) {}

  size_t size() const override { return static_cast<size_t>(grid_.models_size()); }
  std::string grid_name() const override { return grid_.name(); }
  std::string_view noun() const override { return "model"; }
  std::string Name(size_t i) const override { return ConfigName(i, Model(i)); }
  absl::StatusOr<std::string> ConfigJson(size_t i) const override {
    return proto::ToJson(Model(i));
  }
  std::string ExecArgs(std::string_view config_file) const override {
    return Cat("--model ", ShellQuote(std::string(config_file)), " --variant all");
  }

  absl::StatusOr<Measured> Parse(size_t i, const std::string& json) const override {
    v1::ExecModelReport report;
    MOEPLAN_RETURN_IF_ERROR(proto::ParseJson(json, &report));
    if (ConfigName(i, report.model()) != Name(i)) {
      return absl::FailedPreconditionError(
          fmt::format("the report is of {}, not of {}", ConfigName(i, report.model()), Name(i)));
    }
    if (report.measured().variants_size() != report.predicted().variants_size()) {
      return absl::InvalidArgumentError(
          fmt::format("the report has {} measured variants and {} plans",
                      report.measured().variants_size(), report.predicted().variants_size()));
    }
    Measured m;
    m.hosts = report.hosts();
    m.input.name = Name(i);
    m.input.model = report.model();
    m.input.measured_variants.assign(report.measured().variants().begin(),
                                     report.measured().variants().end());
    // The plans that ran: Predict checks its own against them.
    m.input.predicted_variants.assign(report.predicted().variants().begin(),
                                      report.predicted().variants().end());
    m.input.variant_iterations.assign(report.iterations().begin(), report.iterations().end());
    m.input.paired = report.interleaved();
    return m;
  }

  absl::StatusOr<ConfigRun> Predict(calibration::ValidationInput in,
                                    const calibration::LoadedProfile& profile,
                                    const p::CostModel& cost) const override {
    MOEPLAN_ASSIGN_OR_RETURN(const p::ModelConfig model, proto::ModelFromProto(in.model));
    std::vector<v1::VariantPlan> predicted;
    p::ModelPlanner planner(cost);
    for (const v1::VariantPlan& ran : in.predicted_variants) {
      const auto skip = [&](std::string why) {
        return ConfigRun{std::nullopt, fmt::format("{}: {}", in.name, why)};
      };
      absl::StatusOr<v1::PlanModelRequest> request = proto::PinnedModelRequest(in.model, ran);
      if (!request.ok()) return skip(std::string(View(request.status().message())));
      request->set_include_timeline(true);
      v1::PlanModelResponse response;
      if (absl::Status s =
              proto::AnswerPlanModel(model, *request, planner, profile.profile, &response);
          !s.ok()) {
        return skip(
            fmt::format("the planner rejects its {} plan: {}", ran.name(), View(s.message())));
      }
      v1::VariantPlan& mine = *response.mutable_variants(0);
      if (const std::string diff = proto::PlanDifference(ran, mine); !diff.empty()) {
        return skip(fmt::format(
            "profile {} plans another {} than ran ({}): measure it again with this profile "
            "rather than re-predicting",
            profile.message.name(), ran.name(), diff));
      }
      predicted.push_back(std::move(mine));
    }
    in.predicted_variants = std::move(predicted);
    PrintTimes(in);
    return ConfigRun{std::move(in), ""};
  }

  std::string Layout(const calibration::ValidationInput& in) const override {
    const v1::ParallelLayout& par = in.model.parallel();
    return fmt::format("{}/{}/{}/{}", par.mp(), par.ep(), par.esp(), par.dp());
  }

 private:
  const v1::ModelConfig& Model(size_t i) const { return grid_.models(static_cast<int>(i)); }

  v1::ModelGrid grid_;
};

// The grid's own rules: at least one model, each converts, names set and
// distinct (they name the configs and the files).
absl::Status CheckGrid(const v1::ModelGrid& grid) {
  if (grid.schema_version() > 1) {
    return absl::InvalidArgumentError(
        Cat("schema_version: must be 1 (or unset) (got ", grid.schema_version(), ")"));
  }
  if (grid.models().empty()) return absl::InvalidArgumentError("models: must list a model");
  for (int i = 0; i < grid.models_size(); ++i) {
    const v1::ModelConfig& m = grid.models(i);
    absl::StatusOr<p::ModelConfig> c = proto::ModelFromProto(m);
    absl::Status shape = c.ok() ? p::ValidateModelShape(*c) : c.status();
    if (!shape.ok()) {
      return absl::InvalidArgumentError(Cat("models[", i, "].", View(shape.message())));
    }
    if (m.name().empty())
      return absl::InvalidArgumentError(Cat("models[", i, "].name: must be set"));
    for (int j = 0; j < i; ++j) {
      if (grid.models(j).name() == m.name()) {
        return absl::InvalidArgumentError(
            Cat("models[", i, "].name: '", m.name(), "' is also models[", j, "]'s name"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ValidationSubject>> ModelSubject(const std::string& path) {
  v1::ModelGrid grid;
  MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(path, &grid));
  if (absl::Status s = CheckGrid(grid); !s.ok()) {
    return absl::InvalidArgumentError(Cat(path, ": ", View(s.message())));
  }
  return std::make_unique<Models>(std::move(grid));
}

}  // namespace moeplan::client
