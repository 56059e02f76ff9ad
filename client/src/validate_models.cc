// `moeplan validate --models`: a grid of whole models, each run by
// moeplan-exec --model with every overlap variant (validate_subject.h), and
// its pipelined layouts, each run with --layout (its program). What
// ran is the plan moeplan-exec's planner chose on the same profile; the
// prediction plans each variant again here, pinned to the schedule, AlltoAll
// algorithm and Tutel degree that ran (proto::PinnedModelRequest), and checks
// it is the same plan (a
// refitted profile may choose other partitions or dW placements: such a plan
// was never measured, so the config is skipped rather than compared).
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"
#include "moeplan/requests/replan.h"
#include "moeplan/requests/replay.h"
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

// A layout as the executor resolves it (microbatches 0: pp; one stage:
// 1f1b), written the --layout way: what a grid entry and a report are
// matched by.
absl::StatusOr<std::string> CanonicalLayout(const v1::Layout& msg) {
  MOEPLAN_ASSIGN_OR_RETURN(const p::Layout parsed, proto::LayoutFromProto(msg));
  const p::Layout l = p::ResolveLayout(parsed);
  return fmt::format(
      "dp={},tp={},pp={},ep={},esp={},microbatches={},zero={},family={},pipeline={}{}{}{}{}{}",
      l.dp, l.tp, l.pp, l.ep, l.esp, l.microbatches, l.zero_stage, p::FamilyName(l.family),
      p::PipelineScheduleName(l.pipeline),
      l.virtual_stages > 1 ? fmt::format(",v={}", l.virtual_stages) : "",
      l.sequence_parallel ? ",sp=1" : "", l.cp > 1 ? fmt::format(",cp={}", l.cp) : "",
      l.a2a_overlap ? ",a2a_overlap=1" : "",
      l.dispatcher == p::Dispatcher::kAllToAll
          ? ""
          : fmt::format(",dispatcher={}", p::DispatcherName(l.dispatcher)));
}

absl::StatusOr<std::string> CanonicalSpec(std::string_view spec) {
  MOEPLAN_ASSIGN_OR_RETURN(const v1::Layout msg, proto::LayoutFromSpec(spec));
  return CanonicalLayout(msg);
}

// PrintTimes of the variants.
void PrintVariantTimes(const calibration::ValidationInput& in) {
  std::vector<CandidateTimes> times;
  for (const v1::VariantPlan& m : in.measured_variants) {
    for (const v1::VariantPlan& pr : in.predicted_variants) {
      if (pr.name() == m.name()) times.push_back({m.name(), m.iteration_us(), pr.iteration_us()});
    }
  }
  PrintTimes(times, in);
}

// Why `mine`, what `profile` plans again of the `ran` variant, cannot stand
// for it (a plan never measured); empty when it is the plan that ran.
std::string NotWhatRan(const calibration::LoadedProfile& profile, const v1::VariantPlan& ran,
                       const v1::VariantPlan& mine, std::string_view what) {
  const std::string diff = requests::PlanDifference(ran, mine);
  if (diff.empty()) return diff;
  return fmt::format(
      "profile {} plans another {} {} than ran ({}): measure it again with this profile rather "
      "than re-predicting",
      profile.message.name(), ran.name(), what, diff);
}

// The measured variant `name` of `in`, or null.
const v1::VariantPlan* MeasuredVariant(const calibration::ValidationInput& in,
                                       std::string_view name) {
  for (const v1::VariantPlan& v : in.measured_variants) {
    if (v.name() == name) return &v;
  }
  return nullptr;
}

// Replays the measured variant `name` on the plan `plan` predicted (its one
// variant) into in->replays, with the machine drift against
// `reference_gflops` (AddDrift); the reason when it does not.
absl::Status AddReplay(std::string_view name, const p::ModelPlan& plan, double reference_gflops,
                       calibration::ValidationInput* in) {
  const v1::VariantPlan* m = MeasuredVariant(*in, name);
  if (m == nullptr) return absl::OkStatus();  // planned, not measured: nothing to replay
  if (plan.variants.size() != 1) {
    return absl::InternalError("the prediction planned other than one variant");
  }
  const p::OpGraph& graph = plan.variants[0].graph;
  absl::StatusOr<v1::Replay> r =
      requests::ReplayOnGraph(graph, requests::MeasuredTimes(m->ops()), m->iteration_us());
  if (!r.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("its {} run does not replay: {}", name, View(r.status().message())));
  }
  in->replays.push_back({std::string(name), *std::move(r)});
  return AddDrift(*in, reference_gflops, graph, &in->replays.back());
}

ConfigRun Predicted(calibration::ValidationInput in, std::vector<v1::VariantPlan> predicted) {
  in.predicted_variants = std::move(predicted);
  PrintVariantTimes(in);
  return ConfigRun{std::move(in), ""};
}

class Models final : public ValidationSubject {
 public:
  explicit Models(v1::ModelGrid grid) : grid_(std::move(grid)) {}

  // The models, then the layouts (config models_size() + j is layouts[j]).
  size_t size() const override {
    return static_cast<size_t>(grid_.models_size() + grid_.layouts_size());
  }
  std::string grid_name() const override { return grid_.name(); }
  std::string_view noun() const override { return "model"; }
  std::string Name(size_t i) const override {
    const v1::LayoutRun* run = Run(i);
    if (run == nullptr) return ConfigName(i, Model(i));
    return fmt::format("layouts[{}] {} {}", i - static_cast<size_t>(grid_.models_size()),
                       run->model(), run->layout());
  }
  absl::StatusOr<std::string> ConfigJson(size_t i) const override {
    return proto::ToJson(Model(i));
  }
  std::string ExecArgs(size_t i, std::string_view config_file) const override {
    std::string args = Cat("--model ", ShellQuote(std::string(config_file)), " --variant all");
    if (i == kAnyConfig) {
      if (grid_.layouts_size() > 0) args += " [--layout LAYOUT]";
    } else if (const v1::LayoutRun* run = Run(i); run != nullptr) {
      args += Cat(" --layout ", ShellQuote(run->layout()));
    }
    return args;
  }

  absl::StatusOr<Measured> Parse(size_t i, const std::string& json) const override {
    v1::ExecModelReport report;
    MOEPLAN_RETURN_IF_ERROR(proto::ParseJson(json, &report));
    if (const v1::LayoutRun* run = Run(i); run != nullptr) {
      // A layout's report: its model as each stage ran it, and the layout.
      MOEPLAN_ASSIGN_OR_RETURN(const std::string want, CanonicalSpec(run->layout()));
      absl::StatusOr<std::string> got = report.has_layout()
                                            ? CanonicalLayout(report.layout())
                                            : absl::StatusOr<std::string>("no layout");
      if (report.model().name() != run->model() || !got.ok() || *got != want) {
        return absl::FailedPreconditionError(fmt::format(
            "the report is of {} {}, not of {} {}", report.model().name(),
            got.ok() ? *got : std::string(View(got.status().message())), run->model(), want));
      }
    } else if (ConfigName(i, report.model()) != Name(i) || report.has_layout()) {
      return absl::FailedPreconditionError(
          fmt::format("the report is of {}{}, not of {}", ConfigName(i, report.model()),
                      report.has_layout() ? " run as a layout" : "", Name(i)));
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
    if (report.has_layout()) m.input.layout = report.layout();
    m.input.measured_variants.assign(report.measured().variants().begin(),
                                     report.measured().variants().end());
    // The plans that ran: Predict checks its own against them.
    m.input.predicted_variants.assign(report.predicted().variants().begin(),
                                      report.predicted().variants().end());
    m.input.variant_iterations.assign(report.iterations().begin(), report.iterations().end());
    m.input.paired = report.interleaved();
    m.input.mpi_wait = report.mpi_wait();
    m.input.host_cores = report.host_cores();
    return m;
  }

  absl::StatusOr<ConfigRun> Predict(calibration::ValidationInput in,
                                    const calibration::LoadedProfile& profile,
                                    const p::CostModel& cost, bool replay) const override {
    MOEPLAN_ASSIGN_OR_RETURN(const p::ModelConfig model, proto::ModelFromProto(in.model));
    if (in.layout.has_value()) return PredictLayout(std::move(in), model, profile, cost, replay);
    std::vector<v1::VariantPlan> predicted;
    p::ModelPlanner planner(cost);
    for (const v1::VariantPlan& ran : in.predicted_variants) {
      const auto skip = [&](std::string why) {
        return ConfigRun{std::nullopt, fmt::format("{}: {}", in.name, why)};
      };
      absl::StatusOr<v1::PlanModelRequest> request = requests::PinnedModelRequest(in.model, ran);
      if (!request.ok()) return skip(std::string(View(request.status().message())));
      request->set_include_timeline(true);
      v1::PlanModelResponse response;
      p::ModelPlan plan;
      if (absl::Status s = requests::AnswerPlanModel(model, *request, planner, profile.profile,
                                                     &response, {}, &plan);
          !s.ok()) {
        return skip(
            fmt::format("the planner rejects its {} plan: {}", ran.name(), View(s.message())));
      }
      v1::VariantPlan& mine = *response.mutable_variants(0);
      if (std::string why = NotWhatRan(profile, ran, mine, "plan"); !why.empty()) return skip(why);
      if (replay) {
        absl::Status r =
            AddReplay(ran.name(), plan, profile.message.provenance().probe_gflops(), &in);
        if (!r.ok()) return skip(std::string(View(r.message())));
      }
      predicted.push_back(std::move(mine));
    }
    return Predicted(std::move(in), std::move(predicted));
  }

  std::string Layout(const calibration::ValidationInput& in) const override {
    if (in.layout.has_value()) {
      absl::StatusOr<std::string> l = CanonicalLayout(*in.layout);
      return l.ok() ? *l : "layout";
    }
    const v1::ParallelLayout& par = in.model.parallel();
    return fmt::format("{}/{}/{}/{}", par.mp(), par.ep(), par.esp(), par.dp());
  }

 private:
  // Config i's layout run, or null for a model of its own.
  const v1::LayoutRun* Run(size_t i) const {
    const size_t models = static_cast<size_t>(grid_.models_size());
    return i < models ? nullptr : &grid_.layouts(static_cast<int>(i - models));
  }
  const v1::ModelConfig& Model(size_t i) const {
    const v1::LayoutRun* run = Run(i);
    if (run == nullptr) return grid_.models(static_cast<int>(i));
    for (const v1::ModelConfig& m : grid_.models()) {
      if (m.name() == run->model()) return m;
    }
    return grid_.models(0);  // CheckGrid: every layout names a model
  }

  // A layout's program, every variant planned again as it ran (the layout
  // and the variant pinned, the linear AlltoAll) and checked to be the
  // program that ran.
  absl::StatusOr<ConfigRun> PredictLayout(calibration::ValidationInput in,
                                          const p::ModelConfig& model,
                                          const calibration::LoadedProfile& profile,
                                          const p::CostModel& cost, bool replay) const {
    MOEPLAN_ASSIGN_OR_RETURN(const p::Layout layout, proto::LayoutFromProto(*in.layout));
    p::LayoutPlanner planner(cost);
    std::vector<v1::VariantPlan> predicted;
    for (const v1::VariantPlan& ran : in.predicted_variants) {
      const auto skip = [&](std::string why) {
        return ConfigRun{std::nullopt, fmt::format("{}: {}", in.name, why)};
      };
      p::ModelPlanOptions o;
      if (!p::ParseVariant(ran.name(), &o.variants.emplace_back())) {
        return skip(fmt::format("its report names variant '{}'", ran.name()));
      }
      o.algos = {p::AllToAllAlgo::kLinear};
      p::ModelPlan plan;
      plan.moe_layers = model.NumMoeLayers();
      if (absl::Status s = planner.Program(model, layout, o, &plan.variants.emplace_back());
          !s.ok()) {
        return skip(
            fmt::format("the planner rejects its {} program: {}", ran.name(), View(s.message())));
      }
      v1::PlanModelResponse response;
      proto::ModelPlanToProto(plan, model, profile.profile, /*include_timeline=*/true, &response);
      v1::VariantPlan& mine = *response.mutable_variants(0);
      if (std::string why = NotWhatRan(profile, ran, mine, "program"); !why.empty()) {
        return skip(why);
      }
      if (replay) {
        absl::Status r =
            AddReplay(ran.name(), plan, profile.message.provenance().probe_gflops(), &in);
        if (!r.ok()) return skip(std::string(View(r.message())));
      }
      predicted.push_back(std::move(mine));
    }
    return Predicted(std::move(in), std::move(predicted));
  }

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
  std::vector<std::pair<std::string, std::string>> seen;
  for (int i = 0; i < grid.layouts_size(); ++i) {
    const v1::LayoutRun& run = grid.layouts(i);
    if (std::none_of(grid.models().begin(), grid.models().end(),
                     [&](const v1::ModelConfig& m) { return m.name() == run.model(); })) {
      return absl::InvalidArgumentError(
          Cat("layouts[", i, "].model: '", run.model(), "' is not the name of one of models"));
    }
    absl::StatusOr<std::string> canonical = CanonicalSpec(run.layout());
    if (!canonical.ok()) {
      return absl::InvalidArgumentError(
          Cat("layouts[", i, "].layout: ", View(canonical.status().message())));
    }
    for (size_t j = 0; j < seen.size(); ++j) {
      if (seen[j] == std::make_pair(run.model(), *canonical)) {
        return absl::InvalidArgumentError(
            Cat("layouts[", i, "]: '", run.model(), "' ", *canonical, " is also layouts[", j, "]"));
      }
    }
    seen.emplace_back(run.model(), *canonical);
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
