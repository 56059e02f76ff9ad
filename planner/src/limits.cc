#include "moeplan/planner/limits.h"

#include "moeplan/base/strings.h"

namespace moeplan::planner {

absl::Status Deadline::Check(std::string_view what) const {
  if (!Passed()) return absl::OkStatus();
  return absl::DeadlineExceededError(
      Cat(what, ": the plan ran past its time limit (--max-plan-seconds, or the call's "
                "deadline) and was stopped; raise the limit, or narrow the search"));
}

}  // namespace moeplan::planner
