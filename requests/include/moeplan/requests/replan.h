// A variant that ran, planned again (`moeplan validate --models`,
// `moeplan-exec --plan`, refits): the request that pins its choices, and how
// a new plan differs from it.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "moeplan/v1/model.pb.h"
#include "moeplan/v1/plan.pb.h"

namespace moeplan::requests {

// The request that plans `ran`, one variant of a plan of `model`, again: its
// variant, MoE schedule, AlltoAll algorithm and Tutel degree pinned; partition
// ranges and dW placement are planned anew (on an unchanged profile: as they
// were). InvalidArgument "variant: ..." when `ran` names no variant.
absl::StatusOr<v1::PlanModelRequest> PinnedModelRequest(const v1::ModelConfig& model,
                                                        const v1::VariantPlan& ran);

// How `planned` differs from `ran` (a variant plan that ran or was saved):
// the first of schedule, Tutel degree, partition ranges, dW placements and
// ops (names in order where both have them, else their count) that differ;
// empty when it is the same plan.
std::string PlanDifference(const v1::VariantPlan& ran, const v1::VariantPlan& planned);

}  // namespace moeplan::requests
