// CudaKernels: the Kernels of kernels.h on a GPU. GEMMs are cuBLAS (fp32
// compute, row-major by the operand swap), the rest are small kernels written
// for exactness first (gating reproduces the sequential capacity semantics
// bit for bit) and reasonable speed second. Everything runs on the compute
// lane's stream; the only allocation after construction is the growth of one
// fp32 scratch buffer (bf16 weight-gradient accumulation). The experts'
// activations (GELU, SwiGLU) are in cuda_activation.cu.
//
// Compiled by nvcc as C++17.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "../kernel_checks.h"
#include "cuda_activation.h"
#include "cuda_elementwise.cuh"
#include "cuda_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/kernels.h"

namespace moeplan::executor {
namespace {

using internal::bf16;
using internal::Load;
using internal::Store;

// ---------------------------------------------------------------- errors ----

absl::Status CublasErrorStatus(cublasStatus_t st, const char* call, const std::string& where) {
  std::string msg = Cat("cublas: ", call, " in ", where, ": ", cublasGetStatusString(st));
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

#define MOEPLAN_CUBLAS_RETURN_IF_ERROR(expr, ...)                                       \
  do {                                                                                  \
    const cublasStatus_t moeplan_cublas_st_ = (expr);                                   \
    if (moeplan_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                  \
      return CublasErrorStatus(moeplan_cublas_st_, #expr, ::moeplan::Cat(__VA_ARGS__)); \
    }                                                                                   \
  } while (false)

// Launch errors (bad configuration) are reported by cudaGetLastError right
// after the launch; faults inside the kernel surface at the next synchronising
// call.
#define MOEPLAN_CUDA_CHECK_LAUNCH(...) MOEPLAN_CUDA_RETURN_IF_ERROR(cudaGetLastError(), __VA_ARGS__)

// "cuda kernels: <who>: <what>", as the shared checks word it (kernel_checks.h).
absl::Status Invalid(std::string_view who, std::string_view what) {
  return internal::ArgCheck("cuda", who).Bad(what);
}

// ------------------------------------------------------- device helpers ----

// Element offset of slot t of expert e in the `parts`-blocked dispatch buffer
// (kernels.h: block t / Tp, row t % Tp, Tp = T / parts).
__device__ __forceinline__ int64_t SlotOffset(int64_t e, int64_t t, int64_t experts, int64_t tp,
                                              int64_t model) {
  const int64_t p = t / tp;
  const int64_t row = t - p * tp;
  return ((p * experts + e) * tp + row) * model;
}

// Whether choice c is kept and addresses a valid slot (defensive: a slot from
// another capacity must not write out of bounds).
__device__ __forceinline__ bool Kept(const int32_t* expert, const int32_t* slot, int64_t c,
                                     int64_t experts, int64_t capacity, int64_t* e, int64_t* t) {
  *e = expert[c];
  *t = slot[c];
  return *t >= 0 && *t < capacity && *e >= 0 && *e < experts;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); the result is
// valid in thread 0. `shm` holds 32 floats; safe to call again right after.
__device__ float BlockSum(float v, float* shm) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  float r = 0.0f;
  if (threadIdx.x == 0) {
    const int warps = blockDim.x >> 5;
    for (int w = 0; w < warps; ++w) r += shm[w];
  }
  __syncthreads();
  return r;
}

// --------------------------------------------------------------- kernels ----

// One thread per token: softmax (max-subtracted, summed in expert order), then
// the top-k by (probability desc, expert asc) without scratch: pick j is the
// best element strictly after pick j-1 in that order. Slots start dropped; the
// capacity kernel fills in the kept ones.
__global__ void SoftmaxTopKKernel(const float* logits, int64_t tokens, int experts, int top_k,
                                  float* probs, int32_t* expert, int32_t* slot, float* weight) {
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < tokens;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* x = logits + s * experts;
    float* p = probs + s * experts;
    float mx = x[0];
    for (int e = 1; e < experts; ++e) mx = fmaxf(mx, x[e]);
    // Summed in double and scaled by one float reciprocal, as the CPU kernels
    // do, so that probabilities (and hence top-k near-ties) differ from the
    // CPU's only by expf's last-ulp differences.
    double sum = 0.0;
    for (int e = 0; e < experts; ++e) {
      const float v = expf(x[e] - mx);
      p[e] = v;
      sum += v;
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int e = 0; e < experts; ++e) p[e] *= inv;
    float prev_p = 0.0f;
    int prev_e = -1;
    for (int j = 0; j < top_k; ++j) {
      int best = -1;
      float bp = 0.0f;
      for (int e = 0; e < experts; ++e) {
        const float v = p[e];
        const bool after_prev = j == 0 || v < prev_p || (v == prev_p && e > prev_e);
        if (after_prev && (best < 0 || v > bp)) {
          best = e;
          bp = v;
        }
      }
      expert[s * top_k + j] = best;
      slot[s * top_k + j] = -1;
      weight[s * top_k + j] = best >= 0 ? bp : 0.0f;
      prev_p = bp;
      prev_e = best;
    }
  }
}

// One block per expert (grid-stride over experts) scans all choices in
// choice-major order (q = j * S + s) in chunks of blockDim.x, numbering this
// expert's assignments with a ballot prefix count: assignment number n < T
// gets slot n, later ones stay dropped. This is exactly the sequential
// "first choices of all tokens, then second choices, ..." rule.
__global__ void CapacityKernel(const int32_t* expert, int64_t tokens, int top_k, int experts,
                               int64_t capacity, int32_t* slot) {
  __shared__ int warp_counts[32];
  __shared__ long long base;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int64_t total = tokens * top_k;
  for (int e = blockIdx.x; e < experts; e += gridDim.x) {
    if (threadIdx.x == 0) base = 0;
    __syncthreads();
    for (int64_t start = 0; start < total; start += blockDim.x) {
      const int64_t q = start + threadIdx.x;
      bool mine = false;
      int64_t idx = 0;
      if (q < total) {
        const int64_t j = q / tokens;
        const int64_t s = q - j * tokens;
        idx = s * top_k + j;
        mine = expert[idx] == e;
      }
      const unsigned mask = __ballot_sync(0xffffffffu, mine);
      if (lane == 0) warp_counts[warp] = __popc(mask);
      __syncthreads();
      long long pos = base + __popc(mask & ((1u << lane) - 1u));
      for (int w = 0; w < warp; ++w) pos += warp_counts[w];
      if (mine && pos < capacity) slot[idx] = static_cast<int32_t>(pos);
      __syncthreads();
      if (threadIdx.x == 0) {
        long long sum = 0;
        for (int w = 0; w < warps; ++w) sum += warp_counts[w];
        base += sum;
      }
      __syncthreads();
    }
  }
}

// One thread per (token, expert).
__global__ void RouteBackwardKernel(const float* probs, const int32_t* expert, const int32_t* slot,
                                    const float* dweight, int64_t tokens, int experts, int top_k,
                                    float* dlogits) {
  const int64_t n = tokens * experts;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = i / experts;
    const int e = static_cast<int>(i - s * experts);
    float g = 0.0f;
    double dot =
        0.0;  // sum_e' p[s][e'] g[s][e'], nonzero only at kept choices (double: as the CPU)
    for (int j = 0; j < top_k; ++j) {
      const int64_t c = s * top_k + j;
      const int ex = expert[c];
      if (slot[c] < 0 || ex < 0 || ex >= experts) continue;
      const float d = dweight[c];
      dot += static_cast<double>(probs[s * experts + ex]) * d;
      if (ex == e) g = d;
    }
    dlogits[i] = probs[i] * (g - static_cast<float>(dot));
  }
}

// Order: one block per choice; copies the token row into its slot.
template <class T>
__global__ void OrderKernel(const T* x, const int32_t* expert, const int32_t* slot, int64_t choices,
                            int top_k, int64_t experts, int64_t capacity, int64_t tp, int64_t model,
                            T* buf) {
  for (int64_t c = blockIdx.x; c < choices; c += gridDim.x) {
    int64_t e, t;
    if (!Kept(expert, slot, c, experts, capacity, &e, &t)) continue;
    const T* src = x + (c / top_k) * model;
    T* dst = buf + SlotOffset(e, t, experts, tp, model);
    for (int64_t m = threadIdx.x; m < model; m += blockDim.x) dst[m] = src[m];
  }
}

// IOrder: one block per token; y = sum_j weight_j * buf[slot_j] in fp32.
template <class T>
__global__ void IOrderKernel(const T* buf, const int32_t* expert, const int32_t* slot,
                             const float* weight, int64_t tokens, int top_k, int64_t experts,
                             int64_t capacity, int64_t tp, int64_t model, T* y) {
  for (int64_t s = blockIdx.x; s < tokens; s += gridDim.x) {
    for (int64_t m = threadIdx.x; m < model; m += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < top_k; ++j) {
        const int64_t c = s * top_k + j;
        int64_t e, t;
        if (!Kept(expert, slot, c, experts, capacity, &e, &t)) continue;
        acc += weight[c] * Load(buf[SlotOffset(e, t, experts, tp, model) + m]);
      }
      y[s * model + m] = Store<T>(acc);
    }
  }
}

// IOrderBackward: one block per choice; dbuf[slot] = weight * dy[s] and
// dweight = <dy[s], out_buf[slot]> (0 when dropped).
template <class T>
__global__ void IOrderBackwardKernel(const T* dy, const T* out_buf, const int32_t* expert,
                                     const int32_t* slot, const float* weight, int64_t choices,
                                     int top_k, int64_t experts, int64_t capacity, int64_t tp,
                                     int64_t model, T* dbuf, float* dweight) {
  __shared__ float shm[32];
  for (int64_t c = blockIdx.x; c < choices; c += gridDim.x) {
    int64_t e, t;
    // Uniform over the block (c is), so the reduction's barriers are safe.
    if (!Kept(expert, slot, c, experts, capacity, &e, &t)) {
      if (threadIdx.x == 0) dweight[c] = 0.0f;
      continue;
    }
    const float w = weight[c];
    const T* d = dy + (c / top_k) * model;
    const int64_t off = SlotOffset(e, t, experts, tp, model);
    float dot = 0.0f;
    for (int64_t m = threadIdx.x; m < model; m += blockDim.x) {
      const float dv = Load(d[m]);
      dbuf[off + m] = Store<T>(w * dv);
      dot += dv * Load(out_buf[off + m]);
    }
    dot = BlockSum(dot, shm);
    if (threadIdx.x == 0) dweight[c] = dot;
  }
}

// OrderBackward: one block per token; dx = sum_j dbuf[slot_j] in fp32.
template <class T>
__global__ void OrderBackwardKernel(const T* dbuf, const int32_t* expert, const int32_t* slot,
                                    int64_t tokens, int top_k, int64_t experts, int64_t capacity,
                                    int64_t tp, int64_t model, T* dx) {
  for (int64_t s = blockIdx.x; s < tokens; s += gridDim.x) {
    for (int64_t m = threadIdx.x; m < model; m += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < top_k; ++j) {
        const int64_t c = s * top_k + j;
        int64_t e, t;
        if (!Kept(expert, slot, c, experts, capacity, &e, &t)) continue;
        acc += Load(dbuf[SlotOffset(e, t, experts, tp, model) + m]);
      }
      dx[s * model + m] = Store<T>(acc);
    }
  }
}

template <class T>
__global__ void ToF32Kernel(const T* src, float* dst, int64_t n) {
  MOEPLAN_GRID_STRIDE(i, n) { dst[i] = Load(src[i]); }
}

template <class T>
__global__ void FromF32Kernel(const float* src, T* dst, int64_t n) {
  MOEPLAN_GRID_STRIDE(i, n) { dst[i] = Store<T>(src[i]); }
}

template <class T>
__global__ void AddF32Kernel(T* y, const float* x, int64_t n) {
  MOEPLAN_GRID_STRIDE(i, n) { y[i] = Store<T>(Load(y[i]) + x[i]); }
}

// c[r][col] = beta * c[r][col] for an m x n row-major matrix (ldc); beta == 0
// writes zeros without reading c (BLAS semantics: NaNs in c do not survive).
template <class T>
__global__ void ScaleMatrixKernel(T* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  MOEPLAN_GRID_STRIDE(i, m * n) {
    const int64_t r = i / n;
    T* p = c + r * ldc + (i - r * n);
    *p = beta == 0.0f ? Store<T>(0.0f) : Store<T>(beta * Load(*p));
  }
}

// ------------------------------------------------------------ host side ----

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // every kernel grid-strides beyond this

unsigned BlocksFor(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, kMaxBlocks));
}
unsigned BlocksForRows(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, kMaxBlocks));
}
// Threads per row for row-parallel kernels: enough for the row, a multiple of
// 32 (BlockSum needs whole warps).
int ThreadsForRow(int64_t model) {
  if (model <= 32) return 32;
  if (model <= 64) return 64;
  if (model <= 128) return 128;
  return kThreads;
}

bool ValidType(DType t) { return t == DType::kF32 || t == DType::kBF16; }
cudaDataType CudaType(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

const char* Offset(const void* p, int64_t elements, size_t elt) {
  return static_cast<const char*>(p) + elements * static_cast<int64_t>(elt);
}
char* Offset(void* p, int64_t elements, size_t elt) {
  return static_cast<char*>(p) + elements * static_cast<int64_t>(elt);
}

absl::Status CheckType(std::string_view who, DType t) {
  if (!ValidType(t)) return Invalid(who, Cat("unsupported dtype ", static_cast<int>(t)));
  return absl::OkStatus();
}

// The shared checks (kernel_checks.h), then cuBLAS's and the kernels' int
// index ranges.
absl::Status CheckGating(std::string_view who, int64_t tokens, int64_t experts, int64_t top_k) {
  MOEPLAN_RETURN_IF_ERROR(internal::ArgCheck("cuda", who).Gating(tokens, experts, top_k));
  if (experts > INT_MAX) return Invalid(who, Cat("experts (", experts, ") must be <= INT_MAX"));
  return absl::OkStatus();
}

absl::Status CheckBufferShape(std::string_view who, const BufferShape& s) {
  MOEPLAN_RETURN_IF_ERROR(CheckType(who, s.dtype));
  MOEPLAN_RETURN_IF_ERROR(internal::ArgCheck("cuda", who).Buffer(s));
  if (s.experts > INT_MAX) return Invalid(who, Cat("experts (", s.experts, ") must be <= INT_MAX"));
  if (s.capacity > INT32_MAX) {
    return Invalid(who, Cat("capacity (", s.capacity, ") must be <= INT32_MAX"));
  }
  return absl::OkStatus();
}

// The routing arrays have tokens * top_k entries; with none they may be null.
absl::Status CheckRouting(std::string_view who, const RouteBuffers& r, int64_t choices,
                          bool need_weight) {
  return internal::ArgCheck("cuda", who).Routing(r, choices, need_weight);
}

absl::Status CheckExpertShape(std::string_view who, const ExpertShape& e) {
  MOEPLAN_RETURN_IF_ERROR(CheckType(who, e.dtype));
  MOEPLAN_RETURN_IF_ERROR(internal::ArgCheck("cuda", who).Expert(e));
  // cuBLAS takes int dimensions; with El == 1 the groups are fused into one
  // GEMM of G*R rows.
  if (e.groups > INT_MAX || e.local_experts > INT_MAX || e.model > INT_MAX ||
      e.FirstWidth() > INT_MAX || e.rows > INT_MAX / std::max<int64_t>(e.groups, 1)) {
    return Invalid(who, "a dimension exceeds cuBLAS's int range");
  }
  return absl::OkStatus();
}

// The gated activation's arguments (as the CPU kernels check them).
absl::Status CheckRows(std::string_view who, int64_t rows, int64_t width, DType t) {
  MOEPLAN_RETURN_IF_ERROR(CheckType(who, t));
  const internal::ArgCheck check("cuda", who);
  MOEPLAN_RETURN_IF_ERROR(check.NonNegative("rows", rows));
  return check.NonNegative("width", width);
}

// A pointer may be null only when its tensor has no elements (as on the CPU).
constexpr auto kTokens = internal::ArgCheck::Tensor::kTokens;
constexpr auto kHidden = internal::ArgCheck::Tensor::kHidden;
constexpr auto kPreActivation = internal::ArgCheck::Tensor::kPreActivation;
constexpr auto kW1 = internal::ArgCheck::Tensor::kW1;
constexpr auto kW2 = internal::ArgCheck::Tensor::kW2;
absl::Status CheckPointers(std::string_view who, const ExpertShape& e,
                           std::initializer_list<internal::ArgCheck::ExpertPointer> ptrs) {
  return internal::ArgCheck("cuda", who).ExpertPointers(e, ptrs);
}

class CudaKernels final : public Kernels {
 public:
  CudaKernels(int ordinal, cudaStream_t stream) : ordinal_(ordinal), stream_(stream) {}

  absl::Status Init() {
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), "MakeCudaKernels on cuda:", ordinal_);
    MOEPLAN_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle_), "MakeCudaKernels on cuda:", ordinal_);
    MOEPLAN_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle_, stream_),
                                   "MakeCudaKernels on cuda:", ordinal_);
    return absl::OkStatus();
  }

  ~CudaKernels() override {
    if (cudaSetDevice(ordinal_) != cudaSuccess) return;
    // The scratch may still be in use by queued work.
    (void)cudaStreamSynchronize(stream_);
    if (scratch_ != nullptr) (void)cudaFree(scratch_);
    if (handle_ != nullptr) (void)cublasDestroy(handle_);
    (void)cudaGetLastError();
  }

  std::string_view name() const override { return "cuda-cublas"; }
  bool Supports(DType t) const override { return ValidType(t); }

  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
                    int64_t ldc, DType t) override {
    constexpr std::string_view kWho = "Gemm";
    MOEPLAN_RETURN_IF_ERROR(CheckType(kWho, t));
    if (m < 0 || n < 0 || k < 0) {
      return Invalid(kWho, Cat("m, n, k = ", m, ", ", n, ", ", k, " (must be >= 0)"));
    }
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX) {
      return Invalid(kWho, "m, n or k exceeds INT_MAX");
    }
    // As the CPU kernels: a matrix with no elements may be null and its row
    // stride is not checked; otherwise the stride must cover a stored row.
    const int64_t a_cols = trans_a ? m : k;
    const int64_t b_cols = trans_b ? k : n;
    if (m * k > 0) {
      if (a == nullptr) return Invalid(kWho, "a is null");
      if (lda < a_cols || lda > INT_MAX) {
        return Invalid(
            kWho, Cat("lda ", lda, " must be in [", a_cols, " (columns of stored a), INT_MAX]"));
      }
    }
    if (k * n > 0) {
      if (b == nullptr) return Invalid(kWho, "b is null");
      if (ldb < b_cols || ldb > INT_MAX) {
        return Invalid(
            kWho, Cat("ldb ", ldb, " must be in [", b_cols, " (columns of stored b), INT_MAX]"));
      }
    }
    if (m * n == 0) return absl::OkStatus();
    if (c == nullptr) return Invalid(kWho, "c is null");
    if (ldc < n || ldc > INT_MAX) {
      return Invalid(kWho, Cat("ldc ", ldc, " must be in [n = ", n, ", INT_MAX]"));
    }
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    if (k == 0) {
      // No products: c = beta * c. Done here rather than trusting every cuBLAS
      // path with k = 0.
      return ScaleMatrix(kWho, c, m, n, ldc, beta, t);
    }
    return GemmStrided(kWho, trans_a, trans_b, m, n, k, alpha, a, CudaType(t), lda, 0, b,
                       CudaType(t), ldb, 0, beta, c, CudaType(t), ldc, 0, 1);
  }

  absl::Status Route(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                     int64_t capacity, const RouteBuffers& r) override {
    constexpr std::string_view kWho = "Route";
    MOEPLAN_RETURN_IF_ERROR(CheckGating(kWho, tokens, experts, top_k));
    if (capacity < 0 || capacity > INT32_MAX) {
      return Invalid(kWho, Cat("capacity ", capacity, " not in [0, INT32_MAX]"));
    }
    if (tokens == 0) return absl::OkStatus();
    if (logits == nullptr) return Invalid(kWho, "logits is null");
    if (r.probs == nullptr) return Invalid(kWho, "route.probs is null");
    MOEPLAN_RETURN_IF_ERROR(CheckRouting(kWho, r, tokens * top_k, /*need_weight=*/true));
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    SoftmaxTopKKernel<<<BlocksFor(tokens, 128), 128, 0, stream_>>>(
        logits, tokens, static_cast<int>(experts), static_cast<int>(top_k), r.probs, r.expert,
        r.slot, r.weight);
    MOEPLAN_CUDA_CHECK_LAUNCH(kWho, " (softmax/top-k kernel, ", tokens, " tokens x ", experts,
                              " experts)");
    if (capacity > 0) {
      CapacityKernel<<<BlocksForRows(experts), kThreads, 0, stream_>>>(
          r.expert, tokens, static_cast<int>(top_k), static_cast<int>(experts), capacity, r.slot);
      MOEPLAN_CUDA_CHECK_LAUNCH(kWho, " (capacity kernel, ", experts, " experts)");
    }
    return absl::OkStatus();
  }

  absl::Status RouteBackward(const RouteBuffers& r, const float* dweight, int64_t tokens,
                             int64_t experts, int64_t top_k, float* dlogits) override {
    constexpr std::string_view kWho = "RouteBackward";
    MOEPLAN_RETURN_IF_ERROR(CheckGating(kWho, tokens, experts, top_k));
    if (tokens == 0) return absl::OkStatus();
    if (r.probs == nullptr) return Invalid(kWho, "route.probs is null");
    MOEPLAN_RETURN_IF_ERROR(CheckRouting(kWho, r, tokens * top_k, /*need_weight=*/false));
    if (dweight == nullptr) return Invalid(kWho, "dweight is null");
    if (dlogits == nullptr) return Invalid(kWho, "dlogits is null");
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    RouteBackwardKernel<<<BlocksFor(tokens * experts, kThreads), kThreads, 0, stream_>>>(
        r.probs, r.expert, r.slot, dweight, tokens, static_cast<int>(experts),
        static_cast<int>(top_k), dlogits);
    MOEPLAN_CUDA_CHECK_LAUNCH(kWho, " (", tokens, " tokens x ", experts, " experts)");
    return absl::OkStatus();
  }

  absl::Status Order(const void* x, const RouteBuffers& r, const BufferShape& s,
                     void* buf) override {
    constexpr std::string_view kWho = "Order";
    MOEPLAN_RETURN_IF_ERROR(CheckBufferShape(kWho, s));
    const size_t buf_bytes = static_cast<size_t>(s.BufferElements()) * SizeOf(s.dtype);
    if (buf_bytes > 0 && buf == nullptr) return Invalid(kWho, "buf is null");
    if (s.tokens > 0) {
      if (x == nullptr) return Invalid(kWho, "x is null");
      MOEPLAN_RETURN_IF_ERROR(CheckRouting(kWho, r, s.tokens * s.top_k, false));
    }
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    if (buf_bytes > 0) {
      MOEPLAN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buf, 0, buf_bytes, stream_), kWho, " zeroing ",
                                   buf_bytes, " bytes");
    }
    if (s.tokens == 0 || s.capacity == 0) return absl::OkStatus();
    const int64_t choices = s.tokens * s.top_k;
    const int64_t tp = s.capacity / s.parts;
    const int threads = ThreadsForRow(s.model);
    if (s.dtype == DType::kBF16) {
      OrderKernel<bf16><<<BlocksForRows(choices), threads, 0, stream_>>>(
          static_cast<const bf16*>(x), r.expert, r.slot, choices, static_cast<int>(s.top_k),
          s.experts, s.capacity, tp, s.model, static_cast<bf16*>(buf));
    } else {
      OrderKernel<float><<<BlocksForRows(choices), threads, 0, stream_>>>(
          static_cast<const float*>(x), r.expert, r.slot, choices, static_cast<int>(s.top_k),
          s.experts, s.capacity, tp, s.model, static_cast<float*>(buf));
    }
    MOEPLAN_CUDA_CHECK_LAUNCH(kWho, " (", choices, " choices, model ", s.model, ")");
    return absl::OkStatus();
  }

  absl::Status IOrder(const void* buf, const RouteBuffers& r, const BufferShape& s,
                      void* y) override {
    constexpr std::string_view kWho = "IOrder";
    MOEPLAN_RETURN_IF_ERROR(CheckBufferShape(kWho, s));
    if (s.tokens == 0) return absl::OkStatus();
    if (y == nullptr) return Invalid(kWho, "y is null");
    if (buf == nullptr && s.BufferElements() > 0) return Invalid(kWho, "buf is null");
    MOEPLAN_RETURN_IF_ERROR(CheckRouting(kWho, r, s.tokens * s.top_k, true));
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    // Tokens with every choice dropped (or capacity 0) get zeros from the
    // kernel, so y needs no separate fill.
    const int64_t tp = s.capacity > 0 ? s.capacity / s.parts : 1;
    const int threads = ThreadsForRow(s.model);
    if (s.dtype == DType::kBF16) {
      IOrderKernel<bf16><<<BlocksForRows(s.tokens), threads, 0, stream_>>>(
          static_cast<const bf16*>(buf), r.expert, r.slot, r.weight, s.tokens,
          static_cast<int>(s.top_k), s.experts, s.capacity, tp, s.model, static_cast<bf16*>(y));
    } else {
      IOrderKernel<float><<<BlocksForRows(s.tokens), threads, 0, stream_>>>(
          static_cast<const float*>(buf), r.expert, r.slot, r.weight, s.tokens,
          static_cast<int>(s.top_k), s.experts, s.capacity, tp, s.model, static_cast<float*>(y));
    }
    MOEPLAN_CUDA_CHECK_LAUNCH(kWho, " (", s.tokens, " tokens, model ", s.model, ")");
    return absl::OkStatus();
  }

  absl::Status IOrderBackward(const void* dy, const void* out_buf, const RouteBuffers& r,
                              const BufferShape& s, void* dbuf, float* dweight) override {
    constexpr std::string_view kWho = "IOrderBackward";
    MOEPLAN_RETURN_IF_ERROR(CheckBufferShape(kWho, s));
    const size_t buf_bytes = static_cast<size_t>(s.BufferElements()) * SizeOf(s.dtype);
    if (buf_bytes > 0 && (dbuf == nullptr || out_buf == nullptr)) {
      return Invalid(kWho, "dbuf or out_buf is null");
    }
    if (s.tokens > 0) {
      if (dy == nullptr) return Invalid(kWho, "dy is null");
      if (dweight == nullptr) return Invalid(kWho, "dweight is null");
      MOEPLAN_RETURN_IF_ERROR(CheckRouting(kWho, r, s.tokens * s.top_k, true));
    }
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    if (buf_bytes > 0) {
      MOEPLAN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dbuf, 0, buf_bytes, stream_), kWho, " zeroing ",
                                   buf_bytes, " bytes");
    }
    if (s.tokens == 0) return absl::OkStatus();
    const int64_t choices = s.tokens * s.top_k;
    // Capacity 0: every choice is dropped and the kernel only writes dweight = 0.
    const int64_t tp = s.capacity > 0 ? s.capacity / s.parts : 1;
    const int threads = ThreadsForRow(s.model);
    if (s.dtype == DType::kBF16) {
      IOrderBackwardKernel<bf16><<<BlocksForRows(choices), threads, 0, stream_>>>(
          static_cast<const bf16*>(dy), static_cast<const bf16*>(out_buf), r.expert, r.slot,
          r.weight, choices, static_cast<int>(s.top_k), s.experts, s.capacity, tp, s.model,
          static_cast<bf16*>(dbuf), dweight);
    } else {
      IOrderBackwardKernel<float><<<BlocksForRows(choices), threads, 0, stream_>>>(
          static_cast<const float*>(dy), static_cast<const float*>(out_buf), r.expert, r.slot,
          r.weight, choices, static_cast<int>(s.top_k), s.experts, s.capacity, tp, s.model,
          static_cast<float*>(dbuf), dweight);
    }
    MOEPLAN_CUDA_CHECK_LAUNCH(kWho, " (", choices, " choices, model ", s.model, ")");
    return absl::OkStatus();
  }

  absl::Status OrderBackward(const void* dbuf, const RouteBuffers& r, const BufferShape& s,
                             void* dx) override {
    constexpr std::string_view kWho = "OrderBackward";
    MOEPLAN_RETURN_IF_ERROR(CheckBufferShape(kWho, s));
    if (s.tokens == 0) return absl::OkStatus();
    if (dx == nullptr) return Invalid(kWho, "dx is null");
    if (dbuf == nullptr && s.BufferElements() > 0) return Invalid(kWho, "dbuf is null");
    MOEPLAN_RETURN_IF_ERROR(CheckRouting(kWho, r, s.tokens * s.top_k, false));
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    const int64_t tp = s.capacity > 0 ? s.capacity / s.parts : 1;
    const int threads = ThreadsForRow(s.model);
    if (s.dtype == DType::kBF16) {
      OrderBackwardKernel<bf16><<<BlocksForRows(s.tokens), threads, 0, stream_>>>(
          static_cast<const bf16*>(dbuf), r.expert, r.slot, s.tokens, static_cast<int>(s.top_k),
          s.experts, s.capacity, tp, s.model, static_cast<bf16*>(dx));
    } else {
      OrderBackwardKernel<float><<<BlocksForRows(s.tokens), threads, 0, stream_>>>(
          static_cast<const float*>(dbuf), r.expert, r.slot, s.tokens, static_cast<int>(s.top_k),
          s.experts, s.capacity, tp, s.model, static_cast<float*>(dx));
    }
    MOEPLAN_CUDA_CHECK_LAUNCH(kWho, " (", s.tokens, " tokens, model ", s.model, ")");
    return absl::OkStatus();
  }

  absl::Status ExpertForward(const ExpertShape& e, const void* x, const void* w1, const void* w2,
                             void* z, void* a, void* out) override {
    constexpr std::string_view kWho = "ExpertForward";
    MOEPLAN_RETURN_IF_ERROR(CheckExpertShape(kWho, e));
    if (e.groups * e.local_experts * e.rows == 0) return absl::OkStatus();  // no rows
    MOEPLAN_RETURN_IF_ERROR(CheckPointers(kWho, e,
                                          {{"x", x, kTokens},
                                           {"w1", w1, kW1},
                                           {"w2", w2, kW2},
                                           {"z", z, kPreActivation},
                                           {"a", a, kHidden},
                                           {"out", out, kTokens}}));
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    const int64_t R = e.rows, M = e.model, H = e.shard, F = e.FirstWidth();
    // z = x W1[l]: [R x M] [M x F] (F = 2Hs gated, else Hs)
    if (absl::Status st =
            ExpertGemm(kWho, e, false, R, F, M, x, M, R * M, w1, F, M * F, z, F, R * F);
        !st.ok()) {
      return st;
    }
    const int64_t rows = e.groups * e.local_experts * R;
    MOEPLAN_RETURN_IF_ERROR(
        e.gated ? internal::LaunchSwiglu(stream_, kWho, z, a, rows, H, e.dtype)
                : internal::LaunchGelu(stream_, kWho, z, a, e.HiddenElements(), e.dtype));
    // out = a W2[l]: [R x Hs] [Hs x M]
    return ExpertGemm(kWho, e, false, R, M, H, a, H, R * H, w2, M, H * M, out, M, R * M);
  }

  absl::Status ExpertBackwardData(const ExpertShape& e, const void* dout, const void* w1,
                                  const void* w2, const void* z, void* dz, void* dx) override {
    constexpr std::string_view kWho = "ExpertBackwardData";
    MOEPLAN_RETURN_IF_ERROR(CheckExpertShape(kWho, e));
    if (e.groups * e.local_experts * e.rows == 0) return absl::OkStatus();  // no rows
    MOEPLAN_RETURN_IF_ERROR(CheckPointers(kWho, e,
                                          {{"dout", dout, kTokens},
                                           {"w1", w1, kW1},
                                           {"w2", w2, kW2},
                                           {"z", z, kPreActivation},
                                           {"dz", dz, kPreActivation},
                                           {"dx", dx, kTokens}}));
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    const int64_t R = e.rows, M = e.model, H = e.shard, F = e.FirstWidth();
    // da = dout W2[l]^T: [R x M] [M x Hs] (W2[l] is [Hs x M]); da lands in dz
    // (gated: in its up half, rows F apart).
    void* da = e.gated ? Offset(dz, H, SizeOf(e.dtype)) : dz;
    if (absl::Status st =
            ExpertGemm(kWho, e, true, R, H, M, dout, M, R * M, w2, M, H * M, da, F, R * F);
        !st.ok()) {
      return st;
    }
    const int64_t rows = e.groups * e.local_experts * R;
    MOEPLAN_RETURN_IF_ERROR(
        e.gated ? internal::LaunchSwigluBackward(stream_, kWho, z, dz, rows, H, e.dtype)
                : internal::LaunchGeluBackward(stream_, kWho, z, dz, e.HiddenElements(), e.dtype));
    // dx = dz W1[l]^T: [R x F] [F x M] (W1[l] is [M x F]).
    return ExpertGemm(kWho, e, true, R, M, F, dz, F, R * F, w1, F, M * F, dx, M, R * M);
  }

  absl::Status ExpertBackwardWeights(const ExpertShape& e, const void* x, const void* a,
                                     const void* dout, const void* dz, float scale, void* dw1,
                                     void* dw2) override {
    constexpr std::string_view kWho = "ExpertBackwardWeights";
    MOEPLAN_RETURN_IF_ERROR(CheckExpertShape(kWho, e));
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    const int64_t M = e.model, H = e.shard, F = e.FirstWidth();
    if (e.W2Elements() == 0) return absl::OkStatus();  // then w1 is empty too
    MOEPLAN_RETURN_IF_ERROR(CheckPointers(kWho, e, {{"dw1", dw1, kW1}, {"dw2", dw2, kW2}}));
    if (e.groups * e.rows == 0) {
      // An empty sum: the gradients are zero (they overwrite).
      const size_t elt = SizeOf(e.dtype);
      MOEPLAN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dw1, 0, e.W1Elements() * elt, stream_), kWho,
                                   " zeroing dw1");
      MOEPLAN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dw2, 0, e.W2Elements() * elt, stream_), kWho,
                                   " zeroing dw2");
      return absl::OkStatus();
    }
    MOEPLAN_RETURN_IF_ERROR(CheckPointers(kWho, e,
                                          {{"x", x, kTokens},
                                           {"a", a, kHidden},
                                           {"dout", dout, kTokens},
                                           {"dz", dz, kPreActivation}}));
    // dw2[l] = scale * sum_g a^T dout: [Hs x R] [R x M]
    MOEPLAN_RETURN_IF_ERROR(WeightGrad(kWho, e, H, M, a, dout, scale, dw2));
    // dw1[l] = scale * sum_g x^T dz: [M x R] [R x F]
    return WeightGrad(kWho, e, M, F, x, dz, scale, dw1);
  }

  absl::Status Activation(const void* z, void* a, int64_t count, DType t) override {
    constexpr std::string_view kWho = "Activation";
    MOEPLAN_RETURN_IF_ERROR(CheckType(kWho, t));
    if (count < 0) return Invalid(kWho, Cat("count ", count, " < 0"));
    if (count == 0) return absl::OkStatus();
    if (z == nullptr || a == nullptr) return Invalid(kWho, "z or a is null");
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    return internal::LaunchGelu(stream_, kWho, z, a, count, t);
  }

  absl::Status ActivationBackward(const void* z, void* dz, int64_t count, DType t) override {
    constexpr std::string_view kWho = "ActivationBackward";
    MOEPLAN_RETURN_IF_ERROR(CheckType(kWho, t));
    if (count < 0) return Invalid(kWho, Cat("count ", count, " < 0"));
    if (count == 0) return absl::OkStatus();
    if (z == nullptr || dz == nullptr) return Invalid(kWho, "z or dz is null");
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    return internal::LaunchGeluBackward(stream_, kWho, z, dz, count, t);
  }

  absl::Status GatedActivation(const void* z, void* a, int64_t rows, int64_t width,
                               DType t) override {
    constexpr std::string_view kWho = "GatedActivation";
    MOEPLAN_RETURN_IF_ERROR(CheckRows(kWho, rows, width, t));
    if (rows * width == 0) return absl::OkStatus();
    if (z == nullptr || a == nullptr) return Invalid(kWho, "z or a is null");
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    return internal::LaunchSwiglu(stream_, kWho, z, a, rows, width, t);
  }

  absl::Status GatedActivationBackward(const void* z, void* dz, int64_t rows, int64_t width,
                                       DType t) override {
    constexpr std::string_view kWho = "GatedActivationBackward";
    MOEPLAN_RETURN_IF_ERROR(CheckRows(kWho, rows, width, t));
    if (rows * width == 0) return absl::OkStatus();
    if (z == nullptr || dz == nullptr) return Invalid(kWho, "z or dz is null");
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    return internal::LaunchSwigluBackward(stream_, kWho, z, dz, rows, width, t);
  }

  absl::Status ToF32(const void* src, DType t, float* dst, int64_t count) override {
    constexpr std::string_view kWho = "ToF32";
    MOEPLAN_RETURN_IF_ERROR(CheckType(kWho, t));
    if (count < 0) return Invalid(kWho, Cat("count ", count, " < 0"));
    if (count == 0) return absl::OkStatus();
    if (src == nullptr || dst == nullptr) return Invalid(kWho, "src or dst is null");
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    if (t == DType::kF32) {
      if (src != dst) {
        MOEPLAN_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
            kWho, " (", count, " f32 elements)");
      }
      return absl::OkStatus();
    }
    ToF32Kernel<bf16><<<BlocksFor(count, kThreads), kThreads, 0, stream_>>>(
        static_cast<const bf16*>(src), dst, count);
    MOEPLAN_CUDA_CHECK_LAUNCH(kWho, " (", count, " bf16 elements)");
    return absl::OkStatus();
  }

  absl::Status AddF32(void* y, DType t, const float* x, int64_t count) override {
    constexpr std::string_view kWho = "AddF32";
    MOEPLAN_RETURN_IF_ERROR(CheckType(kWho, t));
    if (count < 0) return Invalid(kWho, Cat("count ", count, " < 0"));
    if (count == 0) return absl::OkStatus();
    if (y == nullptr || x == nullptr) return Invalid(kWho, "y or x is null");
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    if (t == DType::kBF16) {
      AddF32Kernel<bf16>
          <<<BlocksFor(count, kThreads), kThreads, 0, stream_>>>(static_cast<bf16*>(y), x, count);
    } else {
      AddF32Kernel<float>
          <<<BlocksFor(count, kThreads), kThreads, 0, stream_>>>(static_cast<float*>(y), x, count);
    }
    MOEPLAN_CUDA_CHECK_LAUNCH(kWho, " (", count, " elements)");
    return absl::OkStatus();
  }

 private:
  // Row-major c = alpha op(a) op(b) + beta c, `batch` times with element
  // strides sa/sb/sc. cuBLAS is column-major, where a row-major matrix reads as
  // its transpose, so this computes c^T = op(b)^T op(a)^T: operands swapped,
  // m and n swapped, the transposition flags kept.
  absl::Status GemmStrided(std::string_view who, bool trans_a, bool trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const void* a, cudaDataType at, int64_t lda,
                           int64_t sa, const void* b, cudaDataType bt, int64_t ldb, int64_t sb,
                           float beta, void* c, cudaDataType ct, int64_t ldc, int64_t sc,
                           int64_t batch, cublasStatus_t* raw = nullptr) {
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
    const int ilda = static_cast<int>(lda), ildb = static_cast<int>(ldb),
              ildc = static_cast<int>(ldc);
    const cublasStatus_t st =
        batch == 1 ? cublasGemmEx(handle_, op_b, op_a, in, im, ik, &alpha, b, bt, ildb, a, at, ilda,
                                  &beta, c, ct, ildc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                   : cublasGemmStridedBatchedEx(handle_, op_b, op_a, in, im, ik, &alpha, b, bt,
                                                ildb, sb, a, at, ilda, sa, &beta, c, ct, ildc, sc,
                                                static_cast<int>(batch), CUBLAS_COMPUTE_32F,
                                                CUBLAS_GEMM_DEFAULT);
    if (raw != nullptr) *raw = st;
    if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
    return CublasErrorStatus(
        st,
        batch == 1 ? "cublasGemmEx(swapped operands, CUBLAS_COMPUTE_32F)"
                   : "cublasGemmStridedBatchedEx(swapped operands, CUBLAS_COMPUTE_32F)",
        Cat(who, " (m ", m, ", n ", n, ", k ", k, ", trans ", trans_a, "/", trans_b, ", ld ", lda,
            "/", ldb, "/", ldc, ", strides ", sa, "/", sb, "/", sc, ", batch ", batch, ", types ",
            static_cast<int>(at), "/", static_cast<int>(bt), "/", static_cast<int>(ct), ")"));
  }

  // For every (group g, local expert l): c[g,l] = act[g,l] op(w[l]), act[g,l]
  // m x k (row stride lda, block stride sa elements per (g,l)), w[l] with block
  // stride sw, c[g,l] m x n (ldc, stride sc). With one local expert the groups
  // are consecutive row blocks and fuse into one GEMM of G*m rows; otherwise
  // one call per group, batched over the local experts (no zero strides).
  absl::Status ExpertGemm(std::string_view who, const ExpertShape& e, bool trans_w, int64_t m,
                          int64_t n, int64_t k, const void* act, int64_t lda, int64_t sa,
                          const void* w, int64_t ldw, int64_t sw, void* c, int64_t ldc,
                          int64_t sc) {
    const cudaDataType t = CudaType(e.dtype);
    const size_t elt = SizeOf(e.dtype);
    const int64_t G = e.groups, El = e.local_experts;
    if (m == 0 || n == 0) return absl::OkStatus();
    if (k == 0) {
      // An empty product (model or shard 0): c is zero. Every caller's c is
      // [G][El][m] rows of ldc (sc = m * ldc): contiguous unless ldc > n (the
      // gated da, into the up half of dz).
      if (ldc != n) return ScaleMatrix(who, c, G * El * m, n, ldc, 0.0f, e.dtype);
      const size_t bytes = static_cast<size_t>(G * El * m * n) * elt;
      MOEPLAN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c, 0, bytes, stream_), who, " (k = 0)");
      return absl::OkStatus();
    }
    if (El == 1) {
      return GemmStrided(who, false, trans_w, G * m, n, k, 1.0f, act, t, lda, 0, w, t, ldw, 0, 0.0f,
                         c, t, ldc, 0, 1);
    }
    for (int64_t g = 0; g < G; ++g) {
      if (absl::Status st =
              GemmStrided(who, false, trans_w, m, n, k, 1.0f, Offset(act, g * El * sa, elt), t, lda,
                          sa, w, t, ldw, sw, 0.0f, Offset(c, g * El * sc, elt), t, ldc, sc, El);
          !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }

  // dw[l] = scale * sum_g act[g,l]^T grad[g,l] for act [R x m], grad [R x n]
  // (row-major, per-(g,l) strides R*m and R*n), dw[l] [m x n]. Sums over
  // groups accumulate in fp32: directly in dw for f32, in the scratch buffer
  // for bf16 (then rounded once).
  absl::Status WeightGrad(std::string_view who, const ExpertShape& e, int64_t m, int64_t n,
                          const void* act, const void* grad, float scale, void* dw) {
    const cudaDataType t = CudaType(e.dtype);
    const size_t elt = SizeOf(e.dtype);
    const int64_t G = e.groups, El = e.local_experts, R = e.rows;
    if (m == 0 || n == 0) return absl::OkStatus();  // callers handled G * R == 0
    if (El == 1) {
      // One local expert: the groups' rows are consecutive, so the group sum is
      // the reduction dimension of a single GEMM (k = G*R).
      return GemmStrided(who, true, false, m, n, G * R, scale, act, t, m, 0, grad, t, n, 0, 0.0f,
                         dw, t, n, 0, 1);
    }
    if (G == 1) {
      return GemmStrided(who, true, false, m, n, R, scale, act, t, m, R * m, grad, t, n, R * n,
                         0.0f, dw, t, n, m * n, El);
    }
    const int64_t weight_elements = El * m * n;
    // One batched GEMM per group over the local experts, accumulating with
    // beta = 1 after the first group.
    auto accumulate = [&](void* acc, cudaDataType acc_type, cublasStatus_t* raw) -> absl::Status {
      for (int64_t g = 0; g < G; ++g) {
        if (absl::Status st =
                GemmStrided(who, true, false, m, n, R, scale, Offset(act, g * El * R * m, elt), t,
                            m, R * m, Offset(grad, g * El * R * n, elt), t, n, R * n,
                            g == 0 ? 0.0f : 1.0f, acc, acc_type, n, m * n, El, raw);
            !st.ok()) {
          return st;
        }
      }
      return absl::OkStatus();
    };
    if (e.dtype == DType::kBF16 && !bf16_f32_output_unsupported_) {
      // bf16: sum the groups in an fp32 scratch and round once at the end, so
      // the result does not depend on G roundings.
      absl::StatusOr<void*> scratch =
          Scratch(static_cast<size_t>(weight_elements) * sizeof(float), who);
      if (!scratch.ok()) return scratch.status();
      cublasStatus_t raw = CUBLAS_STATUS_SUCCESS;
      absl::Status st = accumulate(*scratch, CUDA_R_32F, &raw);
      if (st.ok()) {
        FromF32Kernel<bf16><<<BlocksFor(weight_elements, kThreads), kThreads, 0, stream_>>>(
            static_cast<const float*>(*scratch), static_cast<bf16*>(dw), weight_elements);
        MOEPLAN_CUDA_CHECK_LAUNCH(who, " (rounding ", weight_elements, " weight gradients)");
        return absl::OkStatus();
      }
      // bf16 inputs with an fp32 output are a documented cuBLAS combination;
      // should a cuBLAS build refuse it, accumulate in bf16 instead (once
      // refused, always: the fallback is remembered).
      if (raw != CUBLAS_STATUS_NOT_SUPPORTED) return st;
      bf16_f32_output_unsupported_ = true;
    }
    return accumulate(dw, t, nullptr);
  }

  absl::Status ScaleMatrix(std::string_view who, void* c, int64_t m, int64_t n, int64_t ldc,
                           float beta, DType t) {
    if (beta == 1.0f) return absl::OkStatus();
    if (t == DType::kBF16) {
      ScaleMatrixKernel<bf16><<<BlocksFor(m * n, kThreads), kThreads, 0, stream_>>>(
          static_cast<bf16*>(c), m, n, ldc, beta);
    } else {
      ScaleMatrixKernel<float><<<BlocksFor(m * n, kThreads), kThreads, 0, stream_>>>(
          static_cast<float*>(c), m, n, ldc, beta);
    }
    MOEPLAN_CUDA_CHECK_LAUNCH(who, " (c = beta * c for k = 0, ", m, " x ", n, ")");
    return absl::OkStatus();
  }

  // The scratch buffer, grown (never shrunk) to at least `bytes`.
  absl::StatusOr<void*> Scratch(size_t bytes, std::string_view who) {
    if (bytes <= scratch_bytes_) return scratch_;
    if (scratch_ != nullptr) {
      // Queued work may still read the old buffer; only this stream uses it.
      MOEPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), who, " growing the scratch");
      MOEPLAN_CUDA_RETURN_IF_ERROR(cudaFree(scratch_), who, " growing the scratch");
      scratch_ = nullptr;
      scratch_bytes_ = 0;
    }
    void* p = nullptr;
    if (cudaError_t err = cudaMalloc(&p, bytes); err != cudaSuccess) {
      (void)cudaGetLastError();  // out-of-memory is not sticky; do not report it twice
      return absl::ResourceExhaustedError(Cat("cuda: cudaMalloc(", bytes, " bytes) in ", who,
                                              " (scratch): ", cudaGetErrorString(err)));
    }
    scratch_ = p;
    scratch_bytes_ = bytes;
    return scratch_;
  }

  const int ordinal_;
  const cudaStream_t stream_;  // the device's compute lane
  cublasHandle_t handle_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  bool bf16_f32_output_unsupported_ = false;  // see WeightGrad
};

}  // namespace

absl::StatusOr<std::unique_ptr<Kernels>> MakeCudaKernels(Device* device) {
  absl::StatusOr<int> ordinal = CudaOrdinalOf(device, "MakeCudaKernels");
  if (!ordinal.ok()) return ordinal.status();
  absl::StatusOr<cudaStream_t> stream = CudaStreamOf(device, kComputeLane, "MakeCudaKernels");
  if (!stream.ok()) return stream.status();
  auto k = std::make_unique<CudaKernels>(*ordinal, *stream);
  MOEPLAN_RETURN_IF_ERROR(k->Init());
  return std::unique_ptr<Kernels>(std::move(k));
}

}  // namespace moeplan::executor
