#include "moeplan/planner/limits.h"

#include "moeplan/base/strings.h"

namespace moeplan::planner {

absl::Status Deadline::Check(std::string_view what) const {
  if (!Passed()) return absl::OkStatus();
  return absl::DeadlineExceededError(
      Cat(what, ": the plan ran past its time limit (the call's deadline or the server's "
                "--max-plan-seconds) and was stopped"));
}

}  // namespace moeplan::planner
