// The compute-op costs every MoE schedule shares (schedules.cc): the gate,
// order / i-order, local splits and the expert FFN shard, with FP8
// training's expert GEMMs and casts (docs/model.md "FP8 training").
#pragma once

#include <cmath>
#include <cstdint>

#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/schedules.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner::internal {

// FP8 training's quantization of a linear layer's input (or, in the
// backward, of its output gradient) of `elements`: a memory-bound cast that
// reads the bytes_per_element copy and writes two 1-byte ones, row-wise for
// this GEMM and column-wise for the weight gradient's (docs/model.md "FP8
// training"). The experts' (Kernels) and the dense linear layers' (GemmOf).
inline double Fp8CastBytes(double elements, double bytes_per_element) {
  return elements * (bytes_per_element + 2.0);
}

// Compute-op costs shared by all schedules. Sizes in elements, b bytes each.
class Kernels {
 public:
  explicit Kernels(const LayerContext& ctx)
      : l_(*ctx.layer),
        c_(*ctx.cost),
        g_(ctx.fp8_gemm != nullptr ? *ctx.fp8_gemm : *ctx.cost),
        fp8_(ctx.fp8_gemm != nullptr) {
    b_ = l_.bytes_per_element;
  }

  // Gate: logits GEMM [S x M]·[M x E], then softmax and top-k over S x E
  // (read logits, write probabilities, read them for top-k: 3 S E b bytes).
  double GateBytes(int64_t s) const { return 3.0 * s * l_.num_experts * b_; }
  double GateFwd(int64_t s) const {
    return c_.GemmUs(s, l_.num_experts, l_.model_dim) + c_.RouteUs(GateBytes(s));
  }
  // dX = dL·Wg^T and dWg = X^T·dL, plus the softmax backward (charged like
  // the forward's softmax and top-k: the same small per-token kernels).
  double GateBwd(int64_t s) const {
    return c_.GemmUs(s, l_.model_dim, l_.num_experts) + c_.GemmUs(l_.model_dim, l_.num_experts, s) +
           c_.RouteUs(GateBytes(s));
  }
  // Order / i-order: scatter S tokens into the (E, T, M) buffer or gather back.
  double OrderBytes(int64_t s, int64_t t) const {
    return static_cast<double>(s) * l_.model_dim * b_ +
           static_cast<double>(l_.num_experts) * t * l_.model_dim * b_;
  }
  // Scatter (fwd.order) and gather (fwd.iorder; bwd.order gathers the
  // dispatch gradient back).
  double Scatter(int64_t s, int64_t t) const { return c_.OrderUs(OrderBytes(s, t), false); }
  double Gather(int64_t s, int64_t t) const { return c_.OrderUs(OrderBytes(s, t), true); }
  // bwd.iorder scatters the output gradient like fwd.order and also reads the
  // combined expert outputs for the gate weights' gradient (one dot product
  // per routed row): the dispatch buffer is touched twice.
  double UnrouteBytes(int64_t s, int64_t t) const {
    return OrderBytes(s, t) + static_cast<double>(l_.num_experts) * t * l_.model_dim * b_;
  }
  double Unroute(int64_t s, int64_t t) const { return c_.OrderUs(UnrouteBytes(s, t), false); }
  // A local split copies its slice: read + write.
  double Split(double slice_bytes) const { return c_.MemoryBoundUs(2.0 * slice_bytes); }

  // Expert FFN shard on `rows` tokens per local expert: [rows x M]·[M x gH'] and
  // [rows x H']·[H' x M] for each of E / ep local experts, plus the activation
  // (g = 2 with a gated linear unit: the first GEMM projects to gate and up,
  // silu(gate) * up reads both and writes H').
  int64_t LocalExperts() const { return l_.num_experts / l_.parallel.ep; }
  int64_t Shard() const { return l_.hidden_dim / l_.parallel.esp; }
  int64_t Glu() const { return l_.gated_linear_unit ? 2 : 1; }
  double ActBytes(int64_t rows) const {
    return static_cast<double>(LocalExperts()) * rows * Shard() * b_;
  }
  // FP8: each GEMM's input (forward) or output gradient (dX) of `elements`
  // per local expert quantized first, a memory-bound cast reading b bytes
  // and writing the row- and column-wise 1-byte copies (dW reads those).
  double Cast(double elements) const {
    return fp8_ ? c_.MemoryBoundUs(Fp8CastBytes(static_cast<double>(LocalExperts()) * elements, b_))
                : 0.0;
  }
  double ExpertFwd(int64_t rows) const {
    const int64_t h = Shard(), m = l_.model_dim;
    return LocalExperts() * (g_.GemmUs(rows, Glu() * h, m) + g_.GemmUs(rows, m, h)) +
           c_.ActivationUs((1.0 + Glu()) * ActBytes(rows), /*backward=*/false) +
           Cast(static_cast<double>(rows) * (m + h));
  }
  // Input gradients: the two GEMMs transposed, and the activation backward
  // (reads its input and the output gradient, writes the input gradient).
  double ExpertDx(int64_t rows) const {
    const int64_t h = Shard(), m = l_.model_dim;
    return LocalExperts() * (g_.GemmUs(rows, h, m) + g_.GemmUs(rows, m, Glu() * h)) +
           c_.ActivationUs((1.0 + 2.0 * Glu()) * ActBytes(rows), /*backward=*/true) +
           Cast(static_cast<double>(rows) * (m + Glu() * h));
  }
  // Weight gradients: dW2 = A^T·dY [H' x M], dW1 = X^T·dA [M x gH'], reducing over rows.
  double ExpertDw(int64_t rows) const {
    const int64_t h = Shard(), m = l_.model_dim;
    return LocalExperts() * (g_.GemmUs(h, m, rows) + g_.GemmUs(m, Glu() * h, rows));
  }
  double ExpertBytes(int64_t rows) const {
    return static_cast<double>(LocalExperts()) * rows * l_.model_dim * b_ * 2.0 +
           (1.0 + Glu()) * ActBytes(rows);
  }
  // Dropless token skew scales the heaviest rank's expert-side rows (a padded
  // buffer holds T rows however the tokens were routed).
  int64_t Skewed(int64_t rows) const {
    return static_cast<int64_t>(std::ceil(static_cast<double>(rows) * ExpertSkew(l_) - 1e-9));
  }

 private:
  const LayerConfig& l_;
  const CostModel& c_;
  const CostModel& g_;  // the experts' GEMMs: c_, or the FP8 copy
  bool fp8_;
  int b_;
};

}  // namespace moeplan::planner::internal
