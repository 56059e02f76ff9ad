// The experts' activations on a stream (cuda_activation.h): GELU (tanh form)
// elementwise, and SwiGLU over rows of [gate | up], one thread per output
// element, computed in f32 with the CPU kernels' formulas.
//
// Compiled by nvcc as C++17.
#include <algorithm>

#include "cuda_activation.h"
#include "cuda_elementwise.cuh"
#include "cuda_internal.h"
#include "moeplan/base/strings.h"

namespace moeplan::executor::internal {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

__device__ __forceinline__ float Gelu(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
// d/dx of the tanh form (exact, not the erf GELU's derivative).
__device__ __forceinline__ float GeluGrad(float x) {
  const float x2 = x * x;
  const float t = tanhf(kSqrt2OverPi * (x + kGeluCoeff * x2 * x));
  return 0.5f * (1.0f + t) +
         0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x2);
}

template <class T>
__global__ void GeluKernel(const T* z, T* a, int64_t n) {
  MOEPLAN_GRID_STRIDE(i, n) { a[i] = Store<T>(Gelu(Load(z[i]))); }
}

// dz = da * gelu'(z), in place over da.
template <class T>
__global__ void GeluBackwardKernel(const T* z, T* dz, int64_t n) {
  MOEPLAN_GRID_STRIDE(i, n) { dz[i] = Store<T>(Load(dz[i]) * GeluGrad(Load(z[i]))); }
}

// a[r][j] = silu(g) * u, g = z[r][j], u = z[r][width + j]; one thread per
// element of a.
template <class T>
__global__ void SwigluKernel(const T* z, T* a, int64_t rows, int64_t width) {
  MOEPLAN_GRID_STRIDE(i, rows * width) {
    const int64_t r = i / width;
    const int64_t off = i + r * width;  // r * 2 * width + j
    const float g = Load(z[off]), u = Load(z[off + width]);
    a[i] = Store<T>(g * u / (1.0f + expf(-g)));
  }
}

// In place on dz [rows][2*width] whose up half holds da: dz_gate = da * u *
// silu'(g), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g); dz_up = da * silu(g).
template <class T>
__global__ void SwigluBackwardKernel(const T* z, T* dz, int64_t rows, int64_t width) {
  MOEPLAN_GRID_STRIDE(i, rows * width) {
    const int64_t r = i / width;
    const int64_t off = i + r * width;
    const float g = Load(z[off]), u = Load(z[off + width]), da = Load(dz[off + width]);
    const float s = 1.0f / (1.0f + expf(-g));
    dz[off] = Store<T>(da * u * s * (1.0f + g * (1.0f - s)));
    dz[off + width] = Store<T>(da * (g * s));
  }
}

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // the kernels grid-stride beyond this

unsigned BlocksFor(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// The kernel of type t over `n` threads' work, its launch error named.
template <class... Args>
absl::Status Launch(cudaStream_t stream, std::string_view who, std::string_view what,
                    void (*bf16_kernel)(const bf16*, bf16*, Args...),
                    void (*f32_kernel)(const float*, float*, Args...), const void* in, void* out,
                    int64_t n, DType t, Args... args) {
  if (n == 0) return absl::OkStatus();
  if (t == DType::kBF16) {
    bf16_kernel<<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const bf16*>(in),
                                                       static_cast<bf16*>(out), args...);
  } else {
    f32_kernel<<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const float*>(in),
                                                      static_cast<float*>(out), args...);
  }
  MOEPLAN_CUDA_RETURN_IF_ERROR(cudaGetLastError(), who, " (", what, " over ", n, " elements)");
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchGelu(cudaStream_t stream, std::string_view who, const void* z, void* a,
                        int64_t n, DType t) {
  return Launch<int64_t>(stream, who, "gelu", GeluKernel<bf16>, GeluKernel<float>, z, a, n, t, n);
}

absl::Status LaunchGeluBackward(cudaStream_t stream, std::string_view who, const void* z, void* dz,
                                int64_t n, DType t) {
  return Launch<int64_t>(stream, who, "gelu backward", GeluBackwardKernel<bf16>,
                         GeluBackwardKernel<float>, z, dz, n, t, n);
}

absl::Status LaunchSwiglu(cudaStream_t stream, std::string_view who, const void* z, void* a,
                          int64_t rows, int64_t width, DType t) {
  return Launch<int64_t, int64_t>(stream, who, "swiglu", SwigluKernel<bf16>, SwigluKernel<float>, z,
                                  a, rows * width, t, rows, width);
}

absl::Status LaunchSwigluBackward(cudaStream_t stream, std::string_view who, const void* z,
                                  void* dz, int64_t rows, int64_t width, DType t) {
  return Launch<int64_t, int64_t>(stream, who, "swiglu backward", SwigluBackwardKernel<bf16>,
                                  SwigluBackwardKernel<float>, z, dz, rows * width, t, rows, width);
}

}  // namespace moeplan::executor::internal
