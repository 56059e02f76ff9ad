// `moeplan sweep`: every config of a grid planned with one cost model (sweep.h),
// written as CSV and summarised.
#include <fmt/format.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli_util.h"
#include "commands.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/client/sweep.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/proto/json.h"
#include "moeplan/v1/layer.pb.h"

namespace moeplan::client {

namespace p = ::moeplan::planner;

absl::Status SweepCmd(const SweepArgs& a) {
  MOEPLAN_RETURN_IF_ERROR(
      RefuseOutputOverInput({{"--out", a.out}}, {{"--grid", a.grid}, {"--cluster", a.cluster}}));
  SweepOptions options;
  MOEPLAN_ASSIGN_OR_RETURN(options.schedules, ParseSchedules(a.schedules));
  options.skip_invalid = a.skip_invalid;
  v1::LayerGrid grid;
  MOEPLAN_ASSIGN_OR_RETURN(std::vector<v1::LayerConfig> configs, ReadGrid(a.grid, &grid));
  MOEPLAN_ASSIGN_OR_RETURN(calibration::LoadedProfile profile, calibration::LoadProfile(a.cluster));
  MOEPLAN_ASSIGN_OR_RETURN(p::CostModel cost, p::CostModel::Create(profile.profile));

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<SweepResult> result = RunSweep(configs, cost, options);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!result.ok()) {
    return absl::Status(result.status().code(),
                        Cat(a.grid, ": ", View(result.status().message()),
                            a.skip_invalid ? "" : "; pass --skip-invalid to skip such configs"));
  }
  absl::Status s = proto::WriteFileAtomic(a.out, SweepCsv(*result));
  if (!s.ok()) return absl::Status(s.code(), Cat("--out: ", View(s.message())));
  std::string text = fmt::format("sweep {} on {} (v{}): planned in {:.1f} ms ({:.1f} us/config)\n",
                                 grid.name().empty() ? a.grid : grid.name(), profile.message.name(),
                                 profile.message.version(), ms,
                                 result->configs ? 1000.0 * ms / result->configs : 0.0);
  text += SweepSummary(*result);
  text += fmt::format("wrote {} ({} rows)\n", a.out, result->rows.size());
  return WriteStdout(text);
}

}  // namespace moeplan::client
