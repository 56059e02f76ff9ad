// CPU kernels against plain-loop references in double precision, hand-checkable
// routing / layout cases and finite differences of scalar losses.
//
// Tolerances (fp32 kernels, double references):
//  - GEMM-like results: |got - want| <= 1e-5 * sum_i |a_i b_i| (+ |beta c|), i.e.
//    relative to the magnitude of the summed terms, which bounds fp32
//    accumulation error for the inner sizes used here (<= 40) with margin.
//  - Expert kernels: the same 1e-5, with the scale of each input propagated
//    through the chain (see ExpertKernelsMatchReference).
//  - Softmax probabilities: 1e-6 absolute; order / i-order: 1e-6 relative.
//  - Finite differences (central, h = 1e-4, on double references): 2e-5 * (1 + |fd|).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/kernels.h"
#include "moeplan/executor/probe.h"
#include "moeplan/executor/runner.h"

namespace moeplan::executor {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kGeluC = 0.79788456080286535588;  // sqrt(2 / pi)

std::vector<float> Random(std::mt19937& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

double GeluRef(double x) {
  return 0.5 * x * (1.0 + std::tanh(kGeluC * (x + 0.044715 * x * x * x)));
}

// |got[i] - want[i]| <= rtol * scale[i] + atol for every i; reports at most a few.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want,
                 const std::vector<double>& scale, double rtol, double atol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i) {
    const double tol = rtol * (scale.empty() ? std::abs(want[i]) : scale[i]) + atol;
    if (!(std::abs(got[i] - want[i]) <= tol)) {
      ++failures;
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (tol "
                    << tol << ")";
    }
  }
}

// A dense double matrix for the references (row-major).
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), v(static_cast<size_t>(r * c), 0.0) {}
  double& at(int64_t i, int64_t j) { return v[static_cast<size_t>(i * cols + j)]; }
  double at(int64_t i, int64_t j) const { return v[static_cast<size_t>(i * cols + j)]; }
};

// Copies rows x cols of a row-major float block starting at p.
Mat FromFloat(const float* p, int64_t rows, int64_t cols) {
  Mat m(rows, cols);
  for (int64_t i = 0; i < rows * cols; ++i) m.v[static_cast<size_t>(i)] = p[i];
  return m;
}

// c = op(a) op(b) with plain loops; `abs` instead sums |terms| (the error scale).
Mat Mul(const Mat& a, bool ta, const Mat& b, bool tb, bool abs = false) {
  const int64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols;
  const int64_t n = tb ? b.rows : b.cols;
  Mat c(m, n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t l = 0; l < k; ++l) {
        const double t = (ta ? a.at(l, i) : a.at(i, l)) * (tb ? b.at(j, l) : b.at(l, j));
        s += abs ? std::abs(t) : t;
      }
      c.at(i, j) = s;
    }
  }
  return c;
}

// Appends m's entries to out (to assemble [G][El][...] references).
void Append(const Mat& m, std::vector<double>* out) {
  out->insert(out->end(), m.v.begin(), m.v.end());
}

class CpuKernelsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Kernels> k_ = MakeCpuKernels();
};

// The speed probe on the CPU: a 256^3 GEMM, timed, a finite positive rate
// each time it is asked.
TEST(SpeedProbeTest, TimesAFixedGemmOnTheCpu) {
  std::unique_ptr<Device> dev = MakeCpuDevice();
  std::unique_ptr<Kernels> k = MakeCpuKernels();
  absl::StatusOr<SpeedProbe> probe = SpeedProbe::Create(dev.get(), k.get(), DType::kF32);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->dim(), SpeedProbe::kCpuDim);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<double> g = probe->Gflops();
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(std::isfinite(*g) && *g > 0.0) << *g;
  }
}

TEST(SkewBiasTest, IsTheLogOfAZipfLawOverASeededRanking) {
  const std::vector<float> b = SkewBias(8, 1.5, 7);
  ASSERT_EQ(b.size(), 8u);
  // Sorted descending, the biases are -1.5 * log(1 + r) for r = 0..7: every
  // popularity rank is used exactly once.
  std::vector<float> sorted = b;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  for (int r = 0; r < 8; ++r) {
    EXPECT_FLOAT_EQ(sorted[static_cast<size_t>(r)], static_cast<float>(-1.5 * std::log(1.0 + r)));
  }
  EXPECT_EQ(SkewBias(8, 1.5, 7), b) << "a pure function of its arguments";
  // The ranking comes from the seed: over a few seeds the favourite moves.
  std::vector<int> favourites;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const std::vector<float> s = SkewBias(8, 1.0, seed);
    favourites.push_back(static_cast<int>(std::max_element(s.begin(), s.end()) - s.begin()));
  }
  std::sort(favourites.begin(), favourites.end());
  EXPECT_GT(std::unique(favourites.begin(), favourites.end()) - favourites.begin(), 2);
  for (float v : SkewBias(4, 0.0, 3)) EXPECT_EQ(v, 0.0f) << "exponent 0: no bias";
}

TEST_F(CpuKernelsTest, NameAndTypes) {
  EXPECT_EQ(k_->name(), "cpu-eigen");
  EXPECT_TRUE(k_->Supports(DType::kF32));
  EXPECT_FALSE(k_->Supports(DType::kBF16));
}

// ---------------------------------------------------------------- GEMM ----

TEST_F(CpuKernelsTest, GemmMatchesReferenceForAllTransposesAndStrides) {
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{1, 1, 1},    {3, 4, 5}, {7, 2, 9}, {16, 16, 16},
                          {33, 17, 40}, {5, 1, 8}, {1, 9, 3}};
  struct Scalars {
    float alpha, beta;
  };
  const Scalars scalars[] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.5f, 0.25f}};
  std::mt19937 rng(1234);
  int cases = 0;
  for (const Shape& sh : shapes) {
    for (int trans = 0; trans < 4; ++trans) {
      const bool ta = trans & 1, tb = trans & 2;
      for (int64_t pad : {0, 3}) {
        for (const Scalars& sc : scalars) {
          const int64_t ar = ta ? sh.k : sh.m, ac = ta ? sh.m : sh.k;
          const int64_t br = tb ? sh.n : sh.k, bc = tb ? sh.k : sh.n;
          const int64_t lda = ac + pad, ldb = bc + pad, ldc = sh.n + pad;
          // Padding is NaN in a and b (must never be read) and a sentinel in c
          // (must never be written).
          std::vector<float> a(static_cast<size_t>(ar * lda), kNaN);
          std::vector<float> b(static_cast<size_t>(br * ldb), kNaN);
          std::vector<float> c(static_cast<size_t>(sh.m * ldc), 777.0f);
          Mat am(ar, ac), bm(br, bc), cm(sh.m, sh.n);
          std::uniform_real_distribution<float> d(-1.0f, 1.0f);
          for (int64_t i = 0; i < ar; ++i)
            for (int64_t j = 0; j < ac; ++j) am.at(i, j) = a[i * lda + j] = d(rng);
          for (int64_t i = 0; i < br; ++i)
            for (int64_t j = 0; j < bc; ++j) bm.at(i, j) = b[i * ldb + j] = d(rng);
          for (int64_t i = 0; i < sh.m; ++i)
            for (int64_t j = 0; j < sh.n; ++j)
              cm.at(i, j) = c[i * ldc + j] = sc.beta == 0.0f ? kNaN : d(rng);

          ASSERT_TRUE(k_->Gemm(ta, tb, sh.m, sh.n, sh.k, sc.alpha, a.data(), lda, b.data(), ldb,
                               sc.beta, c.data(), ldc, DType::kF32)
                          .ok());
          const Mat prod = Mul(am, ta, bm, tb), mag = Mul(am, ta, bm, tb, /*abs=*/true);
          std::vector<float> got;
          std::vector<double> want, scale;
          for (int64_t i = 0; i < sh.m; ++i) {
            for (int64_t j = 0; j < sh.n; ++j) {
              got.push_back(c[i * ldc + j]);
              const double old = sc.beta == 0.0f ? 0.0 : cm.at(i, j);
              want.push_back(sc.alpha * prod.at(i, j) + sc.beta * old);
              scale.push_back(std::abs(sc.alpha) * mag.at(i, j) + std::abs(sc.beta * old));
            }
            for (int64_t j = sh.n; j < ldc; ++j) EXPECT_EQ(c[i * ldc + j], 777.0f) << "c padding";
          }
          ExpectClose(got, want, scale, 1e-5, 1e-7,
                      "gemm m=" + std::to_string(sh.m) + " n=" + std::to_string(sh.n) +
                          " k=" + std::to_string(sh.k) + " ta=" + std::to_string(ta) +
                          " tb=" + std::to_string(tb) + " pad=" + std::to_string(pad));
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 7 * 4 * 2 * 3);
}

TEST_F(CpuKernelsTest, GemmBetaZeroOverwritesNaNAndKZeroScalesC) {
  // 2x2 = [1 2; 3 4] * I, c full of NaN: beta = 0 must not propagate it.
  const float a[] = {1, 2, 3, 4}, eye[] = {1, 0, 0, 1};
  float c[] = {kNaN, kNaN, kNaN, kNaN};
  ASSERT_TRUE(k_->Gemm(false, false, 2, 2, 2, 1.0f, a, 2, eye, 2, 0.0f, c, 2, DType::kF32).ok());
  EXPECT_THAT(c, ::testing::ElementsAre(1, 2, 3, 4));
  // k = 0: the product is empty, so c = beta * c (and a, b may be null).
  ASSERT_TRUE(
      k_->Gemm(false, false, 2, 2, 0, 1.0f, nullptr, 0, nullptr, 2, 0.5f, c, 2, DType::kF32).ok());
  EXPECT_THAT(c, ::testing::ElementsAre(0.5, 1, 1.5, 2));
  ASSERT_TRUE(
      k_->Gemm(false, false, 2, 2, 0, 1.0f, nullptr, 0, nullptr, 2, 0.0f, c, 2, DType::kF32).ok());
  EXPECT_THAT(c, ::testing::ElementsAre(0, 0, 0, 0));
}

// ------------------------------------------------------------- Routing ----

struct Routed {
  std::vector<float> probs;
  std::vector<int32_t> expert, slot;
  std::vector<float> weight;
  RouteBuffers buffers() {
    return RouteBuffers{probs.data(), expert.data(), slot.data(), weight.data()};
  }
};

Routed MakeRouted(int64_t tokens, int64_t experts, int64_t top_k) {
  Routed r;
  r.probs.assign(static_cast<size_t>(tokens * experts), kNaN);
  r.expert.assign(static_cast<size_t>(tokens * top_k), -7);
  r.slot.assign(static_cast<size_t>(tokens * top_k), -7);
  r.weight.assign(static_cast<size_t>(tokens * top_k), kNaN);
  return r;
}

std::vector<double> SoftmaxRef(const float* x, int64_t n) {
  double mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  std::vector<double> p(static_cast<size_t>(n));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += p[i] = std::exp(x[i] - mx);
  for (double& v : p) v /= sum;
  return p;
}

TEST_F(CpuKernelsTest, RouteMatchesReference) {
  struct Case {
    int64_t tokens, experts, top_k, capacity;
  };
  const Case cases[] = {{1, 1, 1, 1},   {7, 4, 1, 2},  {7, 4, 2, 3},   {33, 8, 2, 5},
                        {33, 8, 8, 40}, {16, 4, 4, 0}, {20, 6, 3, 100}};
  std::mt19937 rng(99);
  for (const Case& c : cases) {
    SCOPED_TRACE("S=" + std::to_string(c.tokens) + " E=" + std::to_string(c.experts) +
                 " k=" + std::to_string(c.top_k) + " T=" + std::to_string(c.capacity));
    const std::vector<float> logits = Random(rng, c.tokens * c.experts, -4.0f, 4.0f);
    Routed r = MakeRouted(c.tokens, c.experts, c.top_k);
    ASSERT_TRUE(
        k_->Route(logits.data(), c.tokens, c.experts, c.top_k, c.capacity, r.buffers()).ok());
    std::vector<double> want_p;
    for (int64_t s = 0; s < c.tokens; ++s) {
      const std::vector<double> p = SoftmaxRef(logits.data() + s * c.experts, c.experts);
      want_p.insert(want_p.end(), p.begin(), p.end());
    }
    ExpectClose(r.probs, want_p, {}, 0.0, 1e-6, "probs");

    // Selection and capacity are checked exactly, on the kernel's own fp32
    // probabilities (a double softmax could order near-ties differently).
    std::vector<int32_t> want_e, want_slot(static_cast<size_t>(c.tokens * c.top_k));
    for (int64_t s = 0; s < c.tokens; ++s) {
      std::vector<int32_t> idx(static_cast<size_t>(c.experts));
      std::iota(idx.begin(), idx.end(), 0);
      const float* p = r.probs.data() + s * c.experts;
      std::stable_sort(idx.begin(), idx.end(), [p](int32_t x, int32_t y) { return p[x] > p[y]; });
      want_e.insert(want_e.end(), idx.begin(), idx.begin() + c.top_k);
    }
    std::vector<int64_t> used(static_cast<size_t>(c.experts), 0);
    for (int64_t j = 0; j < c.top_k; ++j) {
      for (int64_t s = 0; s < c.tokens; ++s) {
        const int64_t i = s * c.top_k + j;
        int64_t& u = used[want_e[i]];
        want_slot[i] = u < c.capacity ? static_cast<int32_t>(u++) : -1;
      }
    }
    EXPECT_EQ(r.expert, want_e);
    EXPECT_EQ(r.slot, want_slot);
    for (int64_t i = 0; i < c.tokens * c.top_k; ++i) {
      EXPECT_EQ(r.weight[i], r.probs[(i / c.top_k) * c.experts + want_e[i]]) << "weight " << i;
    }
  }
}

TEST_F(CpuKernelsTest, RouteHandExampleCapacityIsChoiceMajor) {
  // 3 tokens, 2 experts, top-2, capacity 1.
  //   token 0: logits (2, 0) -> choices (e0, e1)
  //   token 1: logits (0, 2) -> choices (e1, e0)
  //   token 2: logits (1, 0) -> choices (e0, e1)
  // First choices in token order: t0 takes e0 slot 0, t1 takes e1 slot 0, t2's
  // e0 is full -> dropped. Then all second choices are dropped (both full).
  // Token-major order would instead have given e1 to t0's second choice and
  // dropped t1's first choice.
  const float logits[] = {2, 0, 0, 2, 1, 0};
  Routed r = MakeRouted(3, 2, 2);
  ASSERT_TRUE(k_->Route(logits, 3, 2, 2, 1, r.buffers()).ok());
  EXPECT_THAT(r.expert, ::testing::ElementsAre(0, 1, 1, 0, 0, 1));
  EXPECT_THAT(r.slot, ::testing::ElementsAre(0, -1, 0, -1, -1, -1));
  const float p2 = static_cast<float>(1.0 / (1.0 + std::exp(-2.0)));  // softmax(2, 0)[0]
  const float p1 = static_cast<float>(1.0 / (1.0 + std::exp(-1.0)));  // softmax(1, 0)[0]
  // Weights are the chosen experts' probabilities, dropped or not.
  EXPECT_THAT(r.weight, ::testing::Pointwise(::testing::FloatNear(1e-6),
                                             {p2, 1 - p2, p2, 1 - p2, p1, 1 - p1}));

  // Capacity 2: everything fits, slots count per expert in choice-major order:
  // e0 gets t0 (1st), t2 (1st); e1 gets t1 (1st), then t0 (2nd) -> slot 1;
  // t1's 2nd (e0) and t2's 2nd (e1) find both experts full.
  ASSERT_TRUE(k_->Route(logits, 3, 2, 2, 2, r.buffers()).ok());
  EXPECT_THAT(r.slot, ::testing::ElementsAre(0, 1, 0, -1, 1, -1));
}

TEST_F(CpuKernelsTest, RouteTiesGoToLowerExpert) {
  const float logits[] = {0, 0, 0, 0,   // all equal -> 0, 1, 2
                          1, 3, 3, 1,   // tie between 1 and 2, then 0 before 3
                          3, 1, 3, 3};  // three-way tie 0, 2, 3
  Routed r = MakeRouted(3, 4, 3);
  ASSERT_TRUE(k_->Route(logits, 3, 4, 3, 10, r.buffers()).ok());
  EXPECT_THAT(r.expert, ::testing::ElementsAre(0, 1, 2, 1, 2, 0, 0, 2, 3));
}

TEST_F(CpuKernelsTest, RouteBackwardMatchesFormulaAndFiniteDifferences) {
  constexpr int64_t S = 6, E = 5, K = 2, T = 2;  // 12 choices, 10 slots: some drop
  std::mt19937 rng(7);
  const std::vector<float> logits = Random(rng, S * E, -2.0f, 2.0f);
  Routed r = MakeRouted(S, E, K);
  ASSERT_TRUE(k_->Route(logits.data(), S, E, K, T, r.buffers()).ok());
  ASSERT_GE(std::count(r.slot.begin(), r.slot.end(), -1), 2);
  const std::vector<float> dweight = Random(rng, S * K);
  std::vector<float> dlogits(S * E, kNaN);
  ASSERT_TRUE(k_->RouteBackward(r.buffers(), dweight.data(), S, E, K, dlogits.data()).ok());

  // Scalar loss with the routing decisions held fixed:
  // L = sum over kept choices of dweight * softmax(logits)[expert].
  auto loss = [&](const std::vector<double>& x) {
    double l = 0.0;
    for (int64_t s = 0; s < S; ++s) {
      double mx = x[s * E], sum = 0.0;
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, x[s * E + e]);
      for (int64_t e = 0; e < E; ++e) sum += std::exp(x[s * E + e] - mx);
      for (int64_t j = 0; j < K; ++j) {
        const int64_t i = s * K + j;
        if (r.slot[i] < 0) continue;
        l += dweight[i] * std::exp(x[s * E + r.expert[i]] - mx) / sum;
      }
    }
    return l;
  };
  std::vector<double> x(logits.begin(), logits.end()), fd(S * E), formula(S * E), scale(S * E);
  constexpr double h = 1e-4;
  for (int64_t i = 0; i < S * E; ++i) {
    std::vector<double> xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    fd[i] = (loss(xp) - loss(xm)) / (2 * h);
    scale[i] = 1.0 + std::abs(fd[i]);
  }
  ExpectClose(dlogits, fd, scale, 2e-5, 0.0, "dlogits vs finite differences");

  // The documented formula on the kernel's probabilities, in double.
  for (int64_t s = 0; s < S; ++s) {
    std::vector<double> g(E, 0.0);
    for (int64_t j = 0; j < K; ++j) {
      if (r.slot[s * K + j] >= 0) g[r.expert[s * K + j]] += dweight[s * K + j];
    }
    double dot = 0.0;
    for (int64_t e = 0; e < E; ++e) dot += r.probs[s * E + e] * g[e];
    for (int64_t e = 0; e < E; ++e) formula[s * E + e] = r.probs[s * E + e] * (g[e] - dot);
  }
  ExpectClose(dlogits, formula, {}, 1e-5, 1e-7, "dlogits vs formula");
}

// ----------------------------------------------------- Order / i-order ----

// Element offset of (expert e, slot t, column c), written from the layout's
// 4-D view [parts][E][T/parts][M].
int64_t RefOffset(const BufferShape& s, int64_t e, int64_t t, int64_t c) {
  const int64_t rows = s.capacity / s.parts;
  const int64_t part = t / rows, row = t % rows;
  return part * (s.experts * rows * s.model) + e * (rows * s.model) + row * s.model + c;
}

TEST_F(CpuKernelsTest, OrderHandLayoutWithTwoParts) {
  // E = 2, T = 4, parts = 2, M = 2: blocks of [2 experts][2 rows][2 cols].
  //   token 0 -> expert 0 slot 3: block 1, row 1 -> elements 10, 11
  //   token 1 -> expert 1 slot 0: block 0, expert 1, row 0 -> elements 4, 5
  //   token 2 -> expert 0 slot 1: block 0, row 1 -> elements 2, 3
  const BufferShape s{.tokens = 3, .model = 2, .experts = 2, .top_k = 1, .capacity = 4, .parts = 2};
  int32_t expert[] = {0, 1, 0}, slot[] = {3, 0, 1};
  float weight[] = {1, 1, 1};
  const RouteBuffers r{nullptr, expert, slot, weight};
  const float x[] = {1, 2, 3, 4, 5, 6};
  std::vector<float> buf(16, kNaN);
  ASSERT_TRUE(k_->Order(x, r, s, buf.data()).ok());
  EXPECT_THAT(buf, ::testing::ElementsAre(0, 0, 5, 6, 3, 4, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0));
}

TEST_F(CpuKernelsTest, OrderFamilyMatchesReference) {
  struct Case {
    int64_t tokens, model, experts, top_k, capacity, parts;
  };
  const Case cases[] = {{5, 3, 4, 2, 4, 1},  {9, 4, 4, 2, 4, 2}, {16, 8, 8, 2, 6, 2},
                        {12, 5, 3, 1, 8, 4}, {7, 2, 2, 2, 2, 2}, {1, 3, 1, 1, 2, 2},
                        {10, 4, 4, 3, 0, 2}};
  std::mt19937 rng(2024);
  for (const Case& c : cases) {
    const BufferShape s{.tokens = c.tokens,
                        .model = c.model,
                        .experts = c.experts,
                        .top_k = c.top_k,
                        .capacity = c.capacity,
                        .parts = c.parts};
    SCOPED_TRACE("S=" + std::to_string(c.tokens) + " M=" + std::to_string(c.model) +
                 " E=" + std::to_string(c.experts) + " k=" + std::to_string(c.top_k) +
                 " T=" + std::to_string(c.capacity) + " parts=" + std::to_string(c.parts));
    const std::vector<float> logits = Random(rng, c.tokens * c.experts, -3.0f, 3.0f);
    Routed rt = MakeRouted(c.tokens, c.experts, c.top_k);
    ASSERT_TRUE(
        k_->Route(logits.data(), c.tokens, c.experts, c.top_k, c.capacity, rt.buffers()).ok());
    const RouteBuffers r = rt.buffers();
    const int64_t n_buf = s.BufferElements(), n_tok = c.tokens * c.model;
    const std::vector<float> x = Random(rng, n_tok), dy = Random(rng, n_tok);
    // Every slot of these holds data, so reading an unused slot would show.
    const std::vector<float> out_buf = Random(rng, n_buf), dbuf_in = Random(rng, n_buf);

    std::vector<double> want_buf(n_buf, 0.0), want_y(n_tok, 0.0), want_dbuf(n_buf, 0.0),
        want_dw(c.tokens * c.top_k, 0.0), want_dx(n_tok, 0.0);
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t j = 0; j < c.top_k; ++j) {
        const int64_t i = t * c.top_k + j;
        if (r.slot[i] < 0) continue;
        double dot = 0.0;
        for (int64_t col = 0; col < c.model; ++col) {
          const int64_t o = RefOffset(s, r.expert[i], r.slot[i], col);
          want_buf[o] = x[t * c.model + col];
          want_y[t * c.model + col] += static_cast<double>(r.weight[i]) * out_buf[o];
          want_dbuf[o] = static_cast<double>(r.weight[i]) * dy[t * c.model + col];
          dot += static_cast<double>(dy[t * c.model + col]) * out_buf[o];
          want_dx[t * c.model + col] += dbuf_in[o];
        }
        want_dw[i] = dot;
      }
    }

    std::vector<float> buf(n_buf, kNaN), y(n_tok, kNaN), dbuf(n_buf, kNaN),
        dw(c.tokens * c.top_k, kNaN), dx(n_tok, kNaN);
    ASSERT_TRUE(k_->Order(x.data(), r, s, buf.data()).ok());
    ASSERT_TRUE(k_->IOrder(out_buf.data(), r, s, y.data()).ok());
    ASSERT_TRUE(k_->IOrderBackward(dy.data(), out_buf.data(), r, s, dbuf.data(), dw.data()).ok());
    ASSERT_TRUE(k_->OrderBackward(dbuf_in.data(), r, s, dx.data()).ok());
    ExpectClose(buf, want_buf, {}, 0.0, 0.0, "Order buf");
    ExpectClose(y, want_y, {}, 1e-6, 1e-7, "IOrder y");
    ExpectClose(dbuf, want_dbuf, {}, 1e-6, 1e-7, "IOrderBackward dbuf");
    ExpectClose(dw, want_dw, {}, 1e-6, 1e-6, "IOrderBackward dweight");
    ExpectClose(dx, want_dx, {}, 1e-6, 1e-7, "OrderBackward dx");

    // The backward kernels are the adjoints of the forward ones:
    // <Order(x), B> = <x, OrderBackward(B)> and <IOrder(B), dy> = <B, dbuf>.
    double lhs = 0.0, rhs = 0.0;
    for (int64_t i = 0; i < n_buf; ++i) lhs += static_cast<double>(buf[i]) * dbuf_in[i];
    for (int64_t i = 0; i < n_tok; ++i) rhs += static_cast<double>(x[i]) * dx[i];
    EXPECT_NEAR(lhs, rhs, 1e-5 * (1.0 + std::abs(lhs))) << "Order adjoint";
    lhs = rhs = 0.0;
    for (int64_t i = 0; i < n_tok; ++i) lhs += static_cast<double>(y[i]) * dy[i];
    for (int64_t i = 0; i < n_buf; ++i) rhs += static_cast<double>(out_buf[i]) * dbuf[i];
    EXPECT_NEAR(lhs, rhs, 1e-5 * (1.0 + std::abs(lhs))) << "IOrder adjoint";
  }
}

TEST_F(CpuKernelsTest, OrderRejectsCapacityNotMultipleOfParts) {
  const BufferShape s{.tokens = 1, .model = 1, .experts = 1, .top_k = 1, .capacity = 3, .parts = 2};
  int32_t expert[] = {0}, slot[] = {0};
  float weight[] = {1}, x[] = {1}, buf[3] = {}, dw[1] = {};
  const RouteBuffers r{nullptr, expert, slot, weight};
  for (const absl::Status& st :
       {k_->Order(x, r, s, buf), k_->IOrder(buf, r, s, x), k_->OrderBackward(buf, r, s, x),
        k_->IOrderBackward(x, buf, r, s, buf, dw)}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(st.message()), HasSubstr("parts"));
  }
}

// ------------------------------------------------------------- Experts ----

struct ExpertData {
  std::vector<float> x, w1, w2, dout;
};

ExpertData RandomExpertData(std::mt19937& rng, const ExpertShape& e) {
  return {Random(rng, e.TokenElements()), Random(rng, e.W1Elements()), Random(rng, e.W2Elements()),
          Random(rng, e.TokenElements())};
}

double SiluRef(double x) { return x / (1.0 + std::exp(-x)); }

// Output of the double reference forward pass, [G][El][R][M]: GELU experts,
// or SwiGLU ones (w1 [El][M][2Hs], gate columns h, up columns Hs + h).
std::vector<double> ExpertOutRef(const ExpertShape& e, const std::vector<double>& x,
                                 const std::vector<double>& w1, const std::vector<double>& w2) {
  const int64_t R = e.rows, M = e.model, H = e.shard, F = e.FirstWidth();
  std::vector<double> out(e.TokenElements(), 0.0);
  for (int64_t g = 0; g < e.groups; ++g) {
    for (int64_t l = 0; l < e.local_experts; ++l) {
      const int64_t b = g * e.local_experts + l;
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t h = 0; h < H; ++h) {
          double z = 0.0, up = 0.0;
          for (int64_t m = 0; m < M; ++m) {
            z += x[(b * R + r) * M + m] * w1[(l * M + m) * F + h];
            if (e.gated) up += x[(b * R + r) * M + m] * w1[(l * M + m) * F + H + h];
          }
          const double a = e.gated ? SiluRef(z) * up : GeluRef(z);
          for (int64_t m = 0; m < M; ++m) out[(b * R + r) * M + m] += a * w2[(l * H + h) * M + m];
        }
      }
    }
  }
  return out;
}

TEST_F(CpuKernelsTest, ExpertKernelsMatchReference) {
  const ExpertShape shapes[] = {
      {.groups = 1, .local_experts = 1, .rows = 3, .model = 4, .shard = 5},
      {.groups = 2, .local_experts = 3, .rows = 4, .model = 6, .shard = 5},
      {.groups = 3, .local_experts = 2, .rows = 1, .model = 8, .shard = 16},
      {.groups = 2, .local_experts = 2, .rows = 0, .model = 4, .shard = 4},
  };
  constexpr float kScale = 0.5f;
  std::mt19937 rng(31337);
  for (const ExpertShape& e : shapes) {
    SCOPED_TRACE("G=" + std::to_string(e.groups) + " El=" + std::to_string(e.local_experts) +
                 " R=" + std::to_string(e.rows) + " M=" + std::to_string(e.model) +
                 " Hs=" + std::to_string(e.shard));
    const ExpertData d = RandomExpertData(rng, e);
    const int64_t te = e.TokenElements(), he = e.HiddenElements(), we = e.W1Elements();
    ASSERT_EQ(we, e.W2Elements());
    ASSERT_EQ(he, e.PreActivationElements());
    // Outputs start as NaN: every kernel must overwrite all of its output.
    std::vector<float> z(he, kNaN), a(he, kNaN), out(te, kNaN), dz(he, kNaN), dx(te, kNaN),
        dw1(we, kNaN), dw2(we, kNaN);
    ASSERT_TRUE(
        k_->ExpertForward(e, d.x.data(), d.w1.data(), d.w2.data(), z.data(), a.data(), out.data())
            .ok());
    ASSERT_TRUE(k_->ExpertBackwardData(e, d.dout.data(), d.w1.data(), d.w2.data(), z.data(),
                                       dz.data(), dx.data())
                    .ok());
    ASSERT_TRUE(k_->ExpertBackwardWeights(e, d.x.data(), a.data(), d.dout.data(), dz.data(), kScale,
                                          dw1.data(), dw2.data())
                    .ok());

    // Each reference comes with an error scale: the sum of |terms| of its last
    // GEMM, with the inputs' own scales propagated (|gelu'| <= 1.13, and the
    // "+ 1" on dz covers gelu'' times the error of z).
    const int64_t R = e.rows, M = e.model, H = e.shard;
    std::vector<double> wz, sz, wa, sa, wout, sout, wdz, sdz, wdx, sdx;
    Mat wdw1(e.local_experts * M, H), sdw1(e.local_experts * M, H);
    Mat wdw2(e.local_experts * H, M), sdw2(e.local_experts * H, M);
    for (int64_t g = 0; g < e.groups; ++g) {
      for (int64_t l = 0; l < e.local_experts; ++l) {
        const int64_t b = g * e.local_experts + l;
        const Mat xm = FromFloat(d.x.data() + b * R * M, R, M);
        const Mat dom = FromFloat(d.dout.data() + b * R * M, R, M);
        const Mat w1 = FromFloat(d.w1.data() + l * M * H, M, H);
        const Mat w2 = FromFloat(d.w2.data() + l * H * M, H, M);
        const Mat zr = Mul(xm, false, w1, false), zs = Mul(xm, false, w1, false, true);
        Mat ar = zr, as = zr, dzr = Mul(dom, false, w2, true),
            dzs = Mul(dom, false, w2, true, true);
        for (size_t i = 0; i < zr.v.size(); ++i) {
          const double zv = zr.v[i];
          ar.v[i] = GeluRef(zv);
          as.v[i] = std::abs(ar.v[i]) + 1.2 * zs.v[i];
          // gelu'(z), derived independently of the kernel's code.
          const double t = std::tanh(kGeluC * (zv + 0.044715 * zv * zv * zv));
          const double dg =
              0.5 * (1 + t) + 0.5 * zv * (1 - t * t) * kGeluC * (1 + 3 * 0.044715 * zv * zv);
          dzr.v[i] *= dg;
          dzs.v[i] *= std::abs(dg) + 1.0;
        }
        Append(zr, &wz);
        Append(zs, &sz);
        Append(ar, &wa);
        Append(as, &sa);
        Append(Mul(ar, false, w2, false), &wout);
        Append(Mul(as, false, w2, false, true), &sout);
        Append(dzr, &wdz);
        Append(dzs, &sdz);
        Append(Mul(dzr, false, w1, true), &wdx);
        Append(Mul(dzs, false, w1, true, true), &sdx);
        const Mat g2 = Mul(ar, true, dom, false), g2s = Mul(as, true, dom, false, true);
        const Mat g1 = Mul(xm, true, dzr, false), g1s = Mul(xm, true, dzs, false, true);
        for (int64_t i = 0; i < H * M; ++i) {
          wdw2.v[l * H * M + i] += kScale * g2.v[i];
          sdw2.v[l * H * M + i] += kScale * g2s.v[i];
          wdw1.v[l * M * H + i] += kScale * g1.v[i];
          sdw1.v[l * M * H + i] += kScale * g1s.v[i];
        }
      }
    }
    ExpectClose(z, wz, sz, 1e-5, 1e-7, "z");
    ExpectClose(a, wa, sa, 1e-5, 1e-7, "a");
    ExpectClose(out, wout, sout, 1e-5, 1e-7, "out");
    ExpectClose(dz, wdz, sdz, 1e-5, 1e-7, "dz");
    ExpectClose(dx, wdx, sdx, 1e-5, 1e-7, "dx");
    ExpectClose(dw1, wdw1.v, sdw1.v, 1e-5, 1e-7, "dw1");
    ExpectClose(dw2, wdw2.v, sdw2.v, 1e-5, 1e-7, "dw2");
  }
}

TEST_F(CpuKernelsTest, GeluAndItsDerivativeMatchFiniteDifferences) {
  // One expert with M = Hs = 1 and unit weights: a = out = gelu(x) and, with
  // dout = 1, dz = dx = gelu'(x).
  std::vector<float> x;
  for (int i = -60; i <= 60; ++i) x.push_back(0.1f * i);
  x.push_back(0.0f);
  x.push_back(1e-3f);
  const ExpertShape e{.groups = 1,
                      .local_experts = 1,
                      .rows = static_cast<int64_t>(x.size()),
                      .model = 1,
                      .shard = 1};
  const float one = 1.0f;
  const std::vector<float> dout(x.size(), 1.0f);
  std::vector<float> z(x.size()), a(x.size()), out(x.size()), dz(x.size()), dx(x.size());
  ASSERT_TRUE(k_->ExpertForward(e, x.data(), &one, &one, z.data(), a.data(), out.data()).ok());
  ASSERT_TRUE(
      k_->ExpertBackwardData(e, dout.data(), &one, &one, z.data(), dz.data(), dx.data()).ok());
  std::vector<double> want_a, fd, scale;
  constexpr double h = 1e-4;
  for (float v : x) {
    want_a.push_back(GeluRef(v));
    fd.push_back((GeluRef(v + h) - GeluRef(v - h)) / (2 * h));
    scale.push_back(1.0 + std::abs(fd.back()));
  }
  ExpectClose(a, want_a, {}, 1e-6, 1e-6, "gelu");
  ExpectClose(dz, fd, scale, 2e-5, 0.0, "gelu' vs finite differences");
  EXPECT_EQ(dz, dx);
}

TEST_F(CpuKernelsTest, ActivationAloneMatchesTheExpertsAcrossChunks) {
  // 2500 elements: two full 1024-element chunks and a partial one.
  std::vector<float> z(2500);
  for (size_t i = 0; i < z.size(); ++i) z[i] = -6.0f + 12.0f * static_cast<float>(i) / 2499.0f;
  std::vector<float> a(z.size(), -1.0f), dz(z.size(), 2.0f);
  ASSERT_TRUE(k_->Activation(z.data(), a.data(), static_cast<int64_t>(z.size()), DType::kF32).ok());
  ASSERT_TRUE(
      k_->ActivationBackward(z.data(), dz.data(), static_cast<int64_t>(z.size()), DType::kF32)
          .ok());
  std::vector<double> want_a, want_dz, scale;
  constexpr double h = 1e-4;
  for (float v : z) {
    want_a.push_back(GeluRef(v));
    want_dz.push_back(2.0 * (GeluRef(v + h) - GeluRef(v - h)) / (2 * h));
    scale.push_back(1.0 + std::abs(want_dz.back()));
  }
  ExpectClose(a, want_a, {}, 1e-5, 1e-6, "gelu");
  ExpectClose(dz, want_dz, scale, 4e-5, 0.0, "2 gelu'");
  // The expert kernels apply the same code: one expert, M = Hs = 1, unit weights.
  const ExpertShape e{.groups = 1, .local_experts = 1, .rows = 2500, .model = 1, .shard = 1};
  const float one = 1.0f;
  std::vector<float> ez(z.size()), ea(z.size()), eout(z.size()), edz(z.size()), edx(z.size());
  const std::vector<float> dout(z.size(), 2.0f);
  ASSERT_TRUE(k_->ExpertForward(e, z.data(), &one, &one, ez.data(), ea.data(), eout.data()).ok());
  ASSERT_TRUE(
      k_->ExpertBackwardData(e, dout.data(), &one, &one, ez.data(), edz.data(), edx.data()).ok());
  EXPECT_EQ(ea, a);
  EXPECT_EQ(edz, dz);
  // Nothing to do is fine with null pointers; a negative count is named.
  EXPECT_TRUE(k_->Activation(nullptr, nullptr, 0, DType::kF32).ok());
  const absl::Status bad = k_->ActivationBackward(z.data(), dz.data(), -1, DType::kF32);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("count"));
}

// L = sum(dout * out) for a tiny shape with G > 1 and El > 1; the weight
// gradients (scale 1) then sum over the groups that share the weights. GELU
// experts, and SwiGLU ones (whose dz and dw1 are 2Hs wide).
void CheckExpertBackwardByFiniteDifferences(Kernels& k, const ExpertShape& e) {
  std::mt19937 rng(5);
  const ExpertData d = RandomExpertData(rng, e);
  const int64_t te = e.TokenElements(), he = e.HiddenElements(), pe = e.PreActivationElements();
  const int64_t w1e = e.W1Elements(), w2e = e.W2Elements();
  std::vector<float> z(pe), a(he), out(te), dz(pe), dx(te), dw1(w1e), dw2(w2e);
  ASSERT_TRUE(
      k.ExpertForward(e, d.x.data(), d.w1.data(), d.w2.data(), z.data(), a.data(), out.data())
          .ok());
  ASSERT_TRUE(k.ExpertBackwardData(e, d.dout.data(), d.w1.data(), d.w2.data(), z.data(), dz.data(),
                                   dx.data())
                  .ok());
  ASSERT_TRUE(k.ExpertBackwardWeights(e, d.x.data(), a.data(), d.dout.data(), dz.data(), 1.0f,
                                      dw1.data(), dw2.data())
                  .ok());

  std::vector<double> x(d.x.begin(), d.x.end()), w1(d.w1.begin(), d.w1.end()),
      w2(d.w2.begin(), d.w2.end());
  auto loss = [&]() {
    const std::vector<double> o = ExpertOutRef(e, x, w1, w2);
    double l = 0.0;
    for (int64_t i = 0; i < te; ++i) l += d.dout[i] * o[i];
    return l;
  };
  ExpectClose(out, ExpertOutRef(e, x, w1, w2), {}, 1e-5, 1e-6, "out");
  constexpr double h = 1e-4;
  auto fd_of = [&](std::vector<double>* v) {
    std::vector<double> g(v->size()), scale(v->size());
    for (size_t i = 0; i < v->size(); ++i) {
      const double keep = (*v)[i];
      (*v)[i] = keep + h;
      const double lp = loss();
      (*v)[i] = keep - h;
      const double lm = loss();
      (*v)[i] = keep;
      g[i] = (lp - lm) / (2 * h);
      scale[i] = 1.0 + std::abs(g[i]);
    }
    return std::make_pair(g, scale);
  };
  auto [gx, sx] = fd_of(&x);
  auto [g1, s1] = fd_of(&w1);
  auto [g2, s2] = fd_of(&w2);
  ExpectClose(dx, gx, sx, 2e-5, 0.0, "dx vs finite differences");
  ExpectClose(dw1, g1, s1, 2e-5, 0.0, "dw1 vs finite differences");
  ExpectClose(dw2, g2, s2, 2e-5, 0.0, "dw2 vs finite differences");

  // `scale` multiplies both weight gradients and they are overwritten.
  std::vector<float> dw1s(w1e, kNaN), dw2s(w2e, kNaN);
  ASSERT_TRUE(k.ExpertBackwardWeights(e, d.x.data(), a.data(), d.dout.data(), dz.data(), 0.25f,
                                      dw1s.data(), dw2s.data())
                  .ok());
  for (int64_t i = 0; i < w1e; ++i) {
    EXPECT_NEAR(dw1s[i], 0.25f * dw1[i], 1e-6f * (1 + std::abs(dw1[i])));
  }
  for (int64_t i = 0; i < w2e; ++i) {
    EXPECT_NEAR(dw2s[i], 0.25f * dw2[i], 1e-6f * (1 + std::abs(dw2[i])));
  }
}

TEST_F(CpuKernelsTest, ExpertBackwardMatchesFiniteDifferences) {
  CheckExpertBackwardByFiniteDifferences(
      *k_, {.groups = 2, .local_experts = 2, .rows = 2, .model = 3, .shard = 4});
}

TEST_F(CpuKernelsTest, SwigluExpertBackwardMatchesFiniteDifferences) {
  CheckExpertBackwardByFiniteDifferences(
      *k_, {.groups = 2, .local_experts = 2, .rows = 2, .model = 3, .shard = 4, .gated = true});
}

// One SwiGLU expert by hand: M = 1, Hs = 2, one row x = 2, w1 = [gate 1, -1 |
// up 3, 5] so z = [2, -2 | 6, 10]; w2 = [0.5, 0.25]; dout = 1. With
// silu(2) = 1.76159416, silu(-2) = -0.23840584, silu'(2) = 1.09078425,
// silu'(-2) = -0.09078425:
//   a   = [silu(2) 6, silu(-2) 10] = [10.56956494, -2.38405844]
//   out = 0.5 a0 + 0.25 a1 = 4.68876786
//   da  = dout w2^T = [0.5, 0.25]
//   dz  = [da0 6 silu'(2), da1 10 silu'(-2) | da0 silu(2), da1 silu(-2)]
//       = [3.27235275, -0.22696062 | 0.88079708, -0.05960146]
//   dx  = dz . w1 = 5.84369730; dw1 = x dz; dw2 = a^T dout = a.
TEST_F(CpuKernelsTest, SwigluExpertByHand) {
  const ExpertShape e{.rows = 1, .model = 1, .shard = 2, .gated = true};
  const float x[] = {2.0f}, w1[] = {1.0f, -1.0f, 3.0f, 5.0f}, w2[] = {0.5f, 0.25f}, dout[] = {1.0f};
  std::vector<float> z(4, kNaN), a(2, kNaN), out(1, kNaN), dz(4, kNaN), dx(1, kNaN), dw1(4, kNaN),
      dw2(2, kNaN);
  ASSERT_TRUE(k_->ExpertForward(e, x, w1, w2, z.data(), a.data(), out.data()).ok());
  ASSERT_TRUE(k_->ExpertBackwardData(e, dout, w1, w2, z.data(), dz.data(), dx.data()).ok());
  ASSERT_TRUE(
      k_->ExpertBackwardWeights(e, x, a.data(), dout, dz.data(), 1.0f, dw1.data(), dw2.data())
          .ok());
  ExpectClose(z, {2, -2, 6, 10}, {}, 1e-6, 0.0, "z");
  ExpectClose(a, {10.56956494, -2.38405844}, {}, 1e-6, 0.0, "a");
  ExpectClose(out, {4.68876786}, {}, 1e-6, 0.0, "out");
  ExpectClose(dz, {3.27235275, -0.22696062, 0.88079708, -0.05960146}, {}, 1e-6, 0.0, "dz");
  ExpectClose(dx, {5.84369730}, {}, 1e-6, 0.0, "dx");
  ExpectClose(dw1, {6.54470549, -0.45392124, 1.76159416, -0.11920292}, {}, 1e-6, 0.0, "dw1");
  ExpectClose(dw2, {10.56956494, -2.38405844}, {}, 1e-6, 0.0, "dw2");
}

// The gated activation alone (the dropless experts' path) computes what the
// expert kernels do, across the 1024-element chunks of a row; its backward
// against the closed form.
TEST_F(CpuKernelsTest, GatedActivationAloneMatchesTheExperts) {
  constexpr int64_t kWidth = 1500;  // a full chunk and a partial one per half-row
  std::vector<float> z(2 * kWidth);
  for (size_t i = 0; i < z.size(); ++i) z[i] = -6.0f + 12.0f * static_cast<float>(i % 997) / 996;
  std::vector<float> a(kWidth, kNaN), dz(2 * kWidth, kNaN);
  for (int64_t j = 0; j < kWidth; ++j) dz[kWidth + j] = 0.5f + 0.001f * j;  // da
  const std::vector<float> da(dz.begin() + kWidth, dz.end());
  ASSERT_TRUE(k_->GatedActivation(z.data(), a.data(), 1, kWidth, DType::kF32).ok());
  ASSERT_TRUE(k_->GatedActivationBackward(z.data(), dz.data(), 1, kWidth, DType::kF32).ok());
  std::vector<double> want_a, want_dz(2 * kWidth);
  for (int64_t j = 0; j < kWidth; ++j) {
    const double g = z[j], u = z[kWidth + j], sg = 1.0 / (1.0 + std::exp(-g));
    want_a.push_back(SiluRef(g) * u);
    want_dz[j] = da[j] * u * sg * (1.0 + g * (1.0 - sg));
    want_dz[kWidth + j] = da[j] * SiluRef(g);
  }
  ExpectClose(a, want_a, {}, 1e-5, 1e-6, "silu(gate) * up");
  ExpectClose(dz, want_dz, {}, 1e-5, 1e-6, "dz");
  // ExpertForward on one row with x = 1 and w1 = z: the same a.
  const ExpertShape e{.rows = 1, .model = 1, .shard = kWidth, .gated = true};
  const float one = 1.0f;
  const std::vector<float> w2(kWidth, 0.0f);
  std::vector<float> ez(z.size()), ea(kWidth), eout(1);
  ASSERT_TRUE(
      k_->ExpertForward(e, &one, z.data(), w2.data(), ez.data(), ea.data(), eout.data()).ok());
  EXPECT_EQ(ez, z);
  EXPECT_EQ(ea, a);
  EXPECT_TRUE(k_->GatedActivation(nullptr, nullptr, 0, 4, DType::kF32).ok());
  const absl::Status bad = k_->GatedActivationBackward(z.data(), dz.data(), 1, -1, DType::kF32);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("width"));
}

// ------------------------------------------------------- Elementwise ----

TEST_F(CpuKernelsTest, ToF32CopiesAndAddF32Adds) {
  const float src[] = {1.5f, -2.0f, 3.25f};
  float dst[3] = {kNaN, kNaN, kNaN};
  ASSERT_TRUE(k_->ToF32(src, DType::kF32, dst, 3).ok());
  EXPECT_THAT(dst, ::testing::ElementsAre(1.5f, -2.0f, 3.25f));
  const float x[] = {0.5f, 2.0f, -0.25f};
  ASSERT_TRUE(k_->AddF32(dst, DType::kF32, x, 3).ok());
  EXPECT_THAT(dst, ::testing::ElementsAre(2.0f, 0.0f, 3.0f));
  // Empty ranges need no memory.
  EXPECT_TRUE(k_->ToF32(nullptr, DType::kF32, nullptr, 0).ok());
  EXPECT_TRUE(k_->AddF32(nullptr, DType::kF32, nullptr, 0).ok());
}

// -------------------------------------------------------------- Errors ----

TEST_F(CpuKernelsTest, Bf16IsUnimplementedEverywhere) {
  constexpr DType b = DType::kBF16;
  const BufferShape bs{
      .tokens = 1, .model = 1, .experts = 1, .top_k = 1, .capacity = 1, .dtype = b};
  const ExpertShape es{.rows = 1, .model = 1, .shard = 1, .dtype = b};
  float f[4] = {};
  int32_t idx[1] = {0};
  const RouteBuffers r{f, idx, idx, f};
  for (const absl::Status& st : {
           k_->Gemm(false, false, 1, 1, 1, 1.0f, f, 1, f, 1, 0.0f, f, 1, b),
           k_->Order(f, r, bs, f),
           k_->IOrder(f, r, bs, f),
           k_->IOrderBackward(f, f, r, bs, f, f),
           k_->OrderBackward(f, r, bs, f),
           k_->ExpertForward(es, f, f, f, f, f, f),
           k_->ExpertBackwardData(es, f, f, f, f, f, f),
           k_->ExpertBackwardWeights(es, f, f, f, f, 1.0f, f, f),
           k_->Activation(f, f, 1, b),
           k_->ActivationBackward(f, f, 1, b),
           k_->GatedActivation(f, f, 1, 1, b),
           k_->GatedActivationBackward(f, f, 1, 1, b),
           k_->ToF32(f, b, f, 1),
           k_->AddF32(f, b, f, 1),
       }) {
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("bf16"));
  }
}

TEST_F(CpuKernelsTest, BadArgumentsAreInvalidAndNamed) {
  float f[16] = {};
  int32_t idx[4] = {};
  const RouteBuffers r{f, idx, idx, f};
  struct Expectation {
    absl::Status status;
    std::string names;
  };
  int32_t far_expert[] = {9}, slot0[] = {0};
  const RouteBuffers bad_expert{f, far_expert, slot0, f};
  const BufferShape bs{.tokens = 1, .model = 1, .experts = 2, .top_k = 1, .capacity = 2};
  const Expectation cases[] = {
      {k_->Route(f, 2, 4, 5, 1, r), "top_k (5) must be <= experts (4)"},
      {k_->Route(f, -1, 4, 1, 1, r), "tokens"},
      {k_->Route(f, 1, 4, 1, -2, r), "capacity"},
      {k_->Route(nullptr, 1, 4, 1, 1, r), "logits"},
      {k_->RouteBackward(r, f, 1, 2, 3, f), "top_k"},
      {k_->Gemm(false, false, -1, 1, 1, 1.0f, f, 1, f, 1, 0.0f, f, 1, DType::kF32), "m (-1)"},
      {k_->Gemm(false, false, 2, 2, 3, 1.0f, f, 2, f, 2, 0.0f, f, 2, DType::kF32), "lda"},
      {k_->Gemm(true, false, 2, 2, 3, 1.0f, f, 2, f, 1, 0.0f, f, 2, DType::kF32), "ldb"},
      {k_->Gemm(false, false, 2, 2, 2, 1.0f, f, 2, nullptr, 2, 0.0f, f, 2, DType::kF32), "b is"},
      {k_->Order(f, bad_expert, bs, f), "expert[0] (9)"},
      {k_->IOrder(f, r, BufferShape{.tokens = 1, .model = -3, .experts = 1, .top_k = 1}, f),
       "model"},
      {k_->ExpertForward(ExpertShape{.rows = -1, .model = 1, .shard = 1}, f, f, f, f, f, f),
       "rows"},
      {k_->ExpertBackwardData(ExpertShape{.rows = 1, .model = 1, .shard = 1}, f, f, f, nullptr, f,
                              f),
       "z is null"},
      {k_->ExpertForward(ExpertShape{.rows = 1, .model = 1, .shard = 1, .gated = true}, f, nullptr,
                         f, f, f, f),
       "w1 is null but has 2 elements"},
      {k_->GatedActivation(f, f, -1, 1, DType::kF32), "rows (-1)"},
      {k_->ToF32(f, DType::kF32, f, -1), "count"},
  };
  for (const Expectation& c : cases) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.status;
    EXPECT_THAT(std::string(c.status.message()), HasSubstr(c.names));
    EXPECT_THAT(std::string(c.status.message()), HasSubstr("cpu kernels"));
  }
}

}  // namespace
}  // namespace moeplan::executor
