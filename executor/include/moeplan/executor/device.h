// Devices of the executor (docs/executor.md): memory, lanes (CUDA streams; the host on
// CPU) and timeline stamps. The MoE runner, the collectives and the kernels all
// work on memory and lanes of one Device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace moeplan::executor {

// Element types of activations, weights and gradients. Gating (logits,
// probabilities, gate weights and their gradients) is always fp32.
enum class DType : uint8_t { kF32, kBF16 };
size_t SizeOf(DType t);
std::string_view DTypeName(DType t);  // "f32", "bf16"
bool ParseDType(std::string_view name, DType* out);

// A lane runs work in issue order: a CUDA stream on a GPU. On the CPU every lane
// is the calling thread (work is done when the call returns).
using LaneId = int;
inline constexpr LaneId kComputeLane = 0;

// A point on a lane's timeline: host microseconds on the CPU, a recorded CUDA
// event on a GPU. Read back with Device::ElapsedUs after Synchronize().
struct Stamp {
  double host_us = 0.0;
  int event = -1;  // index into the device's event pool; -1 on the CPU
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string_view name() const = 0;  // "cpu", "cuda:0"
  virtual bool is_gpu() const = 0;

  // Zeroed device memory; Free(nullptr) is a no-op.
  virtual absl::StatusOr<void*> Alloc(size_t bytes) = 0;
  // Memory an allocation may take now (the host's available memory on the
  // CPU, the GPU's free memory on CUDA); Unimplemented where unknown.
  virtual absl::StatusOr<size_t> FreeBytes() {
    return absl::UnimplementedError("this device does not report its free memory");
  }
  virtual void Free(void* p) = 0;
  // Host <-> device copies; synchronous (they wait for the compute lane).
  virtual absl::Status Upload(void* dst, const void* host, size_t bytes) = 0;
  virtual absl::Status Download(void* host, const void* src, size_t bytes) = 0;
  // Device-to-device copy and zero fill, issued on `lane`.
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes, LaneId lane) = 0;
  // Copies `rows` rows of `row_bytes` from src (row pitch src_pitch bytes) to
  // dst (row pitch dst_pitch bytes), issued on `lane`.
  virtual absl::Status Copy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                              size_t row_bytes, size_t rows, LaneId lane) = 0;
  virtual absl::Status Zero(void* dst, size_t bytes, LaneId lane) = 0;

  // A new lane (a new CUDA stream; on the CPU a distinct id for the same thread).
  virtual absl::StatusOr<LaneId> NewLane() = 0;
  // The native stream of a lane (cudaStream_t) for libraries; nullptr on the CPU.
  virtual void* NativeStream(LaneId lane) = 0;
  // A stamp at the current end of `lane`'s work.
  virtual absl::StatusOr<Stamp> Record(LaneId lane) = 0;
  // Work issued on `waiter` after this call starts after all work issued on
  // `signaller` before it. No-op on the CPU.
  virtual absl::Status Join(LaneId waiter, LaneId signaller) = 0;
  // Same, for the work up to `stamp` (an event recorded on another lane).
  virtual absl::Status WaitStamp(LaneId waiter, const Stamp& stamp) = 0;
  // Blocks the host until every lane is idle.
  virtual absl::Status Synchronize() = 0;
  // Microseconds from `from` to `to` (both completed: call after Synchronize).
  virtual absl::StatusOr<double> ElapsedUs(const Stamp& from, const Stamp& to) = 0;
  // Makes every stamp recorded so far reusable (call once per iteration, after
  // reading them).
  virtual void RecycleStamps() = 0;
};

// Device memory owned by a Device, freed on destruction (move-only).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Make(Device* dev, size_t bytes);
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* data() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }
  void Reset();

 private:
  Device* dev_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Host floats to `count` device elements of type `t` at `dst`, and back: bf16
// is converted on the host (moeplan/base/bf16.h: round to nearest even).
// (absl::Span: CUDA sources that include this compile as C++17.) `scratch` keeps the bf16 staging
// copy's memory between calls; null: a temporary one.
absl::Status UploadAs(Device& dev, void* dst, absl::Span<const float> host, DType t,
                      std::vector<uint16_t>* scratch = nullptr);
absl::Status DownloadAs(Device& dev, absl::Span<float> host, const void* src, DType t,
                        std::vector<uint16_t>* scratch = nullptr);

}  // namespace moeplan::executor
