// Device helpers shared by the CUDA backend's .cu files (cuda_kernels.cu,
// cuda_activation.cu): element loads and stores of f32 and bf16 (computing in
// f32), and the grid-stride loop. nvcc only (C++17).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moeplan::executor::internal {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float Load(float x) { return x; }
__device__ __forceinline__ float Load(bf16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T Store(float x);
template <>
__device__ __forceinline__ float Store<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 Store<bf16>(float x) {
  return __float2bfloat16_rn(x);  // round to nearest even, like the CPU's conversion
}

}  // namespace moeplan::executor::internal

#define MOEPLAN_GRID_STRIDE(i, n)                                                        \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
