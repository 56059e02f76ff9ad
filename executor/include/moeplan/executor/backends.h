// Factories of the two backends. CPU + MPI is always built; CUDA + NCCL is built
// whenever CMake finds a CUDA toolkit with NCCL, and otherwise the same
// functions come from stub files and return Unimplemented.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "moeplan/executor/comm.h"
#include "moeplan/executor/device.h"
#include "moeplan/executor/kernels.h"

namespace moeplan::executor {

// ---- CPU + MPI (host memory; MPI must be initialised for the communicator) ----
std::unique_ptr<Device> MakeCpuDevice();
std::unique_ptr<Kernels> MakeCpuKernels();
// How an MPI communicator's host thread waits for a collective to finish
// (docs/executor.md "Waiting"). kSpin: MPI_Waitall, Open MPI's progress loop,
// which polls (and yields between polls under mpi_yield_when_idle): the
// thread keeps its core. kSleep: MPI_Testall a few times, then between tests
// sleep with a backoff from 1 us up to kMpiSleepMaxUs, so a waiting thread
// leaves the core to its rank's compute thread and to the other ranks of the
// host. Communicators split from a world wait as it does.
enum class MpiWait { kSpin, kSleep };
inline constexpr int kMpiSleepMaxUs = 32;
std::string_view MpiWaitName(MpiWait w);  // "spin", "sleep"
// InvalidArgument naming the accepted values.
absl::StatusOr<MpiWait> ParseMpiWait(std::string_view name);
// A communicator over a duplicate of MPI_COMM_WORLD.
absl::StatusOr<std::unique_ptr<Communicator>> MakeMpiWorld(Device* device,
                                                           MpiWait wait = MpiWait::kSpin);
// "Open MPI v4.1.4, ..." (MPI_Get_library_version, first line).
std::string MpiVersion();
// Host-side reductions over MPI_COMM_WORLD (collective: every rank calls them),
// for results and checks.
double MaxOverWorld(double v);
int64_t SumOverWorld(int64_t v);
bool TrueOnAllRanks(bool v);

// ---- CUDA + NCCL ----
// Whether this build has the CUDA backend (false: the functions below return
// Unimplemented, CudaDeviceCount returns 0).
bool CudaBuilt();
// Usable GPUs; 0 when there is none or the driver reports any error.
int CudaDeviceCount();
// A device on GPU `ordinal` (sets it current for the calling thread).
absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int ordinal);
// cuBLAS + kernels on a device from MakeCudaDevice.
absl::StatusOr<std::unique_ptr<Kernels>> MakeCudaKernels(Device* device);
// NCCL over MPI_COMM_WORLD's ranks on a device from MakeCudaDevice: the unique id
// is broadcast with MPI; Split() bootstraps sub-communicators the same way.
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclWorld(Device* device);
// "cuda runtime 13.0, cublas 13.x, nccl 2.28.x" or why there is none.
std::string CudaVersions();

// The CPUs this process may run on: its affinity (a testbed node's share of
// the machine, a job's cpuset), at most the online ones.
int UsableCores();

// This host as a profile's provenance names it: the CPU model and its online
// cores ("AMD EPYC 7B13 x 2 cores"; "x 1 of 2 cores" when the process may use
// fewer), and the device when it is a GPU.
std::string MachineDescription(const Device& device);

// A device, kernels and world communicator of one backend.
struct Backend {
  std::unique_ptr<Device> device;
  std::unique_ptr<Kernels> kernels;
  std::unique_ptr<Communicator> world;
};
// backend "mpi": CPU device and kernels, MPI communicator; "nccl": GPU
// (local rank modulo the GPUs of the host), CUDA kernels, NCCL communicator.
// `wait`: how the mpi backend's communicators wait (the nccl backend's host
// exchanges always spin).
absl::StatusOr<Backend> MakeBackend(std::string_view backend, MpiWait wait = MpiWait::kSpin);

}  // namespace moeplan::executor
