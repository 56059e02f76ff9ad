// Profiler samples (moeplan.v1.ProfileSample JSON Lines) parsed and
// calibrated into a profile, as `moeplan calibrate` does.
#include "fuzz_util.h"
#include "moeplan/calibration/fit.h"
#include "moeplan/proto/convert.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeplan;
  auto samples = calibration::ParseSamples(fuzz::View(data, size), "fuzz.jsonl");
  if (!samples.ok() || samples->empty()) return 0;
  calibration::CalibrateOptions options;
  options.name = "fuzz";
  auto calibrated = calibration::Calibrate(*samples, options);
  if (!calibrated.ok()) return 0;
  (void)calibration::RenderFitReport(*calibrated);
  // Calibrate promises a profile the planner accepts.
  auto profile = proto::ProfileFromProto(calibrated->profile);
  if (!profile.ok() || !planner::CostModel::Create(*profile).ok()) std::abort();
  return 0;
}
