// MakeBackend: a device, kernels and world communicator of one backend.
#include "moeplan/executor/backends.h"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <string_view>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::executor {

std::string_view MpiWaitName(MpiWait w) { return w == MpiWait::kSleep ? "sleep" : "spin"; }

absl::StatusOr<MpiWait> ParseMpiWait(std::string_view name) {
  if (name == "spin") return MpiWait::kSpin;
  if (name == "sleep") return MpiWait::kSleep;
  return absl::InvalidArgumentError(Cat("mpi wait: must be spin or sleep (got '", name, "')"));
}

absl::StatusOr<Backend> MakeBackend(std::string_view backend, MpiWait wait) {
  Backend b;
  if (backend == "mpi") {
    b.device = MakeCpuDevice();
    b.kernels = MakeCpuKernels();
    MOEPLAN_ASSIGN_OR_RETURN(b.world, MakeMpiWorld(b.device.get(), wait));
    return b;
  }
  if (backend == "nccl") {
    if (!CudaBuilt()) {
      return absl::UnimplementedError(
          "backend: nccl needs the CUDA backend, and this build has none (configure with a CUDA "
          "toolkit and NCCL)");
    }
    const int gpus = CudaDeviceCount();
    if (gpus == 0)
      return absl::FailedPreconditionError("backend: nccl needs a GPU; none is usable");
    // One GPU per rank: the rank's index among the ranks of its host.
    MPI_Comm local = MPI_COMM_NULL;
    int local_rank = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) !=
        MPI_SUCCESS) {
      return absl::InternalError("mpi: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
    }
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_free(&local);
    MOEPLAN_ASSIGN_OR_RETURN(b.device, MakeCudaDevice(local_rank % gpus));
    MOEPLAN_ASSIGN_OR_RETURN(b.kernels, MakeCudaKernels(b.device.get()));
    MOEPLAN_ASSIGN_OR_RETURN(b.world, MakeNcclWorld(b.device.get()));
    return b;
  }
  return absl::InvalidArgumentError(Cat("backend: must be mpi or nccl (got ", backend, ")"));
}

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

std::string MachineDescription(const Device& device) {
  std::string model;
  if (std::FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (model.empty() && std::fgets(line, sizeof line, f) != nullptr) {
      const std::string_view l(line);
      if (l.rfind("model name", 0) != 0) continue;
      const size_t colon = l.find(':');
      if (colon == std::string_view::npos) continue;
      std::string_view v = l.substr(colon + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
      model = std::string(v);
    }
    std::fclose(f);
  }
  if (model.empty()) model = "unknown CPU";
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int usable = UsableCores();
  std::string out = usable < online ? Cat(model, " x ", usable, " of ", online, " cores")
                                    : Cat(model, " x ", online, " cores");
  if (device.is_gpu()) out += Cat("; ", device.name());
  return out;
}

}  // namespace moeplan::executor
