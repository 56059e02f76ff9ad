// Rendering plans for people and tools. Everything renders from the
// moeplan.v1.PlanLayerResponse, so a plan computed locally and one received from
// a server print identically.
#pragma once

#include <string>

#include "moeplan/v1/layer.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "moeplan/v1/profile.pb.h"
#include "moeplan/v1/trace.pb.h"

namespace moeplan::client {

// The ranked candidates, the decision and (when the response has ops) every
// candidate's op timeline, as aligned text.
std::string FormatPlanTable(const v1::LayerConfig& layer, const v1::PlanLayerResponse& plan,
                            const v1::ClusterProfile& profile);

// Chrome trace events: one process per candidate (named by schedule, fastest
// first), one track per resource; an op holding several resources appears on each.
v1::ChromeTrace BuildTrace(const v1::PlanLayerResponse& plan);

}  // namespace moeplan::client
