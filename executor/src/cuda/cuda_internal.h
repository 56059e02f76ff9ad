// Private to the CUDA backend (cuda_device.cc, cuda_kernels.cu, nccl_comm.cc):
// status conversion of CUDA runtime errors and access to the streams of a
// CudaDevice. Compiled by both g++ and nvcc (C++17), so nothing newer here.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/base/strings.h"
#include "moeplan/executor/device.h"

namespace moeplan::executor {

// "cuda: <call> in <where>: <cudaGetErrorString>" as InternalError;
// ResourceExhausted for out-of-memory. Only call it for e != cudaSuccess.
absl::Status CudaErrorStatus(cudaError_t e, const char* call, const std::string& where);

// Checks a cudaError_t-returning expression and returns its status from the
// enclosing function on failure. The context arguments (anything moeplan::Cat
// takes) are formatted only on failure, so the check costs nothing in the hot
// path.
#define MOEPLAN_CUDA_RETURN_IF_ERROR(expr, ...)                                 \
  do {                                                                          \
    const cudaError_t moeplan_cuda_err_ = (expr);                               \
    if (moeplan_cuda_err_ != cudaSuccess) {                                     \
      return ::moeplan::executor::CudaErrorStatus(moeplan_cuda_err_, #expr,     \
                                                  ::moeplan::Cat(__VA_ARGS__)); \
    }                                                                           \
  } while (false)

// The CUDA ordinal of a device made by MakeCudaDevice; InvalidArgument (naming
// `who`) for any other Device.
absl::StatusOr<int> CudaOrdinalOf(Device* device, std::string_view who);
// The cudaStream_t of `lane` of a device made by MakeCudaDevice; InvalidArgument
// for another Device or an unknown lane.
absl::StatusOr<cudaStream_t> CudaStreamOf(Device* device, LaneId lane, std::string_view who);

}  // namespace moeplan::executor
