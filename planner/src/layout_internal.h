// What the layout code's files share (private to the planner library).
#pragma once

#include "moeplan/planner/layout.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"

namespace moeplan::planner::internal {

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The blocks of chunk `chunk` of stage `stage`: chunk c of stage s is model
// chunk c * pp + s (interleaved), each num_layers / (pp * v) blocks; and how
// the layout places its MoE layers and gradients.
StageOptions ChunkOptions(const ModelConfig& model, const Layout& layout, int stage, int chunk);

}  // namespace moeplan::planner::internal
