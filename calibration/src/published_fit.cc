// The software-stack calibration of spec profiles on published training runs
// (docs/calibration.md "Stack calibration"): a few terms, fitted by
// Levenberg-Marquardt on the log of predicted / published throughput, in
// sample and leave-one-case-out.
#include <fmt/format.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/published.h"
#include "unsupported/Eigen/NonLinearOptimization"
#include "unsupported/Eigen/NumericalDiff"

namespace moeplan::calibration {
namespace {

// The spec generator's saturation size (calibration/profiles/make_spec_profiles.py):
// eff = e_max * m/(m+K) * n/(n+K) * k/(k+K/2).
constexpr double kSpecKnee = 128.0;

constexpr const char* kWhyGemm =
    "what the stack's GEMMs (cuBLAS, Transformer Engine) reach of the datasheet peak on large "
    "shapes, which every compute op's time follows; one per GPU type";
constexpr const char* kWhyKnee =
    "how fast GEMM efficiency falls for small shapes (tile quantisation, the fixed cost of a "
    "GEMM); shared: a property of the kernels' tiling more than of one GPU";
constexpr const char* kWhyPermute =
    "what the token permutation and unpermutation kernels, and what runs with them per routed "
    "token (probabilities, casts, host-synchronised splits), reach of the memory bandwidth; "
    "shared, MoE cases only";

// Kept within [0.001, 0.999]: a long Levenberg-Marquardt step stays a profile.
double Sigmoid(double u) { return std::clamp(1.0 / (1.0 + std::exp(-u)), 1e-3, 1.0 - 1e-3); }
double Logit(double p) { return std::log(p / (1.0 - p)); }

double Curve(double m, double n, double k, double knee) {
  return m / (m + knee) * n / (n + knee) * k / (k + knee / 2.0);
}

// The terms as a parameter vector: one logit(e_max) per profile, log(knee),
// and (with MoE cases) logit(permute share).
struct Terms {
  std::vector<std::string> profiles;  // the cases' profiles, by name
  bool permute = false;
  int size() const { return static_cast<int>(profiles.size()) + 1 + (permute ? 1 : 0); }
  double EMax(const Eigen::VectorXd& x, size_t p) const {
    return Sigmoid(x[static_cast<Eigen::Index>(p)]);
  }
  double Knee(const Eigen::VectorXd& x) const {
    return std::exp(std::clamp(x[static_cast<Eigen::Index>(profiles.size())], 0.0, 12.0));
  }
  double Permute(const Eigen::VectorXd& x) const {
    return permute ? Sigmoid(x[static_cast<Eigen::Index>(profiles.size()) + 1]) : 1.0;
  }
};

// `spec` with the terms `x`: its GEMM grid on the curve of e_max and knee over
// its own axes, its permutation kernels at the share of its memory bandwidth.
v1::ClusterProfile Apply(const v1::ClusterProfile& spec, const Terms& t, size_t p,
                         const Eigen::VectorXd& x) {
  v1::ClusterProfile out = spec;
  v1::GemmModel* g = out.mutable_gemm();
  g->clear_efficiency();
  const double e = t.EMax(x, p), knee = t.Knee(x);
  for (int m : spec.gemm().m()) {
    for (int n : spec.gemm().n()) {
      for (int k : spec.gemm().k()) g->add_efficiency(std::max(1e-4, e * Curve(m, n, k, knee)));
    }
  }
  if (t.permute) {
    const double share = t.Permute(x);
    for (v1::MemoryModel* line :
         {out.mutable_kernels()->mutable_order(), out.mutable_kernels()->mutable_iorder()}) {
      line->set_bandwidth_gbytes_per_s(share * spec.memory().bandwidth_gbytes_per_s());
      line->set_launch_overhead_us(spec.memory().launch_overhead_us());
    }
  }
  return out;
}

// The spec profile's own terms: e_max from its largest grid entry on the
// spec curve, the spec knee, its permutation kernels' share (1 when it has
// none of its own).
Eigen::VectorXd SpecTerms(const Terms& t, const std::vector<v1::ClusterProfile>& specs) {
  Eigen::VectorXd x(t.size());
  for (size_t p = 0; p < specs.size(); ++p) {
    const v1::GemmModel& g = specs[p].gemm();
    const double top = *std::max_element(g.efficiency().begin(), g.efficiency().end());
    const double e =
        top / Curve(g.m(g.m_size() - 1), g.n(g.n_size() - 1), g.k(g.k_size() - 1), kSpecKnee);
    x[static_cast<Eigen::Index>(p)] = Logit(std::clamp(e, 0.01, 0.99));
  }
  x[static_cast<Eigen::Index>(specs.size())] = std::log(kSpecKnee);
  if (t.permute) {
    double share = 0.99;
    const v1::ClusterProfile& s = specs.front();
    if (s.kernels().order().bandwidth_gbytes_per_s() > 0.0) {
      share = s.kernels().order().bandwidth_gbytes_per_s() / s.memory().bandwidth_gbytes_per_s();
    }
    x[static_cast<Eigen::Index>(specs.size()) + 1] = Logit(std::clamp(share, 0.01, 0.99));
  }
  return x;
}

// Predictions of some cases under terms x; counts them.
class Evaluator {
 public:
  Evaluator(const std::vector<PublishedEntry>& cases, const Terms& t,
            const std::vector<v1::ClusterProfile>& specs)
      : cases_(cases), terms_(t), specs_(specs) {}

  // The cases `which` (indices into the dataset) predicted under terms x.
  absl::StatusOr<std::vector<v1::PublishedCase>> Predict(const Eigen::VectorXd& x,
                                                         const std::vector<int>& which) {
    PublishedProfiles profiles;
    for (size_t p = 0; p < specs_.size(); ++p) {
      MOEPLAN_RETURN_IF_ERROR(profiles.Set(Apply(specs_[p], terms_, p, x)));
    }
    std::vector<v1::PublishedCase> out;
    for (int i : which) {
      MOEPLAN_ASSIGN_OR_RETURN(v1::PublishedCase c,
                               PredictPublished(cases_[static_cast<size_t>(i)], false, profiles));
      out.push_back(std::move(c));
      ++predictions_;
    }
    return out;
  }
  int predictions() const { return predictions_; }

 private:
  const std::vector<PublishedEntry>& cases_;
  const Terms& terms_;
  const std::vector<v1::ClusterProfile>& specs_;
  int predictions_ = 0;
};

// Log residuals of the fitted cases, for Eigen's Levenberg-Marquardt.
struct Residuals {
  using Scalar = double;
  enum { InputsAtCompileTime = Eigen::Dynamic, ValuesAtCompileTime = Eigen::Dynamic };
  using InputType = Eigen::VectorXd;
  using ValueType = Eigen::VectorXd;
  using JacobianType = Eigen::MatrixXd;

  Evaluator* eval;
  std::vector<int> cases;
  int n;
  absl::Status* error;

  int inputs() const { return n; }
  int values() const { return static_cast<int>(cases.size()); }
  int operator()(const Eigen::VectorXd& x, Eigen::VectorXd& f) const {
    absl::StatusOr<std::vector<v1::PublishedCase>> r = eval->Predict(x, cases);
    if (!r.ok()) {
      *error = r.status();
      return -1;  // Eigen stops (UserAsked)
    }
    for (size_t i = 0; i < r->size(); ++i) {
      f[static_cast<Eigen::Index>(i)] = std::log1p((*r)[i].error_pct() / 100.0);
    }
    return 0;
  }
};

// Terms fitted to `cases` from x0.
absl::StatusOr<Eigen::VectorXd> Fit(Evaluator& eval, const Terms& t, const std::vector<int>& cases,
                                    const Eigen::VectorXd& x0) {
  absl::Status error;
  Residuals r{&eval, cases, t.size(), &error};
  // Central differences of 1e-3 relative: the simulator picks among
  // variants, so its times are smooth only piecewise.
  Eigen::NumericalDiff<Residuals, Eigen::Central> diff(r, 1e-6);
  Eigen::LevenbergMarquardt<Eigen::NumericalDiff<Residuals, Eigen::Central>> lm(diff);
  lm.parameters.maxfev = 400;
  lm.parameters.xtol = 1e-4;
  lm.parameters.ftol = 1e-6;
  Eigen::VectorXd x = x0;
  lm.minimize(x);
  MOEPLAN_RETURN_IF_ERROR(error);
  return x;
}

void AddTerms(const Terms& t, const Eigen::VectorXd& x, const Eigen::VectorXd& spec,
              const std::string& only_profile,
              google::protobuf::RepeatedPtrField<v1::StackTerm>* out) {
  for (size_t p = 0; p < t.profiles.size(); ++p) {
    if (!only_profile.empty() && t.profiles[p] != only_profile) continue;
    v1::StackTerm* s = out->Add();
    s->set_name("gemm_efficiency");
    s->set_profile(t.profiles[p]);
    s->set_value(t.EMax(x, p));
    s->set_spec_value(t.EMax(spec, p));
    s->set_why(kWhyGemm);
  }
  v1::StackTerm* k = out->Add();
  k->set_name("gemm_knee");
  k->set_value(t.Knee(x));
  k->set_spec_value(t.Knee(spec));
  k->set_why(kWhyKnee);
  if (t.permute) {
    v1::StackTerm* s = out->Add();
    s->set_name("permute_efficiency");
    s->set_value(t.Permute(x));
    s->set_spec_value(t.Permute(spec));
    s->set_why(kWhyPermute);
  }
}

void AddSummaries(const std::vector<v1::PublishedFitCase>& cases,
                  double (v1::PublishedFitCase::*error)() const,
                  google::protobuf::RepeatedPtrField<v1::PublishedSummary>* out) {
  std::map<std::string, std::vector<double>> by;
  std::vector<double> all;
  for (const v1::PublishedFitCase& c : cases) {
    const double e = (c.*error)();
    all.push_back(e);
    by[c.family()].push_back(e);
    by[c.profile()].push_back(e);
  }
  *out->Add() = SummarizePublished("all", all);
  for (const char* family : {"dense", "moe"}) {
    if (!by[family].empty()) *out->Add() = SummarizePublished(family, by[family]);
  }
  for (auto& [group, errors] : by) {
    if (group != "dense" && group != "moe" && !errors.empty()) {
      *out->Add() = SummarizePublished(group, errors);
    }
  }
}

// The spec profiles the cases name, sorted by name into t->profiles.
absl::StatusOr<std::vector<v1::ClusterProfile>> SpecProfiles(
    const std::vector<PublishedEntry>& cases, Terms* t) {
  std::set<std::string> names;
  for (const PublishedEntry& e : cases) names.insert(e.run.profile());
  t->profiles.assign(names.begin(), names.end());
  std::vector<v1::ClusterProfile> specs;
  for (const std::string& name : t->profiles) {
    MOEPLAN_ASSIGN_OR_RETURN(LoadedProfile lp, LoadProfile(name));
    const v1::GemmModel& g = lp.message.gemm();
    if (lp.message.source() != v1::PROFILE_SOURCE_SPEC || g.efficiency().empty()) {
      return absl::InvalidArgumentError(
          Cat("--published: profile ", name,
              ": the stack calibration scales a spec profile's GEMM curve and memory kernels "
              "(source PROFILE_SOURCE_SPEC with a GEMM grid)"));
    }
    if (lp.message.has_published_fit()) {
      return absl::InvalidArgumentError(Cat("--published: profile ", name,
                                            ": already calibrated on published runs; start "
                                            "from the spec profile"));
    }
    specs.push_back(std::move(lp.message));
  }
  return specs;
}

// Spec profile p with the terms x fitted on `cases`: its next version, with
// its published_fit and a line of its comment saying so.
v1::ClusterProfile Calibrated(const v1::ClusterProfile& spec, const Terms& t, size_t p,
                              const Eigen::VectorXd& x, const Eigen::VectorXd& x0,
                              const std::vector<PublishedEntry>& cases,
                              const v1::PublishedFitReport& r, const StackFitOptions& options) {
  v1::ClusterProfile prof = Apply(spec, t, p, x);
  prof.set_version(spec.version() + 1);
  v1::PublishedFit* f = prof.mutable_published_fit();
  f->set_dataset(options.dataset);
  for (const PublishedEntry& e : cases) f->add_cases(e.run.name());
  AddTerms(t, x, x0, t.profiles[p], f->mutable_terms());
  f->set_spec_mape_pct(r.spec(0).mape_pct());
  f->set_in_sample_mape_pct(r.in_sample(0).mape_pct());
  if (options.holdout) f->set_holdout_mape_pct(r.holdout(0).mape_pct());
  std::string terms;
  for (const v1::StackTerm& s : f->terms()) {
    terms += fmt::format("{}{} {:.4g}", terms.empty() ? "" : ", ", s.name(), s.value());
  }
  prof.set_comment(Cat(prof.comment(), " Calibrated to a software stack on ", cases.size(),
                       " published runs (moeplan calibrate --published ", options.dataset,
                       "): ", terms, "; see published_fit."));
  return prof;
}

}  // namespace

absl::StatusOr<StackFit> FitPublished(const std::vector<PublishedEntry>& cases,
                                      const StackFitOptions& options) {
  Terms t;
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<v1::ClusterProfile> specs, SpecProfiles(cases, &t));
  // The MoE cases' permutation share; none: not fitted.
  PublishedProfiles spec_profiles;
  std::vector<v1::PublishedCase> spec_cases;
  for (const PublishedEntry& e : cases) {
    MOEPLAN_ASSIGN_OR_RETURN(v1::PublishedCase c, PredictPublished(e, false, spec_profiles));
    t.permute = t.permute || c.family() == "moe";
    spec_cases.push_back(std::move(c));
  }
  const int n = static_cast<int>(cases.size());
  if (n < t.size() + (options.holdout ? 2 : 1)) {
    return absl::InvalidArgumentError(
        Cat("--published: ", n, " cases fit ", t.size(), " terms poorly: give at least ",
            t.size() + (options.holdout ? 2 : 1),
            options.holdout ? " (one more than the terms, and one to hold out)"
                            : " (one more than the terms)"));
  }
  Evaluator eval(cases, t, specs);
  const Eigen::VectorXd x0 = SpecTerms(t, specs);
  std::vector<int> every(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) every[static_cast<size_t>(i)] = i;
  MOEPLAN_ASSIGN_OR_RETURN(const Eigen::VectorXd x, Fit(eval, t, every, x0));
  MOEPLAN_ASSIGN_OR_RETURN(const std::vector<v1::PublishedCase> fitted, eval.Predict(x, every));
  StackFit out;
  v1::PublishedFitReport& r = out.report;
  r.set_dataset(options.dataset);
  r.set_fits(1);
  std::vector<v1::PublishedFitCase> rows(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    v1::PublishedFitCase& row = rows[static_cast<size_t>(i)];
    const v1::PublishedCase& s = spec_cases[static_cast<size_t>(i)];
    row.set_name(s.name());
    row.set_family(s.family());
    row.set_profile(s.profile());
    row.set_published_tflops_per_gpu(s.published_tflops_per_gpu());
    row.set_spec_error_pct(s.error_pct());
    row.set_in_sample_error_pct(fitted[static_cast<size_t>(i)].error_pct());
  }
  // Leave one case out: fitted from the spec terms, so that a term only the
  // held-out case constrains keeps its spec value.
  for (int i = 0; options.holdout && i < n; ++i) {
    std::vector<int> rest;
    for (int j = 0; j < n; ++j) {
      if (j != i) rest.push_back(j);
    }
    MOEPLAN_ASSIGN_OR_RETURN(const Eigen::VectorXd xi, Fit(eval, t, rest, x0));
    MOEPLAN_ASSIGN_OR_RETURN(const std::vector<v1::PublishedCase> held, eval.Predict(xi, {i}));
    rows[static_cast<size_t>(i)].set_holdout_error_pct(held[0].error_pct());
    AddTerms(t, xi, x0, "", rows[static_cast<size_t>(i)].mutable_holdout_terms());
    r.set_fits(r.fits() + 1);
  }
  AddTerms(t, x, x0, "", r.mutable_terms());
  for (const v1::PublishedFitCase& row : rows) *r.add_cases() = row;
  AddSummaries(rows, &v1::PublishedFitCase::spec_error_pct, r.mutable_spec());
  AddSummaries(rows, &v1::PublishedFitCase::in_sample_error_pct, r.mutable_in_sample());
  if (options.holdout) {
    AddSummaries(rows, &v1::PublishedFitCase::holdout_error_pct, r.mutable_holdout());
  }
  r.set_predictions(eval.predictions() + n);
  // The profiles, fitted on every case, saying so.
  for (size_t p = 0; p < specs.size(); ++p) {
    out.profiles.push_back(Calibrated(specs[p], t, p, x, x0, cases, r, options));
  }
  return out;
}

}  // namespace moeplan::calibration
