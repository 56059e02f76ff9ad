// The CPU device: host memory, every lane is the calling thread, stamps are
// host clock readings (MPI_Wtime, the clock MPI ranks share on a node).
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "moeplan/base/strings.h"
#include "moeplan/executor/backends.h"

namespace moeplan::executor {
namespace {

class CpuDevice final : public Device {
 public:
  std::string_view name() const override { return "cpu"; }
  bool is_gpu() const override { return false; }

  absl::StatusOr<void*> Alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    // 64-byte aligned for Eigen's vectorised loads; zeroed like cudaMalloc + memset.
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(Cat("cpu device: cannot allocate ", bytes, " bytes"));
    }
    std::memset(p, 0, rounded);
    return p;
  }
  void Free(void* p) override { std::free(p); }
  absl::StatusOr<size_t> FreeBytes() override {
    // MemAvailable: what can be allocated without swapping (Linux >= 3.14).
    std::ifstream in("/proc/meminfo");
    std::string key;
    size_t kib = 0;
    std::string unit;
    while (in >> key >> kib >> unit) {
      if (key == "MemAvailable:") return kib * 1024;
    }
    return absl::UnimplementedError("cpu device: /proc/meminfo has no MemAvailable");
  }

  absl::Status Upload(void* dst, const void* host, size_t bytes) override {
    if (bytes) std::memcpy(dst, host, bytes);
    return absl::OkStatus();
  }
  absl::Status Download(void* host, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(host, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes, LaneId) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Copy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                      size_t row_bytes, size_t rows, LaneId) override {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    for (size_t r = 0; r < rows; ++r) std::memcpy(d + r * dst_pitch, s + r * src_pitch, row_bytes);
    return absl::OkStatus();
  }
  absl::Status Zero(void* dst, size_t bytes, LaneId) override {
    if (bytes) std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }

  absl::StatusOr<LaneId> NewLane() override { return ++lanes_; }
  void* NativeStream(LaneId) override { return nullptr; }
  absl::StatusOr<Stamp> Record(LaneId) override { return Stamp{MPI_Wtime() * 1e6, -1}; }
  absl::Status Join(LaneId, LaneId) override { return absl::OkStatus(); }
  absl::Status WaitStamp(LaneId, const Stamp&) override { return absl::OkStatus(); }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::StatusOr<double> ElapsedUs(const Stamp& from, const Stamp& to) override {
    return to.host_us - from.host_us;
  }
  void RecycleStamps() override {}

 private:
  int lanes_ = 0;
};

}  // namespace

std::unique_ptr<Device> MakeCpuDevice() { return std::make_unique<CpuDevice>(); }

}  // namespace moeplan::executor
