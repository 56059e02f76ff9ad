// moeplan-exec --model --layout --check (exec_model_check.h).
#include "exec_model_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/executor/check.h"
#include "moeplan/proto/convert.h"

namespace moeplan::exec {
namespace {

namespace ex = executor;
namespace p = planner;

// One variant's instances after --warmup + 1 iterations, on every rank.
std::vector<ex::InstanceResults> RunOnce(const Args& a, const p::ModelConfig& model,
                                         const p::VariantPlan& plan, MakeRunner make) {
  std::unique_ptr<ex::ModelRunner> r = make(model, plan);
  for (int i = 0; i <= a.warmup; ++i) {
    if (absl::Status st = r->RunIteration(); !st.ok()) Abort(st);
  }
  absl::StatusOr<std::vector<ex::InstanceResults>> got = r->GlobalResults();
  if (!got.ok()) Abort(got.status());
  return *std::move(got);
}

}  // namespace

absl::StatusOr<p::Layout> CheckReference(const Args& a, const p::ModelConfig& model,
                                         const p::Layout& layout) {
  const auto& moe = model.moe;
  if (!moe.dropless && moe.capacity_factor * moe.top_k < moe.num_experts) {
    return absl::InvalidArgumentError(
        Cat("--check: layouts are compared only when no token is dropped (S1, which a folded "
            "expert grid runs, applies capacity per rank): moe.capacity_factor * moe.top_k must be "
            ">= moe.num_experts, or moe.dropless true (got ",
            moe.capacity_factor, " * ", moe.top_k, " < ", moe.num_experts, ")"));
  }
  p::Layout ref;
  if (!a.check_against.empty()) {
    MOEPLAN_ASSIGN_OR_RETURN(ref, LayoutOfFlag("--check-against", a.check_against));
  } else {
    ref = ex::PlainLayout(layout);
    if (moe.num_experts % ref.ep != 0) {
      return absl::InvalidArgumentError(
          Cat("--check: the plain layout ties the expert grid to the attention grid (ep = dp = ",
              ref.ep, ", esp = tp), but ep must divide moe.num_experts (", moe.num_experts,
              "); name the reference with --check-against"));
    }
  }
  // Instances are compared token for token: the same MP groups, micro-batches
  // and pipeline stages on both sides.
  const p::Layout l = p::ResolveLayout(layout), r = p::ResolveLayout(ref);
  if (r.tp != l.tp || r.dp != l.dp || r.cp != l.cp || r.pp != l.pp ||
      r.microbatches != l.microbatches) {
    return absl::InvalidArgumentError(
        Cat("--check-against: must have the checked layout's tp, dp, cp, pp and microbatches "
            "(the same tokens on the same ranks) (got tp=",
            r.tp, ",dp=", r.dp, ",cp=", r.cp, ",pp=", r.pp, ",microbatches=", r.microbatches,
            " against tp=", l.tp, ",dp=", l.dp, ",cp=", l.cp, ",pp=", l.pp,
            ",microbatches=", l.microbatches, ")"));
  }
  return ref;
}

v1::LayoutCheck CheckLayout(const Args& a, const CheckSide& run, const CheckSide& reference,
                            const p::Layout& reference_layout, ex::DType dtype, MakeRunner make) {
  v1::LayoutCheck out;
  *out.mutable_reference() =
      proto::LayoutToProto(p::ResolveLayout(reference_layout), reference.model->micro_batch_size);
  const double tol = dtype == ex::DType::kF32 ? 1e-4 : 5e-2;
  out.set_tolerance(tol);
  bool passed = true;
  for (size_t v = 0; v < run.plans.size(); ++v) {
    const std::vector<ex::InstanceResults> ref =
        RunOnce(a, *reference.model, reference.plans[v], make);
    const std::vector<ex::InstanceResults> got = RunOnce(a, *run.model, run.plans[v], make);
    for (const ex::InstanceDiff& d : ex::CompareInstances(ref, got)) {
      v1::InstanceCheck* ic = out.add_instances();
      ic->set_variant(std::string(p::VariantName(run.plans[v].variant)));
      ic->set_block(d.layer.block);
      ic->set_microbatch(d.layer.mb);
      bool ok = !d.missing;
      for (const ex::TensorDiff& t : d.tensors) {
        v1::TensorCheck* tc = ic->add_tensors();
        tc->set_tensor(t.tensor);
        tc->set_max_abs_diff(t.max_abs_diff);
        tc->set_max_abs_ref(t.max_abs_ref);
        tc->set_passed(t.max_abs_diff <= tol * t.max_abs_ref);
        ok = ok && tc->passed();
      }
      if (d.missing) ic->add_tensors()->set_note("only one of the two runs has this instance");
      ic->set_passed(ok);
      passed = passed && ok;
    }
  }
  out.set_passed(passed);
  return out;
}

std::string RenderLayoutCheck(const v1::LayoutCheck& c) {
  const v1::Layout& r = c.reference();
  std::string out =
      fmt::format("\ncheck against dp={},tp={},pp={},ep={},esp={}{}{} ({}): ", r.dp(), r.tp(),
                  r.pp(), r.ep(), r.esp(), r.sequence_parallel() ? ",sp=1" : "",
                  r.a2a_overlap() ? ",a2a_overlap=1" : "", r.family());
  double worst = 0.0;
  int failed = 0;
  for (const v1::InstanceCheck& ic : c.instances()) {
    failed += ic.passed() ? 0 : 1;
    for (const v1::TensorCheck& t : ic.tensors()) {
      if (t.max_abs_ref() > 0) worst = std::max(worst, t.max_abs_diff() / t.max_abs_ref());
      if (!t.passed()) {
        out += fmt::format("\n  {} block {} micro-batch {}: {} {}", ic.variant(), ic.block(),
                           ic.microbatch(), t.tensor(),
                           t.note().empty() ? fmt::format("differs by {:.3g} (max |ref| {:.3g})",
                                                          t.max_abs_diff(), t.max_abs_ref())
                                            : t.note());
      }
    }
  }
  out += fmt::format(
      "{}{}: {} MoE layer instance(s), {} of them differing (y, dx, dgate, dw1, "
      "dw2); largest difference {:.2g} of a tensor's max |value| (tolerance "
      "{:.0e})\n",
      failed > 0 ? "\n  " : "", c.passed() ? "passed" : "FAILED", c.instances_size(), failed, worst,
      c.tolerance());
  return out;
}

}  // namespace moeplan::exec
