// The CUDA + NCCL backend (label "gpu"): every CUDA kernel against the CPU
// kernels (or, where the CPU kernels have no such path, a plain loop written
// from kernels.h), the CUDA device's memory and lanes, single-rank NCCL
// collectives, the plan interpreter on streams against the CPU backend, and
// printed kernel throughput (no timing assertions).
//
// Runs without mpirun, as an Open MPI singleton (own main: MPI_Init before the
// tests, MPI_Finalize after). Without a usable GPU, or in a build without CUDA,
// every test but CudaBuild.* skips and says why.
//
// Tolerances, relative to the largest magnitude of the reference tensor:
//   f32  2e-5: cuBLAS and Eigen sum in different orders; expf vs std::exp
//        differ in the last ulps.
//   bf16 2e-2: bf16 keeps 8 significant bits (2^-9 = 0.2% per rounding); the
//        GPU rounds every stored intermediate (z, a, da, outputs) while the
//        CPU reference computes in f32 from the same bf16-rounded inputs.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moeplan/base/bf16.h"
#include "moeplan/base/strings.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/check.h"
#include "moeplan/executor/model_runner.h"
#include "moeplan/executor/runner.h"
#include "plan_timeline.h"

namespace moeplan::executor {
namespace {

constexpr double kF32Tol = 2e-5;
constexpr double kBf16Tol = 2e-2;

#define EXPECT_OK(expr)                                       \
  do {                                                        \
    const absl::Status st_ = (expr);                          \
    EXPECT_TRUE(st_.ok()) << #expr << ": " << st_.ToString(); \
  } while (0)
#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const absl::Status st_ = (expr);                          \
    ASSERT_TRUE(st_.ok()) << #expr << ": " << st_.ToString(); \
  } while (0)

// ---- bf16 on the host (this test sees no CUDA headers): moeplan/base/bf16.h ----
// The value a float has once stored as `t`.
float RoundTo(float x, DType t) { return t == DType::kBF16 ? RoundToBf16(x) : x; }

double Tol(DType t) { return t == DType::kBF16 ? kBf16Tol : kF32Tol; }

std::vector<float> Random(size_t n, uint32_t seed, DType t = DType::kF32, float lo = -1.0f,
                          float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = RoundTo(u(rng), t);
  return v;
}

// |got - want| <= tol * max(1, max |want|) everywhere.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1.0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= tol * scale)) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements differ by more than " << tol * scale << "; first at " << first
                     << ": got " << (bad ? got[first] : 0.0f) << ", want "
                     << (bad ? want[first] : 0.0f);
}

const std::string& SkipReason() {
  static const std::string reason = [] {
    if (!CudaBuilt()) return "built without CUDA: " + CudaVersions();
    if (CudaDeviceCount() == 0) {
      return "no GPU: cudaGetDeviceCount reports 0 usable devices (" + CudaVersions() + ")";
    }
    return std::string();
  }();
  return reason;
}

// Always runs: the build's report and, without CUDA or a GPU, the error paths.
TEST(CudaBuild, VersionsAndFactories) {
  const std::string v = CudaVersions();
  EXPECT_FALSE(v.empty());
  std::cout << "CudaBuilt " << CudaBuilt() << ", CudaDeviceCount " << CudaDeviceCount() << ", " << v
            << "\n";
  if (!CudaBuilt()) {
    EXPECT_EQ(CudaDeviceCount(), 0);
    EXPECT_EQ(MakeCudaDevice(0).status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(MakeCudaKernels(nullptr).status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(MakeNcclWorld(nullptr).status().code(), absl::StatusCode::kUnimplemented);
    return;
  }
  // Built: the version string names every library.
  EXPECT_NE(v.find("cuda runtime"), std::string::npos) << v;
  EXPECT_NE(v.find("nccl"), std::string::npos) << v;
  // A non-CUDA device is rejected before anything touches a GPU.
  std::unique_ptr<Device> cpu = MakeCpuDevice();
  EXPECT_EQ(MakeCudaKernels(cpu.get()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeNcclWorld(cpu.get()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(MakeCudaDevice(-1).ok());
  if (CudaDeviceCount() == 0) {
    EXPECT_FALSE(MakeCudaDevice(0).ok());
  }
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!SkipReason().empty()) GTEST_SKIP() << SkipReason();
    absl::StatusOr<std::unique_ptr<Device>> d = MakeCudaDevice(0);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    dev_ = std::move(*d);
    absl::StatusOr<std::unique_ptr<Kernels>> k = MakeCudaKernels(dev_.get());
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    gpu_ = std::move(*k);
    cpu_ = MakeCpuKernels();
  }

  DeviceBuffer Alloc(size_t bytes) {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Make(dev_.get(), std::max<size_t>(bytes, 1));
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? std::move(*b) : DeviceBuffer();
  }
  DeviceBuffer UpRaw(const void* p, size_t bytes) {
    DeviceBuffer b = Alloc(bytes);
    if (b.data() != nullptr && bytes > 0) EXPECT_OK(dev_->Upload(b.data(), p, bytes));
    return b;
  }
  template <class T>
  DeviceBuffer Up(const std::vector<T>& v) {
    return UpRaw(v.data(), v.size() * sizeof(T));
  }
  // Floats stored as `t`.
  DeviceBuffer UpAs(const std::vector<float>& v, DType t) {
    if (t == DType::kF32) return Up(v);
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = FloatToBf16(v[i]);
    return Up(h);
  }
  // A buffer of n elements of `t` filled with NaN, to show that a kernel
  // overwrites (or zeroes) all of it.
  DeviceBuffer Garbage(size_t n, DType t) {
    std::vector<uint8_t> bytes(std::max<size_t>(n * SizeOf(t), 1), 0xff);
    return UpRaw(bytes.data(), bytes.size());
  }
  template <class T>
  std::vector<T> Down(const DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    if (n > 0) EXPECT_OK(dev_->Download(v.data(), b.data(), n * sizeof(T)));
    return v;
  }
  std::vector<float> DownAs(const DeviceBuffer& b, size_t n, DType t) {
    if (t == DType::kF32) return Down<float>(b, n);
    std::vector<uint16_t> h = Down<uint16_t>(b, n);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = Bf16ToFloat(h[i]);
    return v;
  }

  std::unique_ptr<Device> dev_;  // declared first: destroyed after the kernels
  std::unique_ptr<Kernels> gpu_;
  std::unique_ptr<Kernels> cpu_;
};

// ---------------------------------------------------------------- device ----

TEST_F(CudaTest, DeviceMemoryLanesAndStamps) {
  EXPECT_EQ(dev_->name(), "cuda:0");
  EXPECT_TRUE(dev_->is_gpu());
  EXPECT_NE(dev_->NativeStream(kComputeLane), nullptr);
  EXPECT_EQ(dev_->NativeStream(99), nullptr);

  const size_t n = 1000;
  DeviceBuffer a = Alloc(n);
  EXPECT_EQ(Down<uint8_t>(a, n), std::vector<uint8_t>(n, 0)) << "Alloc must zero";

  std::vector<uint8_t> pattern(n);
  for (size_t i = 0; i < n; ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_OK(dev_->Upload(a.data(), pattern.data(), n));
  DeviceBuffer b = Alloc(n);
  ASSERT_OK(dev_->Copy(b.data(), a.data(), n, kComputeLane));
  EXPECT_EQ(Down<uint8_t>(b, n), pattern);

  // Copy2D: 4 rows of 16 bytes, source pitch 24, destination pitch 32.
  DeviceBuffer c = Alloc(4 * 32);
  ASSERT_OK(dev_->Copy2D(c.data(), 32, a.data(), 24, 16, 4, kComputeLane));
  std::vector<uint8_t> c_host = Down<uint8_t>(c, 4 * 32);
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(c_host[r * 32 + i], i < 16 ? pattern[r * 24 + i] : 0) << r << "," << i;
    }
  }
  EXPECT_FALSE(dev_->Copy2D(c.data(), 8, a.data(), 24, 16, 4, kComputeLane).ok());

  ASSERT_OK(dev_->Zero(b.data(), 100, kComputeLane));
  std::vector<uint8_t> b_host = Down<uint8_t>(b, n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(b_host[i], i < 100 ? 0 : pattern[i]) << i;

  // A second lane ordered both ways with the compute lane.
  absl::StatusOr<LaneId> lane = dev_->NewLane();
  ASSERT_TRUE(lane.ok()) << lane.status().ToString();
  EXPECT_NE(*lane, kComputeLane);
  EXPECT_NE(dev_->NativeStream(*lane), nullptr);
  ASSERT_OK(dev_->Zero(b.data(), n, kComputeLane));
  ASSERT_OK(dev_->Join(*lane, kComputeLane));
  ASSERT_OK(dev_->Copy(b.data(), a.data(), n, *lane));
  ASSERT_OK(dev_->Join(kComputeLane, *lane));
  EXPECT_EQ(Down<uint8_t>(b, n), pattern);

  // Stamps: elapsed time between two records, and waits on a stamp.
  absl::StatusOr<Stamp> s0 = dev_->Record(kComputeLane);
  ASSERT_TRUE(s0.ok()) << s0.status().ToString();
  for (int i = 0; i < 10; ++i) ASSERT_OK(dev_->Copy(b.data(), a.data(), n, kComputeLane));
  absl::StatusOr<Stamp> s1 = dev_->Record(kComputeLane);
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  EXPECT_GE(s0->event, 0);
  EXPECT_NE(s0->event, s1->event);
  ASSERT_OK(dev_->WaitStamp(*lane, *s1));
  ASSERT_OK(dev_->Synchronize());
  absl::StatusOr<double> us = dev_->ElapsedUs(*s0, *s1);
  ASSERT_TRUE(us.ok()) << us.status().ToString();
  EXPECT_GE(*us, 0.0);
  dev_->RecycleStamps();
  absl::StatusOr<Stamp> s2 = dev_->Record(*lane);
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(s2->event, 0) << "RecycleStamps reuses the pool from the start";
  ASSERT_OK(dev_->Synchronize());

  // Bad lanes and stamps are errors, not crashes.
  EXPECT_EQ(dev_->Copy(b.data(), a.data(), n, 99).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->Join(99, kComputeLane).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->WaitStamp(kComputeLane, Stamp{}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->ElapsedUs(Stamp{}, *s2).status().code(), absl::StatusCode::kInvalidArgument);
  // Far more than any GPU has.
  EXPECT_EQ(dev_->Alloc(size_t{1} << 60).status().code(), absl::StatusCode::kResourceExhausted);
  // ...and the failed allocation leaves the device usable.
  ASSERT_OK(dev_->Copy(b.data(), a.data(), n, kComputeLane));
  ASSERT_OK(dev_->Synchronize());
}

// ------------------------------------------------------------------ GEMM ----

TEST_F(CudaTest, GemmMatchesCpu) {
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 48, 96}, {5, 130, 2}};
  uint32_t seed = 1;
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const Shape& sh : shapes) {
      for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
          for (float beta : {0.0f, 0.5f}) {
            const int64_t pad = (sh.m + sh.n) % 2 == 0 ? 0 : 3;  // strided rows sometimes
            const int64_t a_rows = ta ? sh.k : sh.m, a_cols = ta ? sh.m : sh.k;
            const int64_t b_rows = tb ? sh.n : sh.k, b_cols = tb ? sh.k : sh.n;
            const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = sh.n + pad;
            std::vector<float> a = Random(a_rows * lda, seed++, t);
            std::vector<float> b = Random(b_rows * ldb, seed++, t);
            std::vector<float> c = Random(sh.m * ldc, seed++, t);
            DeviceBuffer da = UpAs(a, t), db = UpAs(b, t), dc = UpAs(c, t);
            const float alpha = 1.25f;
            ASSERT_OK(gpu_->Gemm(ta, tb, sh.m, sh.n, sh.k, alpha, da.data(), lda, db.data(), ldb,
                                 beta, dc.data(), ldc, t));
            ASSERT_OK(cpu_->Gemm(ta, tb, sh.m, sh.n, sh.k, alpha, a.data(), lda, b.data(), ldb,
                                 beta, c.data(), ldc, DType::kF32));
            ExpectClose(DownAs(dc, c.size(), t), c, Tol(t),
                        Cat(DTypeName(t), " gemm m", sh.m, " n", sh.n, " k", sh.k, " ta", ta, " tb",
                            tb, " beta", beta));
          }
        }
      }
    }
    // k = 0: c = beta * c.
    std::vector<float> c = Random(12, seed++, t);
    DeviceBuffer dc = UpAs(c, t);
    ASSERT_OK(
        gpu_->Gemm(false, false, 3, 4, 0, 1.0f, nullptr, 1, nullptr, 4, 0.5f, dc.data(), 4, t));
    for (float& x : c) x = RoundTo(0.5f * x, t);
    ExpectClose(DownAs(dc, 12, t), c, 0.0, Cat(DTypeName(t), " gemm k=0"));
  }
}

TEST_F(CudaTest, GemmRejectsBadArguments) {
  DeviceBuffer buf = Alloc(1024);
  void* p = buf.data();
  EXPECT_EQ(gpu_->Gemm(false, false, 4, 4, 4, 1, p, 3, p, 4, 0, p, 4, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);  // lda < k
  EXPECT_EQ(gpu_->Gemm(false, true, 4, 4, 4, 1, p, 4, p, 3, 0, p, 4, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);  // ldb < k (b transposed)
  EXPECT_EQ(gpu_->Gemm(false, false, 4, 5, 4, 1, p, 4, p, 5, 0, p, 4, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);  // ldc < n
  EXPECT_EQ(gpu_->Gemm(false, false, -1, 4, 4, 1, p, 4, p, 4, 0, p, 4, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->Gemm(false, false, 4, 4, 4, 1, nullptr, 4, p, 4, 0, p, 4, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);
}

// --------------------------------------------------------------- gating ----

struct HostRoute {
  std::vector<float> probs;
  std::vector<int32_t> expert, slot;
  std::vector<float> weight;
};

HostRoute CpuRoute(Kernels* cpu, const std::vector<float>& logits, int64_t s, int64_t e, int64_t k,
                   int64_t cap) {
  HostRoute r;
  r.probs.resize(s * e);
  r.expert.resize(s * k);
  r.slot.resize(s * k);
  r.weight.resize(s * k);
  const absl::Status st =
      cpu->Route(logits.data(), s, e, k, cap,
                 {r.probs.data(), r.expert.data(), r.slot.data(), r.weight.data()});
  EXPECT_TRUE(st.ok()) << st.ToString();
  return r;
}

// Logits on a 1/64 grid in [-4, 4]: exact ties happen (and must go to the lower
// expert on both sides), while distinct logits differ by at least 1/64, far
// more than the last-ulp differences of expf on the two sides.
std::vector<float> GridLogits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(-256, 256);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(u(rng)) / 64.0f;
  return v;
}

TEST_F(CudaTest, RouteMatchesCpu) {
  struct Case {
    int64_t s, e, k, cap;
  };
  // Includes capacity 0, k = E, a single expert, and enough choices (10000)
  // for the capacity kernel to scan many chunks.
  const Case cases[] = {{1, 1, 1, 1},      {37, 8, 2, 6},    {200, 16, 4, 40},
                        {300, 64, 1, 3},   {50, 4, 4, 13},   {64, 8, 2, 0},
                        {5000, 8, 2, 700}, {129, 128, 8, 9}, {2000, 32, 2, 2000}};
  uint32_t seed = 100;
  for (const Case& c : cases) {
    for (bool all_equal : {false, true}) {
      std::vector<float> logits = GridLogits(c.s * c.e, seed++);
      if (all_equal) std::fill(logits.begin(), logits.end(), 0.5f);  // every choice a tie
      const HostRoute want = CpuRoute(cpu_.get(), logits, c.s, c.e, c.k, c.cap);
      DeviceBuffer dl = Up(logits), dp = Garbage(c.s * c.e, DType::kF32),
                   dex = Garbage(c.s * c.k, DType::kF32), dsl = Garbage(c.s * c.k, DType::kF32),
                   dw = Garbage(c.s * c.k, DType::kF32);
      RouteBuffers r{dp.as<float>(), dex.as<int32_t>(), dsl.as<int32_t>(), dw.as<float>()};
      ASSERT_OK(gpu_->Route(dl.as<float>(), c.s, c.e, c.k, c.cap, r));
      const std::string what =
          Cat("route S", c.s, " E", c.e, " k", c.k, " T", c.cap, all_equal ? " (all ties)" : "");
      const std::vector<int32_t> expert = Down<int32_t>(dex, c.s * c.k);
      const std::vector<int32_t> slot = Down<int32_t>(dsl, c.s * c.k);
      EXPECT_EQ(expert, want.expert) << what;
      EXPECT_EQ(slot, want.slot) << what;
      ExpectClose(Down<float>(dp, c.s * c.e), want.probs, 1e-6, what + " probs");
      ExpectClose(Down<float>(dw, c.s * c.k), want.weight, 1e-6, what + " weight");

      // The capacity rule straight from kernels.h, on the GPU's own choices:
      // choice by choice, tokens in order, an expert keeps its first T.
      std::vector<int64_t> used(c.e, 0);
      std::vector<int32_t> rule(c.s * c.k);
      const bool in_range =
          std::all_of(expert.begin(), expert.end(), [&](int32_t x) { return x >= 0 && x < c.e; });
      ASSERT_TRUE(in_range) << what << ": an expert index is out of range";
      for (int64_t j = 0; j < c.k; ++j) {
        for (int64_t s = 0; s < c.s; ++s) {
          int64_t& u = used[expert[s * c.k + j]];
          rule[s * c.k + j] = u < c.cap ? static_cast<int32_t>(u++) : -1;
        }
      }
      EXPECT_EQ(slot, rule) << what << ": slots break the sequential capacity rule";
    }
  }
}

TEST_F(CudaTest, RouteBackwardMatchesCpu) {
  const int64_t S = 123, E = 16, K = 3, T = 20;
  const HostRoute r = CpuRoute(cpu_.get(), GridLogits(S * E, 7), S, E, K, T);
  const std::vector<float> dweight = Random(S * K, 8);
  std::vector<float> want(S * E);
  ASSERT_OK(cpu_->RouteBackward(
      {const_cast<float*>(r.probs.data()), const_cast<int32_t*>(r.expert.data()),
       const_cast<int32_t*>(r.slot.data()), const_cast<float*>(r.weight.data())},
      dweight.data(), S, E, K, want.data()));
  DeviceBuffer dp = Up(r.probs), dex = Up(r.expert), dsl = Up(r.slot), dw = Up(r.weight),
               ddw = Up(dweight), dout = Garbage(S * E, DType::kF32);
  ASSERT_OK(
      gpu_->RouteBackward({dp.as<float>(), dex.as<int32_t>(), dsl.as<int32_t>(), dw.as<float>()},
                          ddw.as<float>(), S, E, K, dout.as<float>()));
  ExpectClose(Down<float>(dout, S * E), want, kF32Tol, "route backward");
}

// ------------------------------------------------------ order / i-order ----

// Offsets exactly as kernels.h states them: block p = t / (T/parts) of
// [E][T/parts][M], row t % (T/parts).
int64_t RefOffset(const BufferShape& s, int64_t e, int64_t t) {
  const int64_t tp = s.capacity / s.parts;
  return ((t / tp * s.experts + e) * tp + t % tp) * s.model;
}

TEST_F(CudaTest, OrderFamilyMatchesReference) {
  uint32_t seed = 1000;
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t parts : {1, 2, 3}) {
      for (int64_t model : {40, 300}) {
        BufferShape s;
        s.tokens = 29;
        s.model = model;
        s.experts = 6;
        s.top_k = 2;
        s.capacity = 12;  // a multiple of every `parts`; some choices drop
        s.parts = parts;
        s.dtype = t;
        const std::string what = Cat(DTypeName(t), " parts ", parts, " model ", model);
        const int64_t S = s.tokens, M = s.model, K = s.top_k, n_buf = s.BufferElements();
        const HostRoute hr =
            CpuRoute(cpu_.get(), GridLogits(S * s.experts, seed++), S, s.experts, K, s.capacity);
        DeviceBuffer dp = Up(hr.probs), dex = Up(hr.expert), dsl = Up(hr.slot), dw = Up(hr.weight);
        const RouteBuffers r{dp.as<float>(), dex.as<int32_t>(), dsl.as<int32_t>(), dw.as<float>()};
        auto kept = [&](int64_t c) { return hr.slot[c] >= 0; };
        auto off = [&](int64_t c) { return RefOffset(s, hr.expert[c], hr.slot[c]); };

        // Order.
        const std::vector<float> x = Random(S * M, seed++, t);
        std::vector<float> want_buf(n_buf, 0.0f);
        for (int64_t c = 0; c < S * K; ++c) {
          if (kept(c)) std::copy_n(&x[c / K * M], M, &want_buf[off(c)]);
        }
        DeviceBuffer dx = UpAs(x, t), dbuf = Garbage(n_buf, t);
        ASSERT_OK(gpu_->Order(dx.data(), r, s, dbuf.data()));
        ExpectClose(DownAs(dbuf, n_buf, t), want_buf, 0.0, what + " order");

        // IOrder over a buffer with every slot filled (unused ones must not leak).
        const std::vector<float> buf = Random(n_buf, seed++, t);
        std::vector<float> want_y(S * M, 0.0f);
        for (int64_t c = 0; c < S * K; ++c) {
          if (!kept(c)) continue;
          for (int64_t m = 0; m < M; ++m) want_y[c / K * M + m] += hr.weight[c] * buf[off(c) + m];
        }
        DeviceBuffer dbuf_in = UpAs(buf, t), dy = Garbage(S * M, t);
        ASSERT_OK(gpu_->IOrder(dbuf_in.data(), r, s, dy.data()));
        ExpectClose(DownAs(dy, S * M, t), want_y, Tol(t), what + " i-order");

        // IOrderBackward.
        const std::vector<float> gy = Random(S * M, seed++, t);
        const std::vector<float> out_buf = Random(n_buf, seed++, t);
        std::vector<float> want_dbuf(n_buf, 0.0f), want_dweight(S * K, 0.0f);
        for (int64_t c = 0; c < S * K; ++c) {
          if (!kept(c)) continue;
          double dot = 0.0;
          for (int64_t m = 0; m < M; ++m) {
            want_dbuf[off(c) + m] = hr.weight[c] * gy[c / K * M + m];
            dot += static_cast<double>(gy[c / K * M + m]) * out_buf[off(c) + m];
          }
          want_dweight[c] = static_cast<float>(dot);
        }
        DeviceBuffer dgy = UpAs(gy, t), dout_buf = UpAs(out_buf, t), ddbuf = Garbage(n_buf, t),
                     ddweight = Garbage(S * K, DType::kF32);
        ASSERT_OK(gpu_->IOrderBackward(dgy.data(), dout_buf.data(), r, s, ddbuf.data(),
                                       ddweight.as<float>()));
        ExpectClose(DownAs(ddbuf, n_buf, t), want_dbuf, Tol(t), what + " i-order backward dbuf");
        // dweight is fp32 from (possibly bf16) inputs: fp32 summation order only.
        ExpectClose(Down<float>(ddweight, S * K), want_dweight, 1e-5,
                    what + " i-order backward dweight");

        // OrderBackward.
        const std::vector<float> gbuf = Random(n_buf, seed++, t);
        std::vector<float> want_dx(S * M, 0.0f);
        for (int64_t c = 0; c < S * K; ++c) {
          if (!kept(c)) continue;
          for (int64_t m = 0; m < M; ++m) want_dx[c / K * M + m] += gbuf[off(c) + m];
        }
        DeviceBuffer dgbuf = UpAs(gbuf, t), ddx = Garbage(S * M, t);
        ASSERT_OK(gpu_->OrderBackward(dgbuf.data(), r, s, ddx.data()));
        ExpectClose(DownAs(ddx, S * M, t), want_dx, Tol(t), what + " order backward");

        // With one part the layout is plain [E][T][M]: the CPU kernels (f32,
        // on the same rounded values) must agree too.
        if (parts == 1) {
          const RouteBuffers hrb{
              const_cast<float*>(hr.probs.data()), const_cast<int32_t*>(hr.expert.data()),
              const_cast<int32_t*>(hr.slot.data()), const_cast<float*>(hr.weight.data())};
          BufferShape sf = s;
          sf.dtype = DType::kF32;
          std::vector<float> cpu_buf(n_buf), cpu_y(S * M), cpu_dbuf(n_buf), cpu_dw(S * K),
              cpu_dx(S * M);
          ASSERT_OK(cpu_->Order(x.data(), hrb, sf, cpu_buf.data()));
          ASSERT_OK(cpu_->IOrder(buf.data(), hrb, sf, cpu_y.data()));
          ASSERT_OK(cpu_->IOrderBackward(gy.data(), out_buf.data(), hrb, sf, cpu_dbuf.data(),
                                         cpu_dw.data()));
          ASSERT_OK(cpu_->OrderBackward(gbuf.data(), hrb, sf, cpu_dx.data()));
          ExpectClose(DownAs(dbuf, n_buf, t), cpu_buf, 0.0, what + " order vs cpu");
          ExpectClose(DownAs(dy, S * M, t), cpu_y, Tol(t), what + " i-order vs cpu");
          ExpectClose(DownAs(ddbuf, n_buf, t), cpu_dbuf, Tol(t), what + " dbuf vs cpu");
          ExpectClose(Down<float>(ddweight, S * K), cpu_dw, 1e-5, what + " dweight vs cpu");
          ExpectClose(DownAs(ddx, S * M, t), cpu_dx, Tol(t), what + " order backward vs cpu");
        }
      }
    }
  }
}

TEST_F(CudaTest, OrderRejectsBadShapes) {
  DeviceBuffer buf = Alloc(4096);
  const RouteBuffers r{buf.as<float>(), buf.as<int32_t>(), buf.as<int32_t>(), buf.as<float>()};
  BufferShape s;
  s.tokens = 4;
  s.model = 8;
  s.experts = 4;
  s.top_k = 2;
  s.capacity = 6;
  s.parts = 4;  // 6 is not a multiple of 4
  EXPECT_EQ(gpu_->Order(buf.data(), r, s, buf.data()).code(), absl::StatusCode::kInvalidArgument);
  s.parts = 1;
  s.top_k = 5;  // > experts
  EXPECT_EQ(gpu_->IOrder(buf.data(), r, s, buf.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->Route(buf.as<float>(), 4, 4, 5, 6, r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->Route(buf.as<float>(), 4, 0, 1, 6, r).code(), absl::StatusCode::kInvalidArgument);
}

// --------------------------------------------------------------- experts ----

TEST_F(CudaTest, ExpertMatchesCpu) {
  struct Case {
    int64_t g, el, r, m, h;
    bool gated;
  };
  // Batched over local experts, fused groups (El = 1), one group, no rows;
  // GELU and SwiGLU experts (w1 and z 2Hs wide, da into the up half of dz).
  const Case cases[] = {{2, 3, 5, 16, 24, false}, {3, 1, 4, 8, 12, false}, {1, 2, 7, 33, 20, false},
                        {4, 2, 6, 12, 10, false}, {2, 2, 0, 8, 8, false},  {2, 3, 5, 16, 24, true},
                        {3, 1, 4, 8, 12, true},   {1, 2, 7, 33, 20, true}, {2, 2, 0, 8, 8, true}};
  uint32_t seed = 5000;
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const Case& c : cases) {
      ExpertShape e;
      e.groups = c.g;
      e.local_experts = c.el;
      e.rows = c.r;
      e.model = c.m;
      e.shard = c.h;
      e.dtype = t;
      e.gated = c.gated;
      ExpertShape ef = e;
      ef.dtype = DType::kF32;
      const int64_t nt = e.TokenElements(), nh = e.HiddenElements(), nz = e.PreActivationElements(),
                    nw1 = e.W1Elements(), nw2 = e.W2Elements();
      const std::string what = Cat(DTypeName(t), c.gated ? " swiglu" : " gelu", " G", c.g, " El",
                                   c.el, " R", c.r, " M", c.m, " Hs", c.h);

      // Forward.
      const std::vector<float> x = Random(nt, seed++, t), w1 = Random(nw1, seed++, t),
                               w2 = Random(nw2, seed++, t);
      std::vector<float> z(nz), a(nh), out(nt);
      ASSERT_OK(
          cpu_->ExpertForward(ef, x.data(), w1.data(), w2.data(), z.data(), a.data(), out.data()));
      DeviceBuffer dx = UpAs(x, t), dw1 = UpAs(w1, t), dw2 = UpAs(w2, t), dz = Garbage(nz, t),
                   da = Garbage(nh, t), dout = Garbage(nt, t);
      ASSERT_OK(gpu_->ExpertForward(e, dx.data(), dw1.data(), dw2.data(), dz.data(), da.data(),
                                    dout.data()));
      ExpectClose(DownAs(dz, nz, t), z, Tol(t), what + " z");
      ExpectClose(DownAs(da, nh, t), a, Tol(t), what + " a");
      ExpectClose(DownAs(dout, nt, t), out, Tol(t), what + " out");

      // Input gradients (from random dout and z, the same on both sides).
      const std::vector<float> gout = Random(nt, seed++, t), zin = Random(nz, seed++, t, -3, 3);
      std::vector<float> gz(nz), gx(nt);
      ASSERT_OK(cpu_->ExpertBackwardData(ef, gout.data(), w1.data(), w2.data(), zin.data(),
                                         gz.data(), gx.data()));
      DeviceBuffer dgout = UpAs(gout, t), dzin = UpAs(zin, t), dgz = Garbage(nz, t),
                   dgx = Garbage(nt, t);
      ASSERT_OK(gpu_->ExpertBackwardData(e, dgout.data(), dw1.data(), dw2.data(), dzin.data(),
                                         dgz.data(), dgx.data()));
      ExpectClose(DownAs(dgz, nz, t), gz, Tol(t), what + " dz");
      ExpectClose(DownAs(dgx, nt, t), gx, Tol(t), what + " dx");

      // Weight gradients, overwriting NaN-filled outputs.
      const std::vector<float> ain = Random(nh, seed++, t), gzin = Random(nz, seed++, t);
      const float scale = 0.375f;
      std::vector<float> gw1(nw1), gw2(nw2);
      ASSERT_OK(cpu_->ExpertBackwardWeights(ef, x.data(), ain.data(), gout.data(), gzin.data(),
                                            scale, gw1.data(), gw2.data()));
      DeviceBuffer dain = UpAs(ain, t), dgzin = UpAs(gzin, t), dgw1 = Garbage(nw1, t),
                   dgw2 = Garbage(nw2, t);
      ASSERT_OK(gpu_->ExpertBackwardWeights(e, dx.data(), dain.data(), dgout.data(), dgzin.data(),
                                            scale, dgw1.data(), dgw2.data()));
      ExpectClose(DownAs(dgw1, nw1, t), gw1, Tol(t), what + " dw1");
      ExpectClose(DownAs(dgw2, nw2, t), gw2, Tol(t), what + " dw2");

      // The gated activation alone (the dropless experts' path) against the CPU's.
      if (c.gated && nh > 0) {
        const int64_t rows = c.g * c.el * c.r;
        std::vector<float> ca(nh), cdz = Random(nz, seed++, t);  // its up half: da
        ASSERT_OK(cpu_->GatedActivation(zin.data(), ca.data(), rows, c.h, DType::kF32));
        DeviceBuffer ga = Garbage(nh, t), gdz = UpAs(cdz, t);
        ASSERT_OK(gpu_->GatedActivation(dzin.data(), ga.data(), rows, c.h, t));
        ExpectClose(DownAs(ga, nh, t), ca, Tol(t), what + " gated activation");
        ASSERT_OK(cpu_->GatedActivationBackward(zin.data(), cdz.data(), rows, c.h, DType::kF32));
        ASSERT_OK(gpu_->GatedActivationBackward(dzin.data(), gdz.data(), rows, c.h, t));
        ExpectClose(DownAs(gdz, nz, t), cdz, Tol(t), what + " gated activation backward");
      }
    }
  }
  ExpertShape bad;
  bad.rows = -1;
  bad.model = 4;
  bad.shard = 4;
  EXPECT_EQ(gpu_->ExpertForward(bad, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaTest, ConversionsMatchCpu) {
  const int64_t n = 100003;  // not a multiple of any block size
  const std::vector<float> x = Random(n, 1, DType::kF32, -100, 100);
  const std::vector<float> y = Random(n, 2, DType::kF32, -100, 100);
  DeviceBuffer dx = Up(x);
  // f32: ToF32 copies, AddF32 adds.
  {
    DeviceBuffer dy = Up(y), dst = Garbage(n, DType::kF32);
    ASSERT_OK(gpu_->ToF32(dy.data(), DType::kF32, dst.as<float>(), n));
    EXPECT_EQ(Down<float>(dst, n), y);
    ASSERT_OK(gpu_->AddF32(dy.data(), DType::kF32, dx.as<float>(), n));
    std::vector<float> want = y;
    ASSERT_OK(cpu_->AddF32(want.data(), DType::kF32, x.data(), n));
    EXPECT_EQ(Down<float>(dy, n), want);
  }
  // bf16: both directions are exact functions (widening; round to nearest even).
  {
    std::vector<uint16_t> yh(n);
    for (int64_t i = 0; i < n; ++i) yh[i] = FloatToBf16(y[i]);
    DeviceBuffer dy = Up(yh), dst = Garbage(n, DType::kF32);
    ASSERT_OK(gpu_->ToF32(dy.data(), DType::kBF16, dst.as<float>(), n));
    const std::vector<float> widened = Down<float>(dst, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(widened[i], Bf16ToFloat(yh[i])) << i;
    ASSERT_OK(gpu_->AddF32(dy.data(), DType::kBF16, dx.as<float>(), n));
    const std::vector<uint16_t> sum = Down<uint16_t>(dy, n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(sum[i], FloatToBf16(Bf16ToFloat(yh[i]) + x[i])) << i;
    }
  }
  EXPECT_EQ(gpu_->ToF32(dx.data(), DType::kF32, dx.as<float>(), -1).code(),
            absl::StatusCode::kInvalidArgument);
}

// ------------------------------------------------------------------ NCCL ----

TEST_F(CudaTest, NcclSingleRankCollectives) {
  absl::StatusOr<std::unique_ptr<Communicator>> w = MakeNcclWorld(dev_.get());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  Communicator& world = **w;
  int mpi_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  ASSERT_EQ(mpi_size, 1) << "run this test without mpirun (a singleton)";
  EXPECT_EQ(world.backend(), "nccl");
  EXPECT_EQ(world.rank(), 0);
  EXPECT_EQ(world.size(), 1);
  EXPECT_NE(world.lane(), kComputeLane);

  uint32_t seed = 9000;
  for (DType t : {DType::kF32, DType::kBF16}) {
    const size_t n = 1000, pad = 24;
    const std::string what(DTypeName(t));
    const std::vector<float> x = Random(n, seed++, t);
    DeviceBuffer send = UpAs(x, t);
    auto fresh = [&](size_t count) { return Garbage(count, t); };

    DeviceBuffer recv = fresh(n);
    ASSERT_OK(world.AllGather(send.data(), recv.data(), n, t));
    EXPECT_EQ(DownAs(recv, n, t), x) << what << " all-gather";

    recv = fresh(n);
    ASSERT_OK(world.ReduceScatter(send.data(), recv.data(), n, t));
    EXPECT_EQ(DownAs(recv, n, t), x) << what << " reduce-scatter";

    recv = fresh(n);
    ASSERT_OK(world.AllReduce(send.data(), recv.data(), n, t));
    EXPECT_EQ(DownAs(recv, n, t), x) << what << " all-reduce";

    recv = fresh(n);
    ASSERT_OK(world.AlltoAll(send.data(), recv.data(), n, t));
    EXPECT_EQ(DownAs(recv, n, t), x) << what << " all-to-all";

    recv = fresh(n);
    Request timing;
    ASSERT_OK(world.SendRecv(send.data(), n, 0, recv.data(), n, 0, t, &timing));
    EXPECT_EQ(DownAs(recv, n, t), x) << what << " send-recv to self";
    EXPECT_EQ(timing.slot, -1);
    ASSERT_OK(dev_->Synchronize());
    absl::StatusOr<double> us = dev_->ElapsedUs(timing.begin, timing.end);
    ASSERT_TRUE(us.ok()) << us.status().ToString();
    EXPECT_GE(*us, 0.0);
    ASSERT_OK(world.SendRecv(nullptr, 0, -1, nullptr, 0, -1, t));  // nothing to do

    // Strided all-gather: rank 0's block at stride n + pad; the gap untouched.
    const std::vector<float> sentinel(n + pad, RoundTo(7.5f, t));
    recv = UpAs(sentinel, t);
    ASSERT_OK(world.AllGather(send.data(), recv.data(), n, t, n + pad));
    std::vector<float> want = sentinel;
    std::copy(x.begin(), x.end(), want.begin());
    EXPECT_EQ(DownAs(recv, n + pad, t), want) << what << " strided all-gather";

    // Strided reduce-scatter: block 0 read at stride n + pad.
    std::vector<float> strided_in = Random(n + pad, seed++, t);
    DeviceBuffer sin = UpAs(strided_in, t);
    recv = fresh(n);
    ASSERT_OK(world.ReduceScatter(sin.data(), recv.data(), n, t, n + pad));
    EXPECT_EQ(DownAs(recv, n, t), std::vector<float>(strided_in.begin(), strided_in.begin() + n))
        << what << " strided reduce-scatter";

    // Two ops in flight, then waited for (device side) and read.
    DeviceBuffer r1 = fresh(n), r2 = fresh(n);
    absl::StatusOr<Request> q1 = world.StartAllReduce(send.data(), r1.data(), n, t);
    absl::StatusOr<Request> q2 = world.StartAllGather(send.data(), r2.data(), n, t);
    ASSERT_TRUE(q1.ok() && q2.ok()) << q1.status().ToString() << " " << q2.status().ToString();
    EXPECT_GE(q1->slot, 0);
    EXPECT_GE(q2->slot, 0);
    ASSERT_OK(world.Wait(&*q2));
    ASSERT_OK(world.Wait(&*q1));
    EXPECT_EQ(q1->slot, -1);
    ASSERT_OK(world.Wait(&*q1));  // waiting twice is harmless
    EXPECT_EQ(DownAs(r1, n, t), x) << what << " non-blocking all-reduce";
    EXPECT_EQ(DownAs(r2, n, t), x) << what << " non-blocking all-gather";
    dev_->RecycleStamps();
  }

  // Argument errors.
  DeviceBuffer buf = Alloc(4096);
  EXPECT_EQ(world.StartSendRecv(buf.data(), 4, 1, buf.data(), 4, -1, DType::kF32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(world.StartAllGather(buf.data(), buf.data(), 8, DType::kF32, 4).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A sub-communicator on its own lane.
  absl::StatusOr<std::unique_ptr<Communicator>> sub = world.Split(0, 0);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  EXPECT_EQ((*sub)->size(), 1);
  EXPECT_NE((*sub)->lane(), world.lane());
  const std::vector<float> x = Random(64, 3);
  DeviceBuffer s = Up(x), r = Garbage(64, DType::kF32);
  ASSERT_OK((*sub)->AllReduce(s.data(), r.data(), 64, DType::kF32));
  EXPECT_EQ(Down<float>(r, 64), x);
  ASSERT_OK((*sub)->Barrier());
  ASSERT_OK(world.Barrier());
}

// ------------------------------------------------------------ interpreter ----

// One MoE layer on one GPU (every group has one rank: the plan's collectives
// are aliases), interpreted on CUDA streams, against the same plan on the CPU
// backend over MPI_COMM_WORLD (a singleton): outputs, input, gate and expert
// gradients and routing, for every schedule, padded and dropless, GELU and
// SwiGLU experts. The measured timeline honours every edge of the plan.
TEST_F(CudaTest, InterpreterRunsEveryScheduleLikeTheCpu) {
  std::unique_ptr<Device> cpu_dev = MakeCpuDevice();
  absl::StatusOr<std::unique_ptr<Communicator>> cpu_world = MakeMpiWorld(cpu_dev.get());
  ASSERT_TRUE(cpu_world.ok()) << cpu_world.status();
  absl::StatusOr<std::unique_ptr<Communicator>> gpu_world = MakeNcclWorld(dev_.get());
  ASSERT_TRUE(gpu_world.ok()) << gpu_world.status();
  ASSERT_EQ((*cpu_world)->size(), 1) << "run this test without mpirun (a singleton)";

  planner::LayerConfig l;
  l.name = "one-gpu";
  l.batch_size = 4;
  l.seq_len = 64;  // S = 256
  l.model_dim = 128;
  l.hidden_dim = 256;
  l.num_experts = 8;
  l.top_k = 2;
  l.capacity_factor = 1.0;  // some choices dropped
  l.bytes_per_element = 4;
  l.parallel.mp = l.parallel.ep = l.parallel.esp = l.parallel.dp = 1;

  struct Case {
    planner::Schedule schedule;
    bool dropless;
    DType dtype;
    bool gated = false;  // SwiGLU experts
  };
  const std::vector<Case> cases = {
      {planner::Schedule::kDefault, false, DType::kF32},
      {planner::Schedule::kS1, false, DType::kF32},
      {planner::Schedule::kS2, false, DType::kF32},
      {planner::Schedule::kDefault, true, DType::kF32},
      {planner::Schedule::kDefault, false, DType::kBF16},
      {planner::Schedule::kDefault, false, DType::kF32, true},
      {planner::Schedule::kS2, false, DType::kF32, true},
      {planner::Schedule::kDefault, true, DType::kF32, true},
      {planner::Schedule::kDefault, false, DType::kBF16, true},
  };
  for (const Case& c : cases) {
    planner::LayerConfig layer = l;
    layer.dropless = c.dropless;
    layer.gated_linear_unit = c.gated;
    layer.bytes_per_element = c.dtype == DType::kBF16 ? 2 : 4;
    SCOPED_TRACE(testing::Message()
                 << planner::ScheduleName(c.schedule) << (c.dropless ? " dropless " : " padded ")
                 << DTypeName(c.dtype) << (c.gated ? " swiglu" : " gelu"));
    absl::StatusOr<planner::OpGraph> plan = PlanLayerRun(layer, c.schedule, 1, 1, nullptr);
    ASSERT_TRUE(plan.ok()) << plan.status();
    RunOptions opt;
    opt.dtype = c.dtype;
    opt.seed = 7;
    auto run = [&](Device* d, Kernels* k, Communicator* w,
                   std::vector<OpTime>* times) -> absl::StatusOr<LayerResults> {
      absl::StatusOr<std::unique_ptr<MoeLayerRunner>> r =
          MoeLayerRunner::Create(layer, *plan, opt, d, k, w);
      if (!r.ok()) return r.status();
      for (int it = 0; it < 2; ++it) {
        absl::Status st = (*r)->RunIteration();
        if (!st.ok()) return st;
      }
      if (times != nullptr) *times = (*r)->timings();
      return (*r)->Results();
    };
    std::vector<OpTime> gpu_times;
    absl::StatusOr<LayerResults> got = run(dev_.get(), gpu_.get(), gpu_world->get(), &gpu_times);
    ASSERT_TRUE(got.ok()) << got.status();
    if (c.dtype == DType::kF32) {
      absl::StatusOr<LayerResults> want = run(cpu_dev.get(), cpu_.get(), cpu_world->get(), nullptr);
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_TRUE(SameRouting(*want, *got, layer.top_k, /*slots=*/true));
      EXPECT_EQ(DroppedChoices(*want), DroppedChoices(*got));
      for (const TensorDiff& d : CompareResults(*want, *got)) {
        EXPECT_GT(d.max_abs_ref, 0.0) << d.tensor << " is all zero: the check proves nothing";
        EXPECT_LE(d.max_abs_diff, 1e-4 * d.max_abs_ref)
            << d.tensor << ": max |gpu - cpu| " << d.max_abs_diff << " vs max |cpu| "
            << d.max_abs_ref;
      }
    } else {
      // The CPU backend computes in f32 only, and bf16 inputs may route a
      // near-tie differently: here every tensor is finite and not all zero.
      for (const auto* t : {&got->y, &got->dx, &got->dgate, &got->dw1, &got->dw2}) {
        EXPECT_FALSE(t->empty());
        EXPECT_TRUE(std::all_of(t->begin(), t->end(), [](float v) { return std::isfinite(v); }));
        EXPECT_TRUE(std::any_of(t->begin(), t->end(), [](float v) { return v != 0.0f; }));
      }
    }
    if (!c.dropless) {
      EXPECT_GT(DroppedChoices(*got), 0) << "capacity 1.0 drops on this seed";
    }
    // Ops timed under the plan's names, every edge honoured (device events).
    ExpectRunFollowsPlan(*plan, gpu_times);
  }
}

// Every variant of a whole model on one GPU: dense ops through cuBLAS and
// device copies, MoE instances per block and piece, every op timed under its
// planner name with every edge honoured in the event timeline. Prints each
// variant's measured iteration (a GPT-2-small-like model, 4 blocks).
TEST_F(CudaTest, WholeModelsRunEveryVariantOnStreams) {
  absl::StatusOr<std::unique_ptr<Communicator>> world = MakeNcclWorld(dev_.get());
  ASSERT_TRUE(world.ok()) << world.status();
  planner::ModelConfig m;
  m.name = "gpt2-small-like";
  m.num_layers = 4;
  m.hidden_size = 768;
  m.num_attention_heads = 12;
  m.ffn_hidden_size = 3072;
  m.seq_length = 512;
  m.micro_batch_size = 8;
  m.vocab_size = 50304;
  m.bytes_per_element = 2;
  m.moe.layer_freq = 2;
  m.moe.num_experts = 8;
  m.moe.top_k = 2;
  m.moe.capacity_factor = 1.25;
  m.moe.expert_ffn_hidden_size = 3072;
  m.parallel = {.mp = 1, .ep = 1, .esp = 1, .dp = 1, .pp = 1};
  for (planner::Variant v : planner::kAllVariants) {
    SCOPED_TRACE(planner::VariantName(v));
    planner::ModelPlanOptions o;
    o.tutel_degrees = {4};
    absl::StatusOr<planner::VariantPlan> plan = PlanModelRun(m, v, 1, 1, nullptr, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    RunOptions opt;
    opt.dtype = DType::kBF16;
    absl::StatusOr<std::unique_ptr<ModelRunner>> r =
        ModelRunner::Create(m, plan->graph, opt, dev_.get(), gpu_.get(), world->get());
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<double> totals;
    for (int it = 0; it < 4; ++it) {
      ASSERT_OK((*r)->RunIteration());
      totals.push_back((*r)->total_us());
    }
    const planner::OpGraph& g = plan->graph;
    ExpectRunFollowsPlan(g, (*r)->timings());
    EXPECT_GT((*r)->forward_us(), 0.0);
    EXPECT_GT((*r)->total_us(), (*r)->forward_us());
    std::sort(totals.begin() + 1, totals.end());
    std::cout << "model " << m.name << " variant " << planner::VariantName(v) << ": " << g.size()
              << " ops, " << (*r)->layer_instances() << " MoE instances, iteration " << totals[2]
              << " us (median of 3 after a warm-up), forward " << (*r)->forward_us() << " us\n";
  }
}

// ------------------------------------------------------------ throughput ----

// Prints rates measured with the device's stamps; asserts only that it ran.
TEST_F(CudaTest, KernelThroughput) {
  auto time_us = [&](int iters, const auto& body) -> double {
    EXPECT_OK(body());  // warm-up (cuBLAS heuristics, first launches)
    absl::StatusOr<Stamp> a = dev_->Record(kComputeLane);
    for (int i = 0; i < iters; ++i) EXPECT_OK(body());
    absl::StatusOr<Stamp> b = dev_->Record(kComputeLane);
    EXPECT_OK(dev_->Synchronize());
    if (!a.ok() || !b.ok()) return -1.0;
    absl::StatusOr<double> us = dev_->ElapsedUs(*a, *b);
    dev_->RecycleStamps();
    return us.ok() ? *us / iters : -1.0;
  };

  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {1024, 4096, 8192}) {
      if (t == DType::kF32 && n == 8192) continue;  // ~1 TFLOP per call at fp32: skip
      DeviceBuffer a = Alloc(n * n * SizeOf(t)), b = Alloc(n * n * SizeOf(t)),
                   c = Alloc(n * n * SizeOf(t));
      const double us = time_us(5, [&] {
        return gpu_->Gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n,
                          t);
      });
      std::cout << "gemm " << DTypeName(t) << " " << n << "^3: " << us << " us, "
                << 2.0 * n * n * n / (us * 1e-6) / 1e12 << " TFLOP/s\n";
    }
  }

  // Memory-bound kernels: GB/s = bytes read + written per call / time.
  const int64_t count = int64_t{1} << 26;  // 64 Mi elements
  DeviceBuffer f32 = Alloc(count * 4), f32b = Alloc(count * 4), bf = Alloc(count * 2);
  auto report = [](const std::string& what, double us, double bytes) {
    std::cout << what << ": " << us << " us, " << bytes / (us * 1e-6) / 1e9 << " GB/s\n";
  };
  report("device copy 256 MiB",
         time_us(10, [&] { return dev_->Copy(f32b.data(), f32.data(), count * 4, kComputeLane); }),
         2.0 * count * 4);
  report("ToF32 bf16 64Mi",
         time_us(10, [&] { return gpu_->ToF32(bf.data(), DType::kBF16, f32.as<float>(), count); }),
         count * (2.0 + 4.0));
  report("AddF32 bf16 64Mi",
         time_us(10, [&] { return gpu_->AddF32(bf.data(), DType::kBF16, f32.as<float>(), count); }),
         count * (2.0 + 4.0 + 2.0));

  // Gating and dispatch at a typical MoE layer size.
  BufferShape s;
  s.tokens = 8192;
  s.model = 4096;
  s.experts = 64;
  s.top_k = 2;
  s.capacity = 320;  // 1.25 * S * k / E
  s.dtype = DType::kBF16;
  const int64_t choices = s.tokens * s.top_k;
  DeviceBuffer logits = Up(GridLogits(s.tokens * s.experts, 11));
  DeviceBuffer probs = Alloc(s.tokens * s.experts * 4), ex = Alloc(choices * 4),
               sl = Alloc(choices * 4), wt = Alloc(choices * 4);
  const RouteBuffers r{probs.as<float>(), ex.as<int32_t>(), sl.as<int32_t>(), wt.as<float>()};
  const double route_us = time_us(10, [&] {
    return gpu_->Route(logits.as<float>(), s.tokens, s.experts, s.top_k, s.capacity, r);
  });
  std::cout << "route S" << s.tokens << " E" << s.experts << " k" << s.top_k << ": " << route_us
            << " us\n";
  DeviceBuffer x = Alloc(s.tokens * s.model * 2), buf = Alloc(s.BufferElements() * 2),
               y = Alloc(s.tokens * s.model * 2);
  // Order: zero the buffer, copy each kept row (at most every choice).
  report("order bf16 S8192 M4096 E64 k2 T320",
         time_us(10, [&] { return gpu_->Order(x.data(), r, s, buf.data()); }),
         s.BufferElements() * 2.0 + 2.0 * choices * s.model * 2.0);
  report("i-order bf16 S8192 M4096 E64 k2 T320",
         time_us(10, [&] { return gpu_->IOrder(buf.data(), r, s, y.data()); }),
         choices * s.model * 2.0 + s.tokens * s.model * 2.0);
}

}  // namespace
}  // namespace moeplan::executor

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
