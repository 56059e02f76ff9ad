// moeplan validate --published: every case of a dataset of published training
// runs (docs/calibration.md "Published runs") predicted at its layout, no
// execution, and compared in model TFLOP/s per GPU.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/hf_config.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"
#include "moeplan/v1/published.pb.h"

namespace moeplan::client {
namespace {

namespace fs = std::filesystem;
namespace p = planner;

// The dataset's files: PATH itself, or every *.json directly in it, by name.
absl::StatusOr<std::vector<std::string>> CaseFiles(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return std::vector<std::string>{path};
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    if (e.path().extension() == ".json") out.push_back(e.path().string());
  }
  if (ec) return absl::InvalidArgumentError(Cat("--published: ", path, ": ", ec.message()));
  if (out.empty()) {
    return absl::InvalidArgumentError(Cat("--published: ", path, " holds no .json case"));
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status Bad(const std::string& file, std::string_view field, std::string_view rule) {
  return absl::InvalidArgumentError(Cat(file, ": ", field, ": ", rule));
}

// The field rules of one case (the JSON is strict already).
absl::Status CheckCase(const std::string& file, const v1::PublishedRun& r) {
  if (r.schema_version() != 1) {
    return Bad(file, "schema_version", Cat("must be 1 (got ", r.schema_version(), ")"));
  }
  const std::string stem = fs::path(file).stem().string();
  if (r.name() != stem) {
    return Bad(file, "name", Cat("must be the file's stem, ", stem, " (got \"", r.name(), "\")"));
  }
  if (r.has_model() == !r.hf_config().empty()) {
    return Bad(file, "model", "give exactly one of model (a ModelConfig) and hf_config");
  }
  if (!r.hf_config().empty() && !r.has_training()) {
    return Bad(file, "training", "required with hf_config (seq_length, batch sizes)");
  }
  if (r.profile().empty()) return Bad(file, "profile", "required (a built-in profile name)");
  if (r.layout().empty()) return Bad(file, "layout", "required (plan-model --layout syntax)");
  const v1::PublishedMeasure& m = r.measured();
  if (!std::isfinite(m.value()) || m.value() <= 0.0) {
    return Bad(file, "measured.value", Cat("must be a finite number > 0 (got ", m.value(), ")"));
  }
  if (m.unit() == "tflops_per_gpu") {
    if (m.flops() != "model" && m.flops() != "hardware") {
      return Bad(
          file, "measured.flops",
          Cat("must be model or hardware with unit tflops_per_gpu (got \"", m.flops(), "\")"));
    }
  } else if (m.unit() == "tokens_per_second_per_gpu") {
    if (!m.flops().empty()) {
      return Bad(file, "measured.flops", "only with unit tflops_per_gpu");
    }
  } else {
    return Bad(file, "measured.unit",
               Cat("must be tflops_per_gpu or tokens_per_second_per_gpu (got \"", m.unit(), "\")"));
  }
  if (r.source().citation().empty() || r.source().locator().empty()) {
    return Bad(file, "source", "citation and locator are required");
  }
  return absl::OkStatus();
}

// The case's model: as written, or its Hugging Face config imported with the
// case's training shape (the path relative to the case's file).
absl::StatusOr<v1::ModelConfig> CaseModel(const std::string& file, const v1::PublishedRun& r) {
  if (r.has_model()) return r.model();
  const std::string path = (fs::path(file).parent_path() / r.hf_config()).string();
  MOEPLAN_ASSIGN_OR_RETURN(std::string text, proto::ReadFile(path));
  proto::HfTraining t;
  const v1::PublishedTraining& pt = r.training();
  if (pt.seq_length() > 0) t.seq_length = pt.seq_length();
  if (pt.micro_batch_size() > 0) t.micro_batch_size = pt.micro_batch_size();
  t.global_batch_size = pt.global_batch_size();
  t.fp8_format = pt.fp8_format();
  t.fp8_recipe = pt.fp8_recipe();
  t.fp8_param_gather = pt.fp8_param_gather();
  absl::StatusOr<proto::HfImport> imported = proto::ImportHfConfig(text, t, r.name());
  if (!imported.ok()) {
    return Bad(file, "hf_config", Cat(path, ": ", View(imported.status().message())));
  }
  return imported->model;
}

// Profiles by name, loaded once; --profile-overrides' files take
// the place of the built-in profiles they name.
class Profiles {
 public:
  absl::Status Override(const std::string& file) {
    MOEPLAN_ASSIGN_OR_RETURN(calibration::LoadedProfile lp, calibration::LoadProfile(file));
    const std::string name = lp.message.name();
    if (!profiles_.emplace(name, std::move(lp)).second) {
      return absl::InvalidArgumentError(Cat("--profile-overrides: ", file, " names profile ", name,
                                            ", which another file "
                                            "overrides already"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<const calibration::LoadedProfile*> Profile(const std::string& name) {
    auto it = profiles_.find(name);
    if (it == profiles_.end()) {
      MOEPLAN_ASSIGN_OR_RETURN(calibration::LoadedProfile lp, calibration::LoadProfile(name));
      it = profiles_.emplace(name, std::move(lp)).first;
    }
    return &it->second;
  }

 private:
  std::map<std::string, calibration::LoadedProfile> profiles_;
};

// What --search tries for a case: the default axes on the case's GPUs, and
// every opt-in axis its published layout uses, so that layout is in reach
// (selective recomputation and uneven splits aside, which the search does not
// enumerate).
v1::SearchOptions SearchFor(const v1::Layout& l, int gpus) {
  v1::SearchOptions o;
  o.set_top(1);
  o.set_gpus(gpus);
  if (l.sequence_parallel()) {
    o.add_sequence_parallel(false);
    o.add_sequence_parallel(true);
  }
  if (l.esp() > 0 && l.esp() != l.tp()) o.add_expert_tensor_parallel(l.esp());
  if (l.cp() > 1) {
    o.add_context_parallel(1);
    o.add_context_parallel(l.cp());
  }
  if (l.a2a_overlap()) {
    o.add_a2a_overlap(false);
    o.add_a2a_overlap(true);
  }
  if (!l.dispatcher().empty() && l.dispatcher() != "alltoall") {
    o.add_dispatchers("alltoall");
    o.add_dispatchers(l.dispatcher());
  }
  if (l.pipeline() == "dualpipe") {
    for (const char* ps : {"gpipe", "1f1b", "interleaved", "dualpipe"}) o.add_pipelines(ps);
  }
  if (l.virtual_stages() > 2) {
    o.add_virtual_stages(2);
    o.add_virtual_stages(l.virtual_stages());
  }
  o.set_max_microbatches(std::max(64, l.microbatches()));
  return o;
}

// One case predicted: the layout planned on its profile, both sides in model
// TFLOP/s per GPU; with `search`, the search's best next to it.
absl::StatusOr<v1::PublishedCase> Predict(const std::string& file, const v1::PublishedRun& r,
                                          bool search, Profiles& profiles) {
  v1::PlanModelRequest req;
  MOEPLAN_ASSIGN_OR_RETURN(*req.mutable_model(), CaseModel(file, r));
  absl::StatusOr<v1::Layout> layout = proto::LayoutFromSpec(r.layout());
  if (!layout.ok()) return Bad(file, "layout", View(layout.status().message()));
  *req.mutable_layout() = *layout;
  *req.mutable_memory() = r.memory();
  absl::StatusOr<const calibration::LoadedProfile*> profile = profiles.Profile(r.profile());
  if (!profile.ok()) return Bad(file, "profile", View(profile.status().message()));
  MOEPLAN_ASSIGN_OR_RETURN(p::CostModel cost, p::CostModel::Create((*profile)->profile));
  p::ModelPlanner planner(cost);
  v1::PlanModelResponse resp;
  if (absl::Status st = requests::AnswerPlanModel(req, planner, (*profile)->profile, &resp);
      !st.ok()) {
    return absl::Status(st.code(), Cat(file, ": ", View(st.message())));
  }
  if (resp.candidates_size() != 1) {
    return absl::InternalError(Cat(file, ": the layout was not planned"));
  }
  v1::PublishedCase c;
  c.set_name(r.name());
  c.set_family(req.model().has_moe() ? "moe" : "dense");
  c.set_profile(r.profile());
  c.set_gpus(resp.gpus());
  c.set_layout(r.layout());
  *c.mutable_measured() = r.measured();
  *c.mutable_predicted() = resp.candidates(0);
  c.set_source(Cat(r.source().citation(), ", ", r.source().locator()));
  const v1::PublishedMeasure& m = r.measured();
  double published = m.value();
  if (m.unit() == "tokens_per_second_per_gpu") {
    published = m.value() * resp.accounting().flops_per_token() / 1e12;
  } else if (m.flops() == "hardware") {
    // Eq. 3 of the 2021 paper counts the recomputed forward: 4 forwards'
    // worth where the model convention counts 3.
    if (!layout->recompute()) {
      return Bad(file, "measured.flops",
                 "hardware FLOPs (the recomputed forward counted) need a layout with "
                 "recompute=1");
    }
    published *= 3.0 / 4.0;
  }
  c.set_published_tflops_per_gpu(published);
  c.set_predicted_tflops_per_gpu(resp.candidates(0).tflops_per_gpu());
  c.set_error_pct(100.0 * (c.predicted_tflops_per_gpu() - published) / published);
  if (!search) return c;
  req.clear_layout();
  *req.mutable_search() = SearchFor(*layout, resp.gpus());
  v1::PlanModelResponse found;
  if (absl::Status st = requests::AnswerPlanModel(req, planner, (*profile)->profile, &found);
      !st.ok()) {
    return absl::Status(st.code(), Cat(file, ": --search: ", View(st.message())));
  }
  if (found.candidates_size() > 0) {
    *c.mutable_searched() = found.candidates(0);
    c.set_searched_layout(proto::LayoutToSpec(found.candidates(0).layout()));
    c.set_searched_gain_pct(
        100.0 * (found.candidates(0).tflops_per_gpu() / c.predicted_tflops_per_gpu() - 1.0));
  }
  return c;
}

// Each comparison's cases, fastest first as published and as predicted.
void AddRankings(const std::map<std::string, std::string>& comparison_of, v1::PublishedReport* r) {
  std::map<std::string, std::vector<const v1::PublishedCase*>> groups;
  for (const v1::PublishedCase& c : r->cases()) {
    const auto it = comparison_of.find(c.name());
    if (it != comparison_of.end() && !it->second.empty()) groups[it->second].push_back(&c);
  }
  for (auto& [name, cases] : groups) {
    if (cases.size() < 2) continue;
    v1::PublishedRanking* k = r->add_rankings();
    k->set_comparison(name);
    auto order = [&](auto key, auto* out) {
      std::vector<const v1::PublishedCase*> v = cases;
      std::stable_sort(v.begin(), v.end(), [&](auto* a, auto* b) { return key(*a) > key(*b); });
      for (const v1::PublishedCase* c : v) out->Add(std::string(c->name()));
    };
    order([](const v1::PublishedCase& c) { return c.published_tflops_per_gpu(); },
          k->mutable_published_order());
    order([](const v1::PublishedCase& c) { return c.predicted_tflops_per_gpu(); },
          k->mutable_predicted_order());
    k->set_same(std::equal(k->published_order().begin(), k->published_order().end(),
                           k->predicted_order().begin()));
  }
}

v1::PublishedSummary Summarize(std::string group, const std::vector<double>& errors) {
  v1::PublishedSummary s;
  s.set_group(std::move(group));
  s.set_cases(static_cast<int>(errors.size()));
  if (errors.empty()) return s;
  std::vector<double> abs;
  double sum_abs = 0.0, sum = 0.0;
  for (double e : errors) {
    abs.push_back(std::fabs(e));
    sum_abs += std::fabs(e);
    sum += e;
  }
  std::sort(abs.begin(), abs.end());
  const size_t n = abs.size();
  s.set_mape_pct(sum_abs / n);
  // Nearest rank: the smallest error at least 90 % of the cases reach.
  s.set_p90_abs_pct(abs[static_cast<size_t>(std::ceil(0.9 * n)) - 1]);
  s.set_max_abs_pct(abs.back());
  s.set_bias_pct(sum / n);
  return s;
}

void AddSummaries(v1::PublishedReport* r) {
  std::map<std::string, std::vector<double>> by;
  std::vector<double> all;
  for (const v1::PublishedCase& c : r->cases()) {
    all.push_back(c.error_pct());
    by[c.family()].push_back(c.error_pct());
    by[c.profile()].push_back(c.error_pct());
  }
  *r->add_summaries() = Summarize("all", all);
  for (const char* family : {"dense", "moe"}) *r->add_summaries() = Summarize(family, by[family]);
  for (auto& [group, errors] : by) {
    if (group != "dense" && group != "moe") *r->add_summaries() = Summarize(group, errors);
  }
}

std::string RenderPublished(const v1::PublishedReport& r) {
  std::string out =
      "Published runs against moeplan's predictions (model TFLOP/s per GPU, Megatron-LM's "
      "convention; each case on its own profile)\n\n"
      "| case | family | GPUs | profile | published | predicted | error | compute ms | exposed "
      "comm ms, by kind | grad sync ms | bubble ms | iteration ms | GiB/GPU |\n"
      "|---|---|--:|---|--:|--:|--:|--:|---|--:|--:|--:|--:|\n";
  for (const v1::PublishedCase& c : r.cases()) {
    const v1::LayoutCandidate& p = c.predicted();
    std::string comm;
    for (const v1::TermTime& t : p.exposed_comm()) {
      comm += fmt::format("{}{} {:.0f}", comm.empty() ? "" : ", ", t.term(), t.us() / 1e3);
    }
    // A layout the memory model says does not fit (it ran nonetheless): "(over)".
    out += fmt::format(
        "| {} | {} | {} | {} | {:.1f} | {:.1f} | {:+.1f} % | {:.0f} | {} | {:.0f} | {:.0f} "
        "| {:.0f} | {:.1f}{} |\n",
        c.name(), c.family(), c.gpus(), c.profile(), c.published_tflops_per_gpu(),
        c.predicted_tflops_per_gpu(), c.error_pct(), p.compute_us() / 1e3,
        comm.empty() ? "none" : comm, p.grad_sync_us() / 1e3, p.bubble_us() / 1e3,
        p.iteration_us() / 1e3, p.memory_bytes_per_gpu() / (1024.0 * 1024 * 1024),
        p.feasible() ? "" : " (over)");
  }
  bool searched = false;
  for (const v1::PublishedCase& c : r.cases()) searched = searched || c.has_searched();
  if (searched) {
    out +=
        "\n| case | search's best layout (predicted) | TFLOP/s | vs the published layout |\n"
        "|---|---|--:|--:|\n";
    for (const v1::PublishedCase& c : r.cases()) {
      if (!c.has_searched()) continue;
      out += fmt::format("| {} | `{}` | {:.1f} | {:+.1f} % |\n", c.name(), c.searched_layout(),
                         c.searched().tflops_per_gpu(), c.searched_gain_pct());
    }
  }
  for (const v1::PublishedRanking& k : r.rankings()) {
    out += fmt::format("\nranking {}: published {}, predicted {}: {}\n", k.comparison(),
                       fmt::join(k.published_order(), " > "), fmt::join(k.predicted_order(), " > "),
                       k.same() ? "same" : "DIFFERENT");
  }
  out += "\n| group | cases | MAPE | p90 abs | max abs | bias |\n|---|--:|--:|--:|--:|--:|\n";
  for (const v1::PublishedSummary& s : r.summaries()) {
    if (s.cases() == 0) continue;
    out += fmt::format("| {} | {} | {:.1f} % | {:.1f} % | {:.1f} % | {:+.1f} % |\n", s.group(),
                       s.cases(), s.mape_pct(), s.p90_abs_pct(), s.max_abs_pct(), s.bias_pct());
  }
  return out;
}

}  // namespace

absl::Status ValidatePublishedCmd(const ValidateArgs& a) {
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<std::string> files, CaseFiles(a.published));
  Profiles profiles;
  for (const std::string& file : a.profile_overrides) {
    MOEPLAN_RETURN_IF_ERROR(profiles.Override(file));
  }
  v1::PublishedReport report;
  std::set<std::string> names;
  std::map<std::string, std::string> comparison_of;
  // Everything is read, checked and predicted before anything is printed.
  for (const std::string& file : files) {
    v1::PublishedRun run;
    MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(file, &run));
    MOEPLAN_RETURN_IF_ERROR(CheckCase(file, run));
    if (!names.insert(run.name()).second) {
      return Bad(file, "name", Cat("\"", run.name(), "\" is another case's too"));
    }
    comparison_of[run.name()] = run.comparison();
    MOEPLAN_ASSIGN_OR_RETURN(*report.add_cases(), Predict(file, run, a.search, profiles));
  }
  AddSummaries(&report);
  AddRankings(comparison_of, &report);
  if (a.json) {
    MOEPLAN_ASSIGN_OR_RETURN(std::string json, proto::ToJson(report));
    return WriteStdout(json + "\n");
  }
  return WriteStdout(RenderPublished(report));
}

}  // namespace moeplan::client
