// The CUDA + NCCL backend in a build without it (no CUDA toolkit with NCCL at
// configure time, or MOEPLAN_WITH_CUDA=OFF): the same functions as
// src/cuda/*, reporting that there is no backend. CMake picks this file instead
// of those, so no code needs #ifdefs.
#include "moeplan/base/strings.h"
#include "moeplan/executor/backends.h"

namespace moeplan::executor {
namespace {
absl::Status NotBuilt(std::string_view what) {
  return absl::UnimplementedError(
      Cat(what,
          ": this build has no CUDA backend: configure with a CUDA toolkit and NCCL "
          "(MOEPLAN_WITH_CUDA=ON, nvcc at /usr/local/cuda/bin/nvcc or CMAKE_CUDA_COMPILER)"));
}
}  // namespace

bool CudaBuilt() { return false; }

int CudaDeviceCount() { return 0; }

std::string CudaVersions() {
  return "not built (no CUDA toolkit with NCCL found at configure time)";
}

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int ordinal) {
  return NotBuilt(Cat("MakeCudaDevice(", ordinal, ")"));
}

absl::StatusOr<std::unique_ptr<Kernels>> MakeCudaKernels(Device*) {
  return NotBuilt("MakeCudaKernels");
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclWorld(Device*) {
  return NotBuilt("MakeNcclWorld");
}

}  // namespace moeplan::executor
