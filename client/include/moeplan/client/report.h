// Rendering plans for people and tools. Everything renders from the
// moeplan.v1.PlanLayerResponse, so a plan computed locally and one received from
// a server print identically.
#pragma once

#include <string>

#include "moeplan/v1/layer.pb.h"
#include "moeplan/v1/model.pb.h"
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

// A whole-model plan (docs/model.md) for people: the variants side by side
// (iteration time, exposed and hidden communication, speedups over none and the
// best tutel), each variant's (schedule, AlltoAll) alternatives, the chosen
// partition ranges and k per MoE layer, the dW placement per backward AlltoAll,
// and where the hierarchical AlltoAll starts to pay.
std::string FormatModelTable(const v1::ModelConfig& model, const v1::PlanModelResponse& plan,
                             const v1::ClusterProfile& profile);

// Layout candidates (docs/layouts.md): the search's counts, the ranked layouts
// (family, degrees, micro-batches, ZeRO, pipeline schedule, iteration time,
// tokens/s/GPU, memory, bubble, overlap variant and MoE schedule), then each
// one's time and memory breakdown.
std::string FormatLayoutTable(const v1::ModelConfig& model, const v1::PlanModelResponse& plan,
                              const v1::ClusterProfile& profile);

// One process per variant (request order), one track per resource.
v1::ChromeTrace BuildModelTrace(const v1::PlanModelResponse& plan);

}  // namespace moeplan::client
