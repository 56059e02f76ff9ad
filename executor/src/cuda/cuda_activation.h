// The experts' activations on a CUDA stream (cuda_activation.cu), for
// CudaKernels: GELU (tanh form) elementwise and SwiGLU over rows, with the
// semantics of kernels.h, in f32 or bf16 (computed in f32, stored rounded).
// The caller has checked the type and pointers and selected the device.
// Compiled by both g++ and nvcc (C++17), so nothing newer here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "moeplan/executor/device.h"

namespace moeplan::executor::internal {

// a = gelu(z) over n elements of type t.
absl::Status LaunchGelu(cudaStream_t stream, std::string_view who, const void* z, void* a,
                        int64_t n, DType t);
// dz = dz * gelu'(z) in place over n elements.
absl::Status LaunchGeluBackward(cudaStream_t stream, std::string_view who, const void* z, void* dz,
                                int64_t n, DType t);
// SwiGLU over `rows` rows: z [rows][2*width], each row [gate | up];
// a [rows][width] = silu(gate) * up.
absl::Status LaunchSwiglu(cudaStream_t stream, std::string_view who, const void* z, void* a,
                          int64_t rows, int64_t width, DType t);
// In place on dz [rows][2*width], whose up half holds da on entry:
// dz_gate = da * up * silu'(gate), dz_up = da * silu(gate).
absl::Status LaunchSwigluBackward(cudaStream_t stream, std::string_view who, const void* z,
                                  void* dz, int64_t rows, int64_t width, DType t);

}  // namespace moeplan::executor::internal
