// Compute kernels of the MoE layer (docs/executor.md): GEMM, gating (softmax, top-k,
// capacity with exact dropping), order / i-order into the (E, T, M) dispatch
// buffer, the expert FFN shard and their backward passes. CpuKernels (Eigen) and
// CudaKernels (cuBLAS + small kernels) implement it.
//
// All pointers are memory of the kernels' Device; all work is issued on its
// compute lane. Matrices are row-major.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "moeplan/executor/device.h"

namespace moeplan::executor {

// Routing of S tokens to k experts each (arrays of the device, S*k entries in
// token-major order: entry s*k + j is token s's j-th choice).
struct RouteBuffers {
  float* probs = nullptr;     // [S x E] softmax of the logits
  int32_t* expert = nullptr;  // [S x k] chosen experts, by decreasing probability
  int32_t* slot = nullptr;    // [S x k] slot in the expert's capacity, -1 = dropped
  float* weight = nullptr;    // [S x k] the chosen expert's probability
};

// The dispatch buffer: capacity T slots per expert, stored as `parts` blocks of
// [E][T/parts][M] (parts = 1: plain [E][T][M]; S2 splits T over the MP ranks so
// rank i owns block i). Slot t of expert e lives in block t / (T/parts), row
// t % (T/parts). T must be a multiple of parts.
struct BufferShape {
  int64_t tokens = 0;    // S
  int64_t model = 0;     // M
  int64_t experts = 0;   // E
  int64_t top_k = 0;     // k
  int64_t capacity = 0;  // T
  int64_t parts = 1;
  DType dtype = DType::kF32;

  int64_t BufferElements() const { return experts * capacity * model; }
};

// The expert FFN shard over G groups of rows, each group [El][R][M] contiguous
// (group stride El*R*M elements): local expert l of group g is R rows.
//   GELU experts (gated false): w1 [El][M][Hs], w2 [El][Hs][M]; z and a
//   (pre/post activation) [G][El][R][Hs].
//   SwiGLU experts (gated true, Megatron-Core's gated_linear_unit): the first
//   GEMM is twice as wide. w1 [El][M][2Hs], each row [gate | up]: columns
//   0..Hs-1 the gate shard, Hs..2Hs-1 the up shard; z (and dz)
//   [G][El][R][2Hs], each row [z_gate | z_up]; a = silu(z_gate) * z_up
//   [G][El][R][Hs]; w2 [El][Hs][M] as for GELU.
struct ExpertShape {
  int64_t groups = 1;         // G
  int64_t local_experts = 1;  // El = E / ep
  int64_t rows = 0;           // R
  int64_t model = 0;          // M
  int64_t shard = 0;          // Hs = H / esp
  DType dtype = DType::kF32;
  bool gated = false;  // SwiGLU experts

  // Columns of w1 and z: 2Hs gated, Hs otherwise.
  int64_t FirstWidth() const { return gated ? 2 * shard : shard; }
  int64_t TokenElements() const { return groups * local_experts * rows * model; }
  int64_t HiddenElements() const { return groups * local_experts * rows * shard; }  // a
  // z and dz.
  int64_t PreActivationElements() const { return groups * local_experts * rows * FirstWidth(); }
  int64_t W1Elements() const { return local_experts * model * FirstWidth(); }  // w1, dw1
  int64_t W2Elements() const { return local_experts * shard * model; }         // w2, dw2
};

// The activation: GELU, tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline constexpr std::string_view kActivation = "gelu_tanh";
// The gated experts' activation: SwiGLU, silu(g) * u with silu(g) = g sigmoid(g),
// silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g))).
inline constexpr std::string_view kGatedActivation = "swiglu";

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual std::string_view name() const = 0;  // "cpu-eigen", "cuda-cublas"
  virtual bool Supports(DType t) const = 0;

  // c = alpha * op(a) * op(b) + beta * c, op(a) m x k, op(b) k x n, c m x n;
  // lda/ldb/ldc are row strides in elements; all three of type t.
  virtual absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                            float beta, void* c, int64_t ldc, DType t) = 0;

  // Gating on fp32 logits [S x E]: probs = row softmax; each token's top-k
  // experts by probability (ties: the lower expert index first); slots are
  // handed out choice by choice — all tokens' first choices in token order,
  // then all second choices, ... — and an expert keeps its first `capacity`
  // assignments; later ones are dropped (slot -1, weight still set).
  virtual absl::Status Route(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                             int64_t capacity, const RouteBuffers& r) = 0;
  // Gate backward through the chosen probabilities: g[s][e] = dweight[s*k+j]
  // where e = expert[s*k+j] and the choice was kept, else 0;
  // dlogits[s][e] = p[s][e] * (g[s][e] - sum_e' p[s][e'] g[s][e']).
  virtual absl::Status RouteBackward(const RouteBuffers& r, const float* dweight, int64_t tokens,
                                     int64_t experts, int64_t top_k, float* dlogits) = 0;

  // buf (zeroed first) gets x[s] at (expert, slot) of every kept choice.
  virtual absl::Status Order(const void* x, const RouteBuffers& r, const BufferShape& s,
                             void* buf) = 0;
  // y[s] = sum over kept choices of weight * buf[expert, slot] (overwrites y).
  virtual absl::Status IOrder(const void* buf, const RouteBuffers& r, const BufferShape& s,
                              void* y) = 0;
  // Backward of IOrder: dbuf (zeroed first) gets weight * dy[s] at each kept
  // choice's slot; dweight[s*k+j] = <dy[s], out_buf[expert, slot]> (0 if dropped).
  virtual absl::Status IOrderBackward(const void* dy, const void* out_buf, const RouteBuffers& r,
                                      const BufferShape& s, void* dbuf, float* dweight) = 0;
  // Backward of Order: dx[s] = sum over kept choices of dbuf[expert, slot]
  // (overwrites dx; 0 for a token with every choice dropped).
  virtual absl::Status OrderBackward(const void* dbuf, const RouteBuffers& r, const BufferShape& s,
                                     void* dx) = 0;

  // Expert forward: z = x W1[l], a = gelu(z) (gated: a = silu(z_gate) *
  // z_up), out = a W2[l].
  virtual absl::Status ExpertForward(const ExpertShape& e, const void* x, const void* w1,
                                     const void* w2, void* z, void* a, void* out) = 0;
  // Input gradients: da = dout W2[l]^T, dz = da * gelu'(z) (gated: dz_gate =
  // da * z_up * silu'(z_gate), dz_up = da * silu(z_gate), dz 2Hs wide),
  // dx = dz W1[l]^T. dz must not overlap z.
  virtual absl::Status ExpertBackwardData(const ExpertShape& e, const void* dout, const void* w1,
                                          const void* w2, const void* z, void* dz, void* dx) = 0;
  // The expert's activation alone, over `count` elements of type t (the
  // profiler times it; ExpertForward / ExpertBackwardData apply the same code):
  // a = gelu(z), and dz = dz * gelu'(z) in place.
  virtual absl::Status Activation(const void* z, void* a, int64_t count, DType t) = 0;
  virtual absl::Status ActivationBackward(const void* z, void* dz, int64_t count, DType t) = 0;
  // The gated activation alone over `rows` rows (the dropless experts' ragged
  // blocks; the same code as the gated expert kernels): z [rows][2*width],
  // each row [gate | up], a [rows][width] = silu(gate) * up. The backward works
  // in place on dz [rows][2*width], whose up half holds da on entry:
  // dz_gate = da * up * silu'(gate), dz_up = da * silu(gate).
  virtual absl::Status GatedActivation(const void* z, void* a, int64_t rows, int64_t width,
                                       DType t) = 0;
  virtual absl::Status GatedActivationBackward(const void* z, void* dz, int64_t rows, int64_t width,
                                               DType t) = 0;
  // Weight gradients summed over all groups, scaled:
  // dw2[l] = scale * sum_g a^T dout, dw1[l] = scale * sum_g x^T dz (overwrite;
  // gated: dw1 [M][2Hs] from the 2Hs-wide dz).
  virtual absl::Status ExpertBackwardWeights(const ExpertShape& e, const void* x, const void* a,
                                             const void* dout, const void* dz, float scale,
                                             void* dw1, void* dw2) = 0;

  // dst[i] = float(src[i]) for `count` elements of type t (f32: a copy).
  virtual absl::Status ToF32(const void* src, DType t, float* dst, int64_t count) = 0;
  // y[i] = T(float(y[i]) + x[i]) for y of type t.
  virtual absl::Status AddF32(void* y, DType t, const float* x, int64_t count) = 0;
};

}  // namespace moeplan::executor
