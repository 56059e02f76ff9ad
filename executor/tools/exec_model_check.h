// moeplan-exec --model --layout --check: a layout's program and a plain
// layout's program run on the same seeded inputs, every MoE layer instance
// compared world-wide (docs/executor.md "Layouts checked").
#pragma once

#include <memory>
#include <span>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "exec_common.h"
#include "moeplan/executor/model_runner.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/v1/exec.pb.h"

namespace moeplan::exec {

// What --check holds `layout` against: --check-against's layout, else the
// plain one: no sequence parallelism, no A2A overlap, the AlltoAll
// dispatcher, the expert grid tied to the attention grid (esp = tp, ep = dp).
// The model must drop no token (moe.capacity_factor * top_k >= num_experts,
// or dropless): S1, which a folded grid runs, applies capacity per rank.
// InvalidArgument naming the flag or field otherwise.
absl::StatusOr<planner::Layout> CheckReference(const Args& a, const planner::ModelConfig& model,
                                               const planner::Layout& layout);

// One side of the check: the model as each stage runs it and its variants' plans.
struct CheckSide {
  const planner::ModelConfig* model = nullptr;
  std::span<const planner::VariantPlan> plans;
};
using MakeRunner = absl::FunctionRef<std::unique_ptr<executor::ModelRunner>(
    const planner::ModelConfig&, const planner::VariantPlan&)>;

// Collective: each variant of both sides runs --warmup + 1 iterations, its
// instances are assembled over the world and compared (tolerance 1e-4 of the
// reference tensor's max |value| in f32, 5e-2 in bf16). Every rank returns
// the same check; a failure inside a run aborts the job.
v1::LayoutCheck CheckLayout(const Args& a, const CheckSide& run, const CheckSide& reference,
                            const planner::Layout& reference_layout, executor::DType dtype,
                            MakeRunner make);

// The check's lines under moeplan-exec's table.
std::string RenderLayoutCheck(const v1::LayoutCheck& check);

}  // namespace moeplan::exec
