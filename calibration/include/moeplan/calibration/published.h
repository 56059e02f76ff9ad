// Published training runs (docs/calibration.md "Published runs"): the
// dataset's files read and checked, each case predicted at its layout, and
// the software-stack calibration fitted to them (`moeplan calibrate
// --published`, "Stack calibration").
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/calibration/validation.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/v1/published.pb.h"

namespace moeplan::calibration {

struct PublishedEntry {
  std::string file;  // where it was read from (relative paths in it resolve from here)
  v1::PublishedRun run;
};

// PATH itself, or every *.json directly in it by name; each read strictly
// and checked (the field rules of published.proto), names unique.
absl::StatusOr<std::vector<PublishedEntry>> ReadPublished(const std::string& path);

// The profiles cases name: built-ins loaded once, or profiles set in their
// place (files of --profile-overrides, a fit's candidates).
class PublishedProfiles {
 public:
  // A profile file in place of the built-in of its name; two files naming
  // one profile are refused.
  absl::Status Override(const std::string& file);
  // `p` in place of the profile of its name (checked as on load).
  absl::Status Set(const v1::ClusterProfile& p);
  absl::StatusOr<const LoadedProfile*> Profile(const std::string& name);

 private:
  std::map<std::string, LoadedProfile> profiles_;
  std::map<std::string, std::string> overridden_by_;  // name -> file
};

// One case predicted at its layout on its profile, both sides in model
// TFLOP/s per GPU; `search`: the search's best for its model and GPUs too.
absl::StatusOr<v1::PublishedCase> PredictPublished(const PublishedEntry& e, bool search,
                                                   PublishedProfiles& profiles);

// Every case predicted, with the summaries (all, dense, moe, per profile) and
// the rankings of each comparison.
absl::StatusOr<v1::PublishedReport> PredictAllPublished(const std::vector<PublishedEntry>& cases,
                                                        bool search, PublishedProfiles& profiles);

// The scatter plots (validation.h): predicted against published TFLOP/s per
// GPU, one series per family; a fit's cases on the spec profiles and held out
// (in sample without a holdout).
Scatter PublishedScatter(const v1::PublishedReport& r);
Scatter PublishedFitScatter(const v1::PublishedFitReport& r);

// MAPE, p90, max and bias of `errors` (percent) as group `group`.
v1::PublishedSummary SummarizePublished(std::string group, const std::vector<double>& errors);

// The stack calibration (docs/calibration.md "Stack calibration"): a few
// terms of the spec profiles the cases name, fitted by least squares on the
// log of predicted / published throughput. `holdout`: each case predicted
// again by terms fitted without it (leave-one-case-out).
struct StackFitOptions {
  std::string dataset;  // recorded in the profiles and report
  bool holdout = true;
};
struct StackFit {
  std::vector<v1::ClusterProfile> profiles;  // one per profile the cases name, fitted on all
  v1::PublishedFitReport report;
};
absl::StatusOr<StackFit> FitPublished(const std::vector<PublishedEntry>& cases,
                                      const StackFitOptions& options);

}  // namespace moeplan::calibration
