// Published training runs: the dataset read and checked, each case predicted
// at its layout (docs/calibration.md "Published runs").
#include "moeplan/calibration/published.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/hf_config.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"

namespace moeplan::calibration {
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
  o.set_overlap_param_gather(l.overlap_param_gather());
  o.set_tp_comm_overlap(l.tp_comm_overlap());
  return o;
}

}  // namespace

absl::StatusOr<v1::PublishedCase> PredictPublished(const PublishedEntry& e, bool search,
                                                   PublishedProfiles& profiles) {
  const std::string& file = e.file;
  const v1::PublishedRun& r = e.run;
  v1::PlanModelRequest req;
  MOEPLAN_ASSIGN_OR_RETURN(*req.mutable_model(), CaseModel(file, r));
  absl::StatusOr<v1::Layout> layout = proto::LayoutFromSpec(r.layout());
  if (!layout.ok()) return Bad(file, "layout", View(layout.status().message()));
  *req.mutable_layout() = *layout;
  *req.mutable_memory() = r.memory();
  absl::StatusOr<const LoadedProfile*> profile = profiles.Profile(r.profile());
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

namespace {

// Each comparison's cases, fastest first as published and as predicted.
void AddRankings(const std::map<std::string, std::string>& comparison_of, v1::PublishedReport* r) {
  std::map<std::string, std::vector<const v1::PublishedCase*>> groups;
  for (const v1::PublishedCase& c : r->cases()) {
    const auto it = comparison_of.find(c.name());
    if (it != comparison_of.end() && !it->second.empty()) groups[it->second].push_back(&c);
  }
  for (const auto& group : groups) {
    // Named, not a structured binding: the lambda below captures it (clang
    // before 16 refuses to capture a binding).
    const std::vector<const v1::PublishedCase*>& cases = group.second;
    if (cases.size() < 2) continue;
    v1::PublishedRanking* k = r->add_rankings();
    k->set_comparison(group.first);
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

}  // namespace

v1::PublishedSummary SummarizePublished(std::string group, const std::vector<double>& errors) {
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

namespace {

void AddSummaries(v1::PublishedReport* r) {
  std::map<std::string, std::vector<double>> by;
  std::vector<double> all;
  for (const v1::PublishedCase& c : r->cases()) {
    all.push_back(c.error_pct());
    by[c.family()].push_back(c.error_pct());
    by[c.profile()].push_back(c.error_pct());
  }
  *r->add_summaries() = SummarizePublished("all", all);
  for (const char* family : {"dense", "moe"})
    *r->add_summaries() = SummarizePublished(family, by[family]);
  for (auto& [group, errors] : by) {
    if (group != "dense" && group != "moe") *r->add_summaries() = SummarizePublished(group, errors);
  }
}

}  // namespace

absl::StatusOr<std::vector<PublishedEntry>> ReadPublished(const std::string& path) {
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<std::string> files, CaseFiles(path));
  std::vector<PublishedEntry> out;
  std::set<std::string> names;
  for (const std::string& file : files) {
    PublishedEntry e;
    e.file = file;
    MOEPLAN_RETURN_IF_ERROR(proto::ReadJsonFile(file, &e.run));
    MOEPLAN_RETURN_IF_ERROR(CheckCase(file, e.run));
    if (!names.insert(e.run.name()).second) {
      return Bad(file, "name", Cat("\"", e.run.name(), "\" is another case's too"));
    }
    out.push_back(std::move(e));
  }
  return out;
}

absl::Status PublishedProfiles::Override(const std::string& file) {
  MOEPLAN_ASSIGN_OR_RETURN(LoadedProfile lp, LoadProfile(file));
  const std::string name = lp.message.name();
  if (!overridden_by_.emplace(name, file).second) {
    return absl::InvalidArgumentError(Cat("--profile-overrides: ", file, " names profile ", name,
                                          ", which ", overridden_by_[name], " overrides already"));
  }
  profiles_.insert_or_assign(name, std::move(lp));
  return absl::OkStatus();
}

absl::Status PublishedProfiles::Set(const v1::ClusterProfile& p) {
  LoadedProfile lp;
  lp.message = p;
  MOEPLAN_ASSIGN_OR_RETURN(lp.profile, proto::ProfileFromProto(p));
  profiles_.insert_or_assign(p.name(), std::move(lp));
  return absl::OkStatus();
}

absl::StatusOr<const LoadedProfile*> PublishedProfiles::Profile(const std::string& name) {
  auto it = profiles_.find(name);
  if (it == profiles_.end()) {
    MOEPLAN_ASSIGN_OR_RETURN(LoadedProfile lp, LoadProfile(name));
    it = profiles_.emplace(name, std::move(lp)).first;
  }
  return &it->second;
}

absl::StatusOr<v1::PublishedReport> PredictAllPublished(const std::vector<PublishedEntry>& cases,
                                                        bool search, PublishedProfiles& profiles) {
  v1::PublishedReport report;
  std::map<std::string, std::string> comparison_of;
  for (const PublishedEntry& e : cases) {
    comparison_of[e.run.name()] = e.run.comparison();
    MOEPLAN_ASSIGN_OR_RETURN(*report.add_cases(), PredictPublished(e, search, profiles));
  }
  AddSummaries(&report);
  AddRankings(comparison_of, &report);
  return report;
}

namespace {

Scatter PublishedAxes(std::string title) {
  Scatter p;
  p.comment = "moeplan: predicted vs published model TFLOP/s per GPU";
  p.series_noun = "series";
  p.x_column = "published_tflops_per_gpu";
  p.y_column = "predicted_tflops_per_gpu";
  p.label_column = "case";
  p.script_noun = "moeplan published runs";
  p.title = std::move(title);
  p.x_label = "published model TFLOP/s per GPU";
  p.y_label = "predicted model TFLOP/s per GPU";
  return p;
}

}  // namespace

Scatter PublishedScatter(const v1::PublishedReport& r) {
  Scatter p = PublishedAxes("moeplan against published training runs");
  for (const char* family : {"dense", "moe"}) {
    ScatterSeries series;
    series.name = family;
    for (const v1::PublishedCase& c : r.cases()) {
      if (c.family() != family) continue;
      series.points.push_back(
          {c.published_tflops_per_gpu(), c.predicted_tflops_per_gpu(), c.name()});
    }
    if (!series.points.empty()) p.series.push_back(std::move(series));
  }
  return p;
}

Scatter PublishedFitScatter(const v1::PublishedFitReport& r) {
  Scatter p = PublishedAxes("moeplan's stack calibration on published training runs");
  const bool holdout = !r.holdout().empty();
  // One word each: the data file's first column.
  ScatterSeries spec{"spec", {}},
      fitted{holdout ? "calibrated-held-out" : "calibrated-in-sample", {}};
  for (const v1::PublishedFitCase& c : r.cases()) {
    const double pub = c.published_tflops_per_gpu();
    spec.points.push_back({pub, pub * (1.0 + c.spec_error_pct() / 100.0), c.name()});
    const double e = holdout ? c.holdout_error_pct() : c.in_sample_error_pct();
    fitted.points.push_back({pub, pub * (1.0 + e / 100.0), c.name()});
  }
  p.series.push_back(std::move(spec));
  p.series.push_back(std::move(fitted));
  return p;
}

}  // namespace moeplan::calibration
