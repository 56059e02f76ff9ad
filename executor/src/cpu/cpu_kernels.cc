// CPU kernels (docs/executor.md): Eigen GEMMs on host memory, plain loops for gating,
// order / i-order and the elementwise parts. fp32 only: the CPU backend is the
// correctness reference and the small-scale runner, so bf16 is not worth an
// emulation path here.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "../kernel_checks.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/kernels.h"

namespace moeplan::executor {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using ConstStridedMap = Eigen::Map<const RowMat, Eigen::Unaligned, Stride>;
using StridedMap = Eigen::Map<RowMat, Eigen::Unaligned, Stride>;
using ConstMatMap = Eigen::Map<const RowMat, Eigen::Unaligned>;
using MatMap = Eigen::Map<RowMat, Eigen::Unaligned>;

// sqrt(2 / pi) and the cubic coefficient of the tanh form of GELU.
constexpr float kGeluC = 0.7978845608028654f;
constexpr float kGeluA = 0.044715f;

// GELU(x) = 0.5 x (1 + t), t = tanh(c (x + a x^3)); its derivative is
// 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2). Both run as Eigen array
// expressions (vectorised tanh: a scalar std::tanh per element made the
// activation ~15 % of the expert's time) over chunks small enough to stay in L1.
constexpr int64_t kActChunk = 1024;
using ActChunk = Eigen::Array<float, kActChunk, 1>;
using ConstVec = Eigen::Map<const Eigen::ArrayXf>;
using Vec = Eigen::Map<Eigen::ArrayXf>;

// a = gelu(z) over n elements.
void GeluForward(const float* z, float* a, int64_t n) {
  for (int64_t i = 0; i < n; i += kActChunk) {
    const int64_t len = std::min(kActChunk, n - i);
    const ConstVec za(z + i, len);
    Vec(a + i, len) = 0.5f * za * (1.0f + (kGeluC * (za + kGeluA * za.cube())).tanh());
  }
}

// dz *= gelu'(z) over n elements. tanh is evaluated once per element into a
// stack chunk: as one expression Eigen evaluated it twice (for 1 + t and
// 1 - t^2), which made the backward activation twice the forward's cost.
void GeluBackwardInPlace(const float* z, float* dz, int64_t n) {
  ActChunk t;
  for (int64_t i = 0; i < n; i += kActChunk) {
    const int64_t len = std::min(kActChunk, n - i);
    const ConstVec za(z + i, len);
    auto tt = t.head(len);
    tt = (kGeluC * (za + kGeluA * za.cube())).tanh();
    Vec(dz + i, len) *= 0.5f * (1.0f + tt) + 0.5f * za * (1.0f - tt.square()) * kGeluC *
                                                 (1.0f + 3.0f * kGeluA * za.square());
  }
}

// SwiGLU over `rows` rows of z = [g | u] (2w wide): a = silu(g) * u, w wide,
// silu(g) = g sigmoid(g).
void SwigluForward(const float* z, float* a, int64_t rows, int64_t w) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < w; i += kActChunk) {
      const int64_t len = std::min(kActChunk, w - i);
      const ConstVec g(z + r * 2 * w + i, len), u(z + r * 2 * w + w + i, len);
      Vec(a + r * w + i, len) = g * u / (1.0f + (-g).exp());
    }
  }
}

// In place on dz = [dg | du] rows whose du half holds da on entry:
// dg = da * u * silu'(g), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g),
// then du = da * silu(g). The sigmoid is evaluated once into a stack chunk.
void SwigluBackwardInPlace(const float* z, float* dz, int64_t rows, int64_t w) {
  ActChunk s;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < w; i += kActChunk) {
      const int64_t len = std::min(kActChunk, w - i);
      const int64_t off = r * 2 * w + i;
      const ConstVec g(z + off, len), u(z + off + w, len);
      Vec dg(dz + off, len), du(dz + off + w, len);
      auto ss = s.head(len);
      ss = (1.0f + (-g).exp()).inverse();
      dg = du * u * ss * (1.0f + g * (1.0f - ss));
      du *= g * ss;
    }
  }
}

using internal::ArgCheck;

// The CPU backend computes in fp32 only (see the top of this file).
absl::Status CheckF32(const ArgCheck& check, DType t) { return check.Type(t, t == DType::kF32); }

// The shared buffer checks, then the routing entries the order kernels follow:
// an out-of-range expert or slot would write outside the buffer.
absl::Status CheckBuffer(const ArgCheck& check, const BufferShape& s, const RouteBuffers& r,
                         bool needs_weight) {
  MOEPLAN_RETURN_IF_ERROR(CheckF32(check, s.dtype));
  MOEPLAN_RETURN_IF_ERROR(check.Buffer(s));
  const int64_t choices = s.tokens * s.top_k;
  MOEPLAN_RETURN_IF_ERROR(check.Routing(r, choices, needs_weight));
  for (int64_t i = 0; i < choices; ++i) {
    if (r.expert[i] < 0 || r.expert[i] >= s.experts) {
      return check.Bad(Cat("expert[", i, "] (", r.expert[i], ") must be in [0, ", s.experts, ")"));
    }
    if (r.slot[i] < -1 || r.slot[i] >= s.capacity) {
      return check.Bad(Cat("slot[", i, "] (", r.slot[i], ") must be in [-1, ", s.capacity, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckExpert(const ArgCheck& check, const ExpertShape& e) {
  MOEPLAN_RETURN_IF_ERROR(CheckF32(check, e.dtype));
  return check.Expert(e);
}

// The gated activation's arguments: f32, rows >= 0 and width >= 0.
absl::Status CheckRows(const ArgCheck& check, int64_t rows, int64_t width, DType t) {
  MOEPLAN_RETURN_IF_ERROR(CheckF32(check, t));
  MOEPLAN_RETURN_IF_ERROR(check.NonNegative("rows", rows));
  return check.NonNegative("width", width);
}

// Element offset of (expert e, slot t) in the `parts`-block dispatch buffer.
int64_t SlotOffset(const BufferShape& s, int64_t e, int64_t t) {
  const int64_t per_part = s.capacity / s.parts;
  const int64_t p = t / per_part;
  return ((p * s.experts + e) * per_part + t % per_part) * s.model;
}

class CpuKernels final : public Kernels {
 public:
  std::string_view name() const override { return "cpu-eigen"; }
  bool Supports(DType t) const override { return t == DType::kF32; }

  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
                    int64_t ldc, DType t) override {
    constexpr ArgCheck check("cpu", "Gemm");
    MOEPLAN_RETURN_IF_ERROR(CheckF32(check, t));
    MOEPLAN_RETURN_IF_ERROR(check.NonNegative("m", m));
    MOEPLAN_RETURN_IF_ERROR(check.NonNegative("n", n));
    MOEPLAN_RETURN_IF_ERROR(check.NonNegative("k", k));
    // Stored shapes: a is m x k (k x m when transposed), b is k x n (n x k).
    const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
    const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("a", a, m * k));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("b", b, k * n));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("c", c, m * n));
    if (m * k > 0 && lda < a_cols) {
      return check.Bad(Cat("lda (", lda, ") must be >= ", a_cols, " (columns of stored a)"));
    }
    if (k * n > 0 && ldb < b_cols) {
      return check.Bad(Cat("ldb (", ldb, ") must be >= ", b_cols, " (columns of stored b)"));
    }
    if (m * n > 0 && ldc < n) return check.Bad(Cat("ldc (", ldc, ") must be >= n (", n, ")"));
    if (m * n == 0) return absl::OkStatus();

    StridedMap cm(static_cast<float*>(c), m, n, Stride(ldc));
    // beta == 0 overwrites (BLAS semantics): NaN or garbage in c must not leak.
    if (beta == 0.0f) {
      cm.setZero();
    } else if (beta != 1.0f) {
      cm *= beta;
    }
    // Like BLAS, alpha == 0 (or k == 0) does not read a and b at all.
    if (alpha == 0.0f || k == 0) return absl::OkStatus();
    ConstStridedMap am(static_cast<const float*>(a), a_rows, a_cols, Stride(lda));
    ConstStridedMap bm(static_cast<const float*>(b), b_rows, b_cols, Stride(ldb));
    // Eigen folds the transposes and alpha into one GEMM call; no temporaries.
    if (!trans_a && !trans_b) {
      cm.noalias() += alpha * am * bm;
    } else if (trans_a && !trans_b) {
      cm.noalias() += alpha * am.transpose() * bm;
    } else if (!trans_a && trans_b) {
      cm.noalias() += alpha * am * bm.transpose();
    } else {
      cm.noalias() += alpha * am.transpose() * bm.transpose();
    }
    return absl::OkStatus();
  }

  absl::Status Route(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                     int64_t capacity, const RouteBuffers& r) override {
    constexpr ArgCheck check("cpu", "Route");
    MOEPLAN_RETURN_IF_ERROR(check.Gating(tokens, experts, top_k));
    MOEPLAN_RETURN_IF_ERROR(check.NonNegative("capacity", capacity));
    const int64_t n = tokens * experts, choices = tokens * top_k;
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("logits", logits, n));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("probs", r.probs, n));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("expert", r.expert, choices));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("slot", r.slot, choices));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("weight", r.weight, choices));

    for (int64_t s = 0; s < tokens; ++s) {
      const float* x = logits + s * experts;
      float* p = r.probs + s * experts;
      // Subtracting the row max keeps exp() finite for any logit range.
      float mx = x[0];
      for (int64_t e = 1; e < experts; ++e) mx = std::max(mx, x[e]);
      double sum = 0.0;
      for (int64_t e = 0; e < experts; ++e) {
        p[e] = std::exp(x[e] - mx);
        sum += p[e];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t e = 0; e < experts; ++e) p[e] *= inv;

      // Top-k by repeated selection (k is small): a strict '>' while scanning
      // upwards gives ties to the lower expert index; a NaN never wins, so a
      // valid expert is still chosen.
      int32_t* chosen = r.expert + s * top_k;
      for (int64_t j = 0; j < top_k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < experts; ++e) {
          if (std::find(chosen, chosen + j, static_cast<int32_t>(e)) != chosen + j) continue;
          if (best < 0 || p[e] > p[best]) best = e;
        }
        chosen[j] = static_cast<int32_t>(best);
        r.weight[s * top_k + j] = p[best];
      }
    }

    // Capacity, choice-major: every token's first choice is served before any
    // second choice, so a token's top expert is never displaced by another
    // token's runner-up.
    fill_.assign(static_cast<size_t>(experts), 0);
    for (int64_t j = 0; j < top_k; ++j) {
      for (int64_t s = 0; s < tokens; ++s) {
        const int64_t i = s * top_k + j;
        int64_t& used = fill_[static_cast<size_t>(r.expert[i])];
        r.slot[i] = used < capacity ? static_cast<int32_t>(used++) : -1;
      }
    }
    return absl::OkStatus();
  }

  absl::Status RouteBackward(const RouteBuffers& r, const float* dweight, int64_t tokens,
                             int64_t experts, int64_t top_k, float* dlogits) override {
    constexpr ArgCheck check("cpu", "RouteBackward");
    MOEPLAN_RETURN_IF_ERROR(check.Gating(tokens, experts, top_k));
    const int64_t n = tokens * experts, choices = tokens * top_k;
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("probs", r.probs, n));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("expert", r.expert, choices));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("slot", r.slot, choices));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("dweight", dweight, choices));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("dlogits", dlogits, n));
    for (int64_t i = 0; i < choices; ++i) {
      if (r.expert[i] < 0 || r.expert[i] >= experts) {
        return check.Bad(Cat("expert[", i, "] (", r.expert[i], ") must be in [0, ", experts, ")"));
      }
    }

    grad_.resize(static_cast<size_t>(experts));
    for (int64_t s = 0; s < tokens; ++s) {
      const float* p = r.probs + s * experts;
      std::fill(grad_.begin(), grad_.end(), 0.0f);
      for (int64_t j = 0; j < top_k; ++j) {
        const int64_t i = s * top_k + j;
        // Dropped choices contribute nothing to the output, hence no gradient.
        if (r.slot[i] >= 0) grad_[static_cast<size_t>(r.expert[i])] += dweight[i];
      }
      double dot = 0.0;
      for (int64_t e = 0; e < experts; ++e) dot += static_cast<double>(p[e]) * grad_[e];
      float* d = dlogits + s * experts;
      for (int64_t e = 0; e < experts; ++e) {
        d[e] = p[e] * (grad_[e] - static_cast<float>(dot));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Order(const void* x, const RouteBuffers& r, const BufferShape& s,
                     void* buf) override {
    constexpr ArgCheck check("cpu", "Order");
    MOEPLAN_RETURN_IF_ERROR(CheckBuffer(check, s, r, false));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("x", x, s.tokens * s.model));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("buf", buf, s.BufferElements()));
    const float* xf = static_cast<const float*>(x);
    float* bf = static_cast<float*>(buf);
    // Unused slots must read as zero rows: the experts run on the whole buffer.
    std::fill(bf, bf + s.BufferElements(), 0.0f);
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t j = 0; j < s.top_k; ++j) {
        const int64_t i = t * s.top_k + j;
        if (r.slot[i] < 0) continue;
        std::copy_n(xf + t * s.model, s.model, bf + SlotOffset(s, r.expert[i], r.slot[i]));
      }
    }
    return absl::OkStatus();
  }

  absl::Status IOrder(const void* buf, const RouteBuffers& r, const BufferShape& s,
                      void* y) override {
    constexpr ArgCheck check("cpu", "IOrder");
    MOEPLAN_RETURN_IF_ERROR(CheckBuffer(check, s, r, true));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("buf", buf, s.BufferElements()));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("y", y, s.tokens * s.model));
    const float* bf = static_cast<const float*>(buf);
    float* yf = static_cast<float*>(y);
    for (int64_t t = 0; t < s.tokens; ++t) {
      float* yr = yf + t * s.model;
      std::fill(yr, yr + s.model, 0.0f);
      for (int64_t j = 0; j < s.top_k; ++j) {
        const int64_t i = t * s.top_k + j;
        if (r.slot[i] < 0) continue;
        const float w = r.weight[i];
        const float* br = bf + SlotOffset(s, r.expert[i], r.slot[i]);
        for (int64_t c = 0; c < s.model; ++c) yr[c] += w * br[c];
      }
    }
    return absl::OkStatus();
  }

  absl::Status IOrderBackward(const void* dy, const void* out_buf, const RouteBuffers& r,
                              const BufferShape& s, void* dbuf, float* dweight) override {
    constexpr ArgCheck check("cpu", "IOrderBackward");
    MOEPLAN_RETURN_IF_ERROR(CheckBuffer(check, s, r, true));
    const int64_t elems = s.BufferElements();
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("dy", dy, s.tokens * s.model));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("out_buf", out_buf, elems));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("dbuf", dbuf, elems));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("dweight", dweight, s.tokens * s.top_k));
    const float* dyf = static_cast<const float*>(dy);
    const float* of = static_cast<const float*>(out_buf);
    float* db = static_cast<float*>(dbuf);
    // Unused slots get zero gradient (their expert outputs were never read).
    std::fill(db, db + elems, 0.0f);
    for (int64_t t = 0; t < s.tokens; ++t) {
      const float* g = dyf + t * s.model;
      for (int64_t j = 0; j < s.top_k; ++j) {
        const int64_t i = t * s.top_k + j;
        if (r.slot[i] < 0) {
          dweight[i] = 0.0f;
          continue;
        }
        const int64_t off = SlotOffset(s, r.expert[i], r.slot[i]);
        const float w = r.weight[i];
        double dot = 0.0;
        for (int64_t c = 0; c < s.model; ++c) {
          db[off + c] = w * g[c];
          dot += static_cast<double>(g[c]) * of[off + c];
        }
        dweight[i] = static_cast<float>(dot);
      }
    }
    return absl::OkStatus();
  }

  absl::Status OrderBackward(const void* dbuf, const RouteBuffers& r, const BufferShape& s,
                             void* dx) override {
    constexpr ArgCheck check("cpu", "OrderBackward");
    MOEPLAN_RETURN_IF_ERROR(CheckBuffer(check, s, r, false));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("dbuf", dbuf, s.BufferElements()));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("dx", dx, s.tokens * s.model));
    const float* db = static_cast<const float*>(dbuf);
    float* dxf = static_cast<float*>(dx);
    for (int64_t t = 0; t < s.tokens; ++t) {
      float* d = dxf + t * s.model;
      std::fill(d, d + s.model, 0.0f);
      for (int64_t j = 0; j < s.top_k; ++j) {
        const int64_t i = t * s.top_k + j;
        if (r.slot[i] < 0) continue;
        const float* src = db + SlotOffset(s, r.expert[i], r.slot[i]);
        for (int64_t c = 0; c < s.model; ++c) d[c] += src[c];
      }
    }
    return absl::OkStatus();
  }

  absl::Status ExpertForward(const ExpertShape& e, const void* x, const void* w1, const void* w2,
                             void* z, void* a, void* out) override {
    constexpr ArgCheck check("cpu", "ExpertForward");
    MOEPLAN_RETURN_IF_ERROR(CheckExpert(check, e));
    using T = ArgCheck::Tensor;
    MOEPLAN_RETURN_IF_ERROR(check.ExpertPointers(e, {{"x", x, T::kTokens},
                                                     {"w1", w1, T::kW1},
                                                     {"w2", w2, T::kW2},
                                                     {"z", z, T::kPreActivation},
                                                     {"a", a, T::kHidden},
                                                     {"out", out, T::kTokens}}));
    const int64_t R = e.rows, M = e.model, H = e.shard, F = e.FirstWidth();
    for (int64_t g = 0; g < e.groups; ++g) {
      for (int64_t l = 0; l < e.local_experts; ++l) {
        const int64_t block = g * e.local_experts + l;
        ConstMatMap xm(static_cast<const float*>(x) + block * R * M, R, M);
        ConstMatMap w1m(static_cast<const float*>(w1) + l * M * F, M, F);
        ConstMatMap w2m(static_cast<const float*>(w2) + l * H * M, H, M);
        MatMap zm(static_cast<float*>(z) + block * R * F, R, F);
        MatMap am(static_cast<float*>(a) + block * R * H, R, H);
        MatMap om(static_cast<float*>(out) + block * R * M, R, M);
        zm.noalias() = xm * w1m;
        if (e.gated) {
          SwigluForward(zm.data(), am.data(), R, H);
        } else {
          GeluForward(zm.data(), am.data(), R * H);
        }
        om.noalias() = am * w2m;
      }
    }
    return absl::OkStatus();
  }

  absl::Status ExpertBackwardData(const ExpertShape& e, const void* dout, const void* w1,
                                  const void* w2, const void* z, void* dz, void* dx) override {
    constexpr ArgCheck check("cpu", "ExpertBackwardData");
    MOEPLAN_RETURN_IF_ERROR(CheckExpert(check, e));
    using T = ArgCheck::Tensor;
    MOEPLAN_RETURN_IF_ERROR(check.ExpertPointers(e, {{"dout", dout, T::kTokens},
                                                     {"w1", w1, T::kW1},
                                                     {"w2", w2, T::kW2},
                                                     {"z", z, T::kPreActivation},
                                                     {"dz", dz, T::kPreActivation},
                                                     {"dx", dx, T::kTokens}}));
    const int64_t R = e.rows, M = e.model, H = e.shard, F = e.FirstWidth();
    for (int64_t g = 0; g < e.groups; ++g) {
      for (int64_t l = 0; l < e.local_experts; ++l) {
        const int64_t block = g * e.local_experts + l;
        ConstMatMap dom(static_cast<const float*>(dout) + block * R * M, R, M);
        ConstMatMap w1m(static_cast<const float*>(w1) + l * M * F, M, F);
        ConstMatMap w2m(static_cast<const float*>(w2) + l * H * M, H, M);
        const float* zb = static_cast<const float*>(z) + block * R * F;
        MatMap dzm(static_cast<float*>(dz) + block * R * F, R, F);
        MatMap dxm(static_cast<float*>(dx) + block * R * M, R, M);
        // da lands in dz itself (gated: in its up half) and is scaled in
        // place, so no scratch is needed (dz must therefore not overlap z).
        if (e.gated) {
          StridedMap(dzm.data() + H, R, H, Stride(F)).noalias() = dom * w2m.transpose();
          SwigluBackwardInPlace(zb, dzm.data(), R, H);
        } else {
          dzm.noalias() = dom * w2m.transpose();
          GeluBackwardInPlace(zb, dzm.data(), R * H);
        }
        dxm.noalias() = dzm * w1m.transpose();
      }
    }
    return absl::OkStatus();
  }

  absl::Status Activation(const void* z, void* a, int64_t count, DType t) override {
    constexpr ArgCheck check("cpu", "Activation");
    MOEPLAN_RETURN_IF_ERROR(CheckF32(check, t));
    MOEPLAN_RETURN_IF_ERROR(check.NonNegative("count", count));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("z", z, count));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("a", a, count));
    GeluForward(static_cast<const float*>(z), static_cast<float*>(a), count);
    return absl::OkStatus();
  }

  absl::Status ActivationBackward(const void* z, void* dz, int64_t count, DType t) override {
    constexpr ArgCheck check("cpu", "ActivationBackward");
    MOEPLAN_RETURN_IF_ERROR(CheckF32(check, t));
    MOEPLAN_RETURN_IF_ERROR(check.NonNegative("count", count));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("z", z, count));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("dz", dz, count));
    GeluBackwardInPlace(static_cast<const float*>(z), static_cast<float*>(dz), count);
    return absl::OkStatus();
  }

  absl::Status GatedActivation(const void* z, void* a, int64_t rows, int64_t width,
                               DType t) override {
    constexpr ArgCheck check("cpu", "GatedActivation");
    MOEPLAN_RETURN_IF_ERROR(CheckRows(check, rows, width, t));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("z", z, 2 * rows * width));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("a", a, rows * width));
    SwigluForward(static_cast<const float*>(z), static_cast<float*>(a), rows, width);
    return absl::OkStatus();
  }

  absl::Status GatedActivationBackward(const void* z, void* dz, int64_t rows, int64_t width,
                                       DType t) override {
    constexpr ArgCheck check("cpu", "GatedActivationBackward");
    MOEPLAN_RETURN_IF_ERROR(CheckRows(check, rows, width, t));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("z", z, 2 * rows * width));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("dz", dz, 2 * rows * width));
    SwigluBackwardInPlace(static_cast<const float*>(z), static_cast<float*>(dz), rows, width);
    return absl::OkStatus();
  }

  absl::Status ExpertBackwardWeights(const ExpertShape& e, const void* x, const void* a,
                                     const void* dout, const void* dz, float scale, void* dw1,
                                     void* dw2) override {
    constexpr ArgCheck check("cpu", "ExpertBackwardWeights");
    MOEPLAN_RETURN_IF_ERROR(CheckExpert(check, e));
    using T = ArgCheck::Tensor;
    MOEPLAN_RETURN_IF_ERROR(check.ExpertPointers(e, {{"x", x, T::kTokens},
                                                     {"a", a, T::kHidden},
                                                     {"dout", dout, T::kTokens},
                                                     {"dz", dz, T::kPreActivation},
                                                     {"dw1", dw1, T::kW1},
                                                     {"dw2", dw2, T::kW2}}));
    const int64_t R = e.rows, M = e.model, H = e.shard, F = e.FirstWidth();
    for (int64_t l = 0; l < e.local_experts; ++l) {
      MatMap dw1m(static_cast<float*>(dw1) + l * M * F, M, F);
      MatMap dw2m(static_cast<float*>(dw2) + l * H * M, H, M);
      // Overwrite semantics: start from zero and accumulate the groups with the
      // scale folded into each GEMM.
      dw1m.setZero();
      dw2m.setZero();
      for (int64_t g = 0; g < e.groups; ++g) {
        const int64_t block = g * e.local_experts + l;
        ConstMatMap xm(static_cast<const float*>(x) + block * R * M, R, M);
        ConstMatMap am(static_cast<const float*>(a) + block * R * H, R, H);
        ConstMatMap dom(static_cast<const float*>(dout) + block * R * M, R, M);
        ConstMatMap dzm(static_cast<const float*>(dz) + block * R * F, R, F);
        dw2m.noalias() += scale * am.transpose() * dom;
        dw1m.noalias() += scale * xm.transpose() * dzm;
      }
    }
    return absl::OkStatus();
  }

  absl::Status ToF32(const void* src, DType t, float* dst, int64_t count) override {
    constexpr ArgCheck check("cpu", "ToF32");
    MOEPLAN_RETURN_IF_ERROR(CheckF32(check, t));
    MOEPLAN_RETURN_IF_ERROR(check.NonNegative("count", count));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("src", src, count));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("dst", dst, count));
    // memmove: callers may convert in place (src == dst).
    if (count > 0) std::memmove(dst, src, static_cast<size_t>(count) * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status AddF32(void* y, DType t, const float* x, int64_t count) override {
    constexpr ArgCheck check("cpu", "AddF32");
    MOEPLAN_RETURN_IF_ERROR(CheckF32(check, t));
    MOEPLAN_RETURN_IF_ERROR(check.NonNegative("count", count));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("y", y, count));
    MOEPLAN_RETURN_IF_ERROR(check.Pointer("x", x, count));
    float* yf = static_cast<float*>(y);
    for (int64_t i = 0; i < count; ++i) yf[i] += x[i];
    return absl::OkStatus();
  }

 private:
  // Scratch reused across calls (kernels are used from one thread, like a lane).
  std::vector<int64_t> fill_;  // Route: slots handed out per expert
  std::vector<float> grad_;    // RouteBackward: g[e] of one token
};

}  // namespace

std::unique_ptr<Kernels> MakeCpuKernels() { return std::make_unique<CpuKernels>(); }

}  // namespace moeplan::executor
