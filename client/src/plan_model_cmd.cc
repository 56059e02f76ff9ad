// `moeplan plan-model`: a whole model planned locally or on a moeplan-server
// (docs/model.md), printed the same way either way (report.h).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli_util.h"
#include "commands.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/client/html_report.h"
#include "moeplan/client/planner_client.h"
#include "moeplan/client/report.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"

namespace moeplan::client {

namespace p = ::moeplan::planner;

namespace {

// A model error is said against the file ("FILE: moe.num_experts: ..."); option
// errors name the request's options, which are flags here.
absl::Status InFile(const std::string& path, const absl::Status& s) {
  std::string_view msg = View(s.message());
  if (msg.rfind("model.", 0) == 0) {
    msg.remove_prefix(6);
    return absl::Status(s.code(), Cat(path, ": ", msg));
  }
  static constexpr std::pair<std::string_view, std::string_view> kFlags[] = {
      {"options.schedules", "--schedules"},
      {"options.alltoall_algorithms", "--alltoall"},
      {"options.variants", "--variants"},
      {"options.bucket_bytes", "--bucket-mb"},
      {"options.partition_max_k", "--partition-max-k"},
      {"options.partition_groups", "--partition-groups"},
      {"options.partition_max_span", "--partition-max-span"},
      {"search.top", "--top"},
      {"search.gpus", "--gpus"},
      {"search.families", "--families"},
      {"search.pipelines", "--pipelines"},
      {"search.zero_stages", "--zero-stages"},
      {"search.max_microbatches", "--max-microbatches"},
      {"search.sequence_parallel", "--sequence-parallel"},
      {"search.a2a_overlap", "--a2a-overlap"},
      {"search.dispatchers", "--dispatchers"},
      {"search.balanced_pipeline", "--balanced-pipeline"},
      {"search.context_parallel", "--context-parallel"},
      {"search.expert_tensor_parallel", "--expert-tensor-parallel"},
      {"memory.gpu_memory_gib", "--gpu-memory-gib"},
      {"memory.optimizer_bytes", "--optimizer-bytes"},
      {"memory.grad_bytes", "--grad-bytes"},
  };
  for (const auto& [field, flag] : kFlags) {
    if (msg.rfind(field, 0) == 0) {
      return absl::Status(s.code(), Cat(flag, msg.substr(field.size())));
    }
  }
  return s;
}

absl::StatusOr<v1::ModelPlanOptions> OptionsFromFlags(const PlanModelArgs& a) {
  v1::ModelPlanOptions o;
  MOEPLAN_ASSIGN_OR_RETURN(
      auto variants, ParseNameList<p::Variant>("--variants", "variant", a.variants, p::ParseVariant,
                                               "none, tutel, dw, partition, lancet"));
  for (p::Variant v : variants) o.add_variants(proto::VariantToProto(v));
  MOEPLAN_ASSIGN_OR_RETURN(auto schedules, ParseSchedules(a.schedules));
  for (p::Schedule s : schedules) o.add_schedules(proto::ScheduleToProto(s));
  MOEPLAN_ASSIGN_OR_RETURN(auto algos, ParseNameList<p::AllToAllAlgo>(
                                           "--alltoall", "algorithm", a.alltoall,
                                           p::ParseAllToAllAlgo, "linear, 2dh, deepep, allgather"));
  for (p::AllToAllAlgo x : algos) o.add_alltoall_algorithms(proto::AllToAllAlgoToProto(x));
  // --bucket-mb is finite and in (0, 1048576] (main.cc, flags::FiniteAbove).
  o.set_bucket_bytes(std::max<int64_t>(1, std::llround(a.bucket_mb * 1024.0 * 1024.0)));
  o.set_partition_max_k(a.partition_max_k);
  o.set_partition_groups(a.partition_groups);
  o.set_partition_max_span(a.partition_max_span);
  return o;
}

bool ParseZero(std::string_view name, int* out) {
  if (name.size() != 1 || name[0] < '0' || name[0] > '3') return false;
  *out = name[0] - '0';
  return true;
}

// A parallel degree of a list flag: 1 to 1024.
bool ParseDegree(std::string_view name, int* out) {
  int n = 0;
  const auto [ptr, ec] = std::from_chars(name.data(), name.data() + name.size(), n);
  if (ec != std::errc() || ptr != name.data() + name.size() || n < 1 || n > 1024) return false;
  *out = n;
  return true;
}

bool ParseFamilyName(std::string_view name, std::string* out) {
  p::Family f;
  if (!p::ParseFamily(name, &f)) return false;
  *out = std::string(name);
  return true;
}

bool ParseDispatcherName(std::string_view name, std::string* out) {
  p::Dispatcher d;
  if (!p::ParseDispatcher(name, &d)) return false;
  *out = std::string(name);
  return true;
}

bool ParsePipelineName(std::string_view name, std::string* out) {
  p::PipelineSchedule ps;
  if (!p::ParsePipelineSchedule(name, &ps)) return false;
  *out = std::string(name);
  return true;
}

absl::Status SearchFromFlags(const PlanModelArgs& a, v1::PlanModelRequest* request) {
  v1::MemoryOptions* mem = request->mutable_memory();
  if (a.gpu_memory_gib >= 0.0) mem->set_gpu_memory_gib(a.gpu_memory_gib);
  mem->set_optimizer_bytes(a.optimizer_bytes);
  mem->set_grad_bytes(a.grad_bytes);
  if (!a.layout.empty()) {
    MOEPLAN_ASSIGN_OR_RETURN(*request->mutable_layout(), proto::LayoutFromSpec(a.layout));
    return absl::OkStatus();
  }
  v1::SearchOptions* s = request->mutable_search();
  s->set_top(a.top);
  if (a.gpus > 0) s->set_gpus(a.gpus);
  MOEPLAN_ASSIGN_OR_RETURN(
      auto families, ParseNameList<std::string>("--families", "family", a.families, ParseFamilyName,
                                                "dpmoe, ppmoe, parm"));
  for (const std::string& f : families) s->add_families(f);
  MOEPLAN_ASSIGN_OR_RETURN(
      auto pipelines,
      ParseNameList<std::string>("--pipelines", "pipeline schedule", a.pipelines, ParsePipelineName,
                                 "gpipe, 1f1b, interleaved, dualpipe"));
  for (const std::string& ps : pipelines) s->add_pipelines(ps);
  MOEPLAN_ASSIGN_OR_RETURN(auto zeros, ParseNameList<int>("--zero-stages", "ZeRO stage",
                                                          a.zero_stages, ParseZero, "0, 1, 2, 3"));
  for (int z : zeros) s->add_zero_stages(z);
  if (a.sequence_parallel != "on") s->add_sequence_parallel(false);
  if (a.sequence_parallel != "off") s->add_sequence_parallel(true);
  if (a.a2a_overlap != "on") s->add_a2a_overlap(false);
  if (a.a2a_overlap != "off") s->add_a2a_overlap(true);
  if (a.balanced_pipeline != "on") s->add_balanced_pipeline(false);
  if (a.balanced_pipeline != "off") s->add_balanced_pipeline(true);
  if (a.dispatchers == "all") {
    for (p::Dispatcher d : p::kAllDispatchers)
      s->add_dispatchers(std::string(p::DispatcherName(d)));
  } else {
    MOEPLAN_ASSIGN_OR_RETURN(
        auto dispatchers,
        ParseNameList<std::string>("--dispatchers", "dispatcher", a.dispatchers,
                                   ParseDispatcherName, "alltoall, deepep, allgather"));
    for (const std::string& d : dispatchers) s->add_dispatchers(d);
  }
  for (const auto& [flag, list, field] :
       {std::tuple{"--context-parallel", &a.context_parallel, s->mutable_context_parallel()},
        std::tuple{"--expert-tensor-parallel", &a.expert_tensor_parallel,
                   s->mutable_expert_tensor_parallel()}}) {
    MOEPLAN_ASSIGN_OR_RETURN(auto degrees, ParseNameList<int>(flag, "degree", *list, ParseDegree,
                                                              "1 to 1024, comma-separated,"));
    field->Add(degrees.begin(), degrees.end());
  }
  s->set_max_microbatches(a.max_microbatches);
  s->set_exhaustive(a.exhaustive);
  s->set_overlap_param_gather(a.overlap_param_gather);
  s->set_tp_comm_overlap(a.tp_comm_overlap);
  return absl::OkStatus();
}

}  // namespace

absl::Status PlanModelCmd(const PlanModelArgs& a) {
  MOEPLAN_RETURN_IF_ERROR(RefuseOutputOverInput({{"--trace", a.trace}, {"--html", a.html}},
                                                {{"--model", a.model},
                                                 {"--cluster", a.cluster},
                                                 {"--tls-ca", a.server.tls_ca_file},
                                                 {"--token-file", a.server.token_file}}));
  v1::PlanModelRequest request;
  MOEPLAN_ASSIGN_OR_RETURN(*request.mutable_options(), OptionsFromFlags(a));
  if (a.search || !a.layout.empty()) {
    if (!a.trace.empty()) {
      return absl::InvalidArgumentError(
          "--trace: not available with --search or --layout (it shows one variants plan; run "
          "plan-model without them)");
    }
    MOEPLAN_RETURN_IF_ERROR(SearchFromFlags(a, &request));
    // The report charts every candidate the search enumerated, and draws the
    // pipelines of the first kReportPipelines (--timeline: every one's).
    if (!a.html.empty() && a.search) {
      request.mutable_search()->set_include_points(true);
      if (!a.timeline) request.mutable_search()->set_timeline_top(kReportPipelines);
    }
  }
  MOEPLAN_RETURN_IF_ERROR(LoadModelFile(a.model, a.hf, request.mutable_model()));
  // The report draws the candidates' pipelines.
  request.set_include_timeline(a.timeline || !a.trace.empty() ||
                               (!a.html.empty() && (a.search || !a.layout.empty())));
  v1::PlanModelResponse response;
  v1::ClusterProfile profile_message;
  const std::chrono::duration<double> limit(a.max_plan_seconds);
  if (!a.server.address.empty()) {
    ClientOptions options = a.server;
    options.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(limit);
    MOEPLAN_ASSIGN_OR_RETURN(std::unique_ptr<PlannerClient> connected,
                             PlannerClient::Connect(options));
    PlannerClient& client = *connected;
    if (SendProfileInline(a.cluster)) {
      MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(a.cluster, request.mutable_profile()));
      profile_message = request.profile();
    } else {
      request.set_profile_name(a.cluster);
    }
    absl::StatusOr<v1::PlanModelResponse> r = client.PlanModel(request);
    if (!r.ok()) return InFile(a.model, r.status());
    response = *std::move(r);
    if (!request.has_profile()) {
      MOEPLAN_ASSIGN_OR_RETURN(profile_message, client.GetProfile(a.cluster));
    }
  } else {
    MOEPLAN_ASSIGN_OR_RETURN(calibration::LoadedProfile profile,
                             calibration::LoadProfile(a.cluster));
    MOEPLAN_ASSIGN_OR_RETURN(p::CostModel cost, p::CostModel::Create(profile.profile));
    p::ModelPlanner planner(cost);
    const p::Deadline deadline{
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(limit)};
    absl::Status s =
        requests::AnswerPlanModel(request, planner, profile.profile, &response, deadline);
    if (!s.ok()) return InFile(a.model, s);
    profile_message = std::move(profile.message);
  }
  // Echo the model with defaults filled in (dp, vocab, b) for the table.
  absl::StatusOr<p::ModelConfig> model = proto::ModelFromProto(request.model());
  if (!model.ok()) {
    return absl::Status(model.status().code(), Cat(a.model, ": ", View(model.status().message())));
  }
  const v1::ModelConfig shown = proto::ModelToProto(*model);

  // Everything is computed before anything is written: an error leaves no output.
  v1::PlanModelResponse printed = response;
  printed.clear_search_points();  // asked for by --html, for its chart
  if (!a.timeline) {              // asked for by --html only
    for (v1::VariantPlan& v : *printed.mutable_variants()) v.clear_ops();
    for (v1::LayoutCandidate& c : *printed.mutable_candidates()) c.clear_pipeline();
  }
  std::string text;
  if (a.format == "json") {
    MOEPLAN_ASSIGN_OR_RETURN(std::string json, proto::ToJson(printed));
    text = json + "\n";
  } else if (printed.candidates_size() > 0 || request.has_search()) {
    text = FormatLayoutTable(shown, printed, profile_message);
  } else {
    text = FormatModelTable(shown, printed, profile_message);
  }
  if (!a.trace.empty()) {
    proto::JsonStyle style;
    style.pretty = false;
    style.preserve_proto_field_names = false;  // Chrome's camelCase keys
    MOEPLAN_ASSIGN_OR_RETURN(std::string trace, proto::ToJson(BuildModelTrace(response), style));
    absl::Status s = proto::WriteFileAtomic(a.trace, trace + "\n");
    if (!s.ok()) return absl::Status(s.code(), Cat("--trace: ", View(s.message())));
  }
  if (!a.html.empty()) {
    v1::ModelConfig named = shown;
    named.set_name(request.model().name());
    MOEPLAN_ASSIGN_OR_RETURN(HtmlReport html, PlanModelReport(named, response, profile_message));
    MOEPLAN_RETURN_IF_ERROR(WriteHtmlReport(a.html, html));
  }
  return WriteStdout(text);
}

}  // namespace moeplan::client
