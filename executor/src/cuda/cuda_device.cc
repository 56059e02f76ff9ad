// The CUDA device: cudaMalloc'd memory, lanes are non-blocking CUDA streams
// (lane 0 = compute), stamps are events from a pool that is reused every
// iteration so the hot path never creates or destroys events.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/executor/backends.h"

namespace moeplan::executor {

absl::Status CudaErrorStatus(cudaError_t e, const char* call, const std::string& where) {
  std::string msg = Cat("cuda: ", call, " in ", where, ": ", cudaGetErrorString(e));
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

namespace {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal), name_(Cat("cuda:", ordinal)) {}

  // Creates the compute stream and the join event; a separate step so that a
  // failure is a Status rather than a half-built object.
  absl::Status Init() {
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), "MakeCudaDevice(", ordinal_, ")");
    cudaStream_t s = nullptr;
    // Non-blocking: the compute lane must not serialise with the legacy default
    // stream (libraries and cudaMemcpy use it).
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                                 "MakeCudaDevice(", ordinal_, ") creating the compute stream");
    streams_.push_back(s);
    // Join only orders work; no timing needed, which makes it cheaper.
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&join_event_, cudaEventDisableTiming),
                                 "MakeCudaDevice(", ordinal_, ") creating the join event");
    return absl::OkStatus();
  }

  ~CudaDevice() override {
    // Errors are ignored: nothing can be done about them in a destructor, and a
    // broken context already reported itself on the call that broke it.
    if (cudaSetDevice(ordinal_) != cudaSuccess) return;
    (void)cudaDeviceSynchronize();
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    if (join_event_ != nullptr) (void)cudaEventDestroy(join_event_);
    for (cudaStream_t s : streams_) (void)cudaStreamDestroy(s);
    (void)cudaGetLastError();
  }

  std::string_view name() const override { return name_; }
  bool is_gpu() const override { return true; }
  int ordinal() const { return ordinal_; }

  absl::StatusOr<size_t> FreeBytes() override {
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), "Device::FreeBytes on ", name_);
    size_t free = 0, total = 0;
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total), "cudaMemGetInfo on ", name_);
    return free;
  }
  absl::StatusOr<void*> Alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), "Device::Alloc(", bytes, ") on ", name_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      // Out-of-memory is not sticky: clear it so that the next launch check
      // (cudaGetLastError) does not report it again.
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(Cat("cuda: cudaMalloc(", bytes,
                                              " bytes) in Device::Alloc on ", name_, ": ",
                                              cudaGetErrorString(e)));
    }
    // Zeroed on the compute stream and waited for: cudaMemset would run on the
    // legacy default stream, which the non-blocking lanes do not wait for.
    cudaError_t z = cudaMemsetAsync(p, 0, bytes, streams_[kComputeLane]);
    if (z == cudaSuccess) z = cudaStreamSynchronize(streams_[kComputeLane]);
    if (z != cudaSuccess) {
      (void)cudaFree(p);
      return CudaErrorStatus(z, "cudaMemsetAsync(p, 0, bytes, compute)",
                             Cat("Device::Alloc(", bytes, ") on ", name_));
    }
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    if (cudaSetDevice(ordinal_) != cudaSuccess) return;
    // cudaFree waits for work using the memory to finish; an error here means
    // the context is already broken, which the next checked call reports.
    (void)cudaFree(p);
  }

  // Host copies go through the compute stream and wait for it: a plain
  // cudaMemcpy from pageable memory may return before the DMA has landed and
  // is not ordered with the non-blocking lanes.
  absl::Status Upload(void* dst, const void* host, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), "Device::Upload on ", name_);
    cudaStream_t s = streams_[kComputeLane];
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, s),
                                 "Device::Upload(", bytes, " bytes) on ", name_);
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "Device::Upload(", bytes, " bytes) on ",
                                 name_);
    return absl::OkStatus();
  }
  absl::Status Download(void* host, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), "Device::Download on ", name_);
    cudaStream_t s = streams_[kComputeLane];
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, s),
                                 "Device::Download(", bytes, " bytes) on ", name_);
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "Device::Download(", bytes,
                                 " bytes) on ", name_);
    return absl::OkStatus();
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes, LaneId lane) override {
    if (bytes == 0) return absl::OkStatus();
    absl::StatusOr<cudaStream_t> s = Stream(lane, "Device::Copy");
    if (!s.ok()) return s.status();
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, *s),
                                 "Device::Copy(", bytes, " bytes, lane ", lane, ") on ", name_);
    return absl::OkStatus();
  }

  absl::Status Copy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                      size_t row_bytes, size_t rows, LaneId lane) override {
    if (rows == 0 || row_bytes == 0) return absl::OkStatus();
    absl::StatusOr<cudaStream_t> s = Stream(lane, "Device::Copy2D");
    if (!s.ok()) return s.status();
    if (rows == 1) {
      // One row: the pitches do not matter (cudaMemcpy2D would still reject a
      // pitch smaller than the row).
      MOEPLAN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst, src, row_bytes, cudaMemcpyDeviceToDevice, *s),
          "Device::Copy2D(1 row of ", row_bytes, " bytes, lane ", lane, ") on ", name_);
      return absl::OkStatus();
    }
    if (dst_pitch < row_bytes || src_pitch < row_bytes) {
      return absl::InvalidArgumentError(Cat("Device::Copy2D on ", name_, ": row_bytes ", row_bytes,
                                            " exceeds dst_pitch ", dst_pitch, " or src_pitch ",
                                            src_pitch));
    }
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                                   cudaMemcpyDeviceToDevice, *s),
                                 "Device::Copy2D(", rows, " rows of ", row_bytes,
                                 " bytes, pitches ", dst_pitch, "/", src_pitch, ", lane ", lane,
                                 ") on ", name_);
    return absl::OkStatus();
  }

  absl::Status Zero(void* dst, size_t bytes, LaneId lane) override {
    if (bytes == 0) return absl::OkStatus();
    absl::StatusOr<cudaStream_t> s = Stream(lane, "Device::Zero");
    if (!s.ok()) return s.status();
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, bytes, *s), "Device::Zero(", bytes,
                                 " bytes, lane ", lane, ") on ", name_);
    return absl::OkStatus();
  }

  absl::StatusOr<LaneId> NewLane() override {
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), "Device::NewLane on ", name_);
    cudaStream_t s = nullptr;
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                                 "Device::NewLane on ", name_);
    streams_.push_back(s);
    return static_cast<LaneId>(streams_.size() - 1);
  }

  void* NativeStream(LaneId lane) override {
    if (lane < 0 || static_cast<size_t>(lane) >= streams_.size()) return nullptr;
    return streams_[lane];
  }

  absl::StatusOr<Stamp> Record(LaneId lane) override {
    absl::StatusOr<cudaStream_t> s = Stream(lane, "Device::Record");
    if (!s.ok()) return s.status();
    if (cursor_ == events_.size()) {
      // The pool only grows (until the first RecycleStamps of a steady state);
      // events are destroyed with the device, never in the hot path.
      cudaEvent_t e = nullptr;
      MOEPLAN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e), "Device::Record growing the event pool to ",
                                   events_.size() + 1, " on ", name_);
      events_.push_back(e);
    }
    const size_t idx = cursor_;
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[idx], *s), "Device::Record(lane ", lane,
                                 ", event ", idx, ") on ", name_);
    ++cursor_;
    Stamp st;
    st.event = static_cast<int>(idx);
    return st;
  }

  absl::Status Join(LaneId waiter, LaneId signaller) override {
    absl::StatusOr<cudaStream_t> w = Stream(waiter, "Device::Join (waiter)");
    if (!w.ok()) return w.status();
    absl::StatusOr<cudaStream_t> sig = Stream(signaller, "Device::Join (signaller)");
    if (!sig.ok()) return sig.status();
    if (waiter == signaller) return absl::OkStatus();
    // One event serves every Join: cudaStreamWaitEvent captures the event's
    // most recent record when it is called, so re-recording it later is safe.
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_event_, *sig), "Device::Join(", waiter, ", ",
                                 signaller, ") on ", name_);
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(*w, join_event_, 0), "Device::Join(", waiter,
                                 ", ", signaller, ") on ", name_);
    return absl::OkStatus();
  }

  absl::Status WaitStamp(LaneId waiter, const Stamp& stamp) override {
    absl::StatusOr<cudaStream_t> w = Stream(waiter, "Device::WaitStamp");
    if (!w.ok()) return w.status();
    absl::StatusOr<cudaEvent_t> e = Event(stamp, "Device::WaitStamp");
    if (!e.ok()) return e.status();
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(*w, *e, 0), "Device::WaitStamp(lane ", waiter,
                                 ", event ", stamp.event, ") on ", name_);
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), "Device::Synchronize on ", name_);
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "Device::Synchronize on ", name_);
    return absl::OkStatus();
  }

  absl::StatusOr<double> ElapsedUs(const Stamp& from, const Stamp& to) override {
    absl::StatusOr<cudaEvent_t> a = Event(from, "Device::ElapsedUs (from)");
    if (!a.ok()) return a.status();
    absl::StatusOr<cudaEvent_t> b = Event(to, "Device::ElapsedUs (to)");
    if (!b.ok()) return b.status();
    float ms = 0.0f;
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, *a, *b), "Device::ElapsedUs(event ",
                                 from.event, ", event ", to.event, ") on ", name_);
    return static_cast<double>(ms) * 1000.0;
  }

  void RecycleStamps() override { cursor_ = 0; }

  // For the other CUDA files: the stream of a lane, after making this device
  // current.
  absl::StatusOr<cudaStream_t> Stream(LaneId lane, std::string_view who) {
    if (lane < 0 || static_cast<size_t>(lane) >= streams_.size()) {
      return absl::InvalidArgumentError(Cat(who, " on ", name_, ": lane ", lane,
                                            " does not exist (", streams_.size(), " lanes)"));
    }
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), who, " on ", name_);
    return streams_[lane];
  }

 private:
  absl::StatusOr<cudaEvent_t> Event(const Stamp& st, std::string_view who) {
    // Stamps recorded before the last RecycleStamps still index the pool but
    // may name a re-recorded event; that is the caller's contract.
    if (st.event < 0 || static_cast<size_t>(st.event) >= events_.size()) {
      return absl::InvalidArgumentError(Cat(who, " on ", name_, ": stamp event ", st.event,
                                            " is not from this device (pool of ", events_.size(),
                                            ")"));
    }
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), who, " on ", name_);
    return events_[st.event];
  }

  const int ordinal_;
  const std::string name_;
  std::vector<cudaStream_t> streams_;  // index = LaneId
  std::vector<cudaEvent_t> events_;    // the stamp pool
  size_t cursor_ = 0;                  // next pool entry to record
  cudaEvent_t join_event_ = nullptr;
};

CudaDevice* AsCuda(Device* device) { return dynamic_cast<CudaDevice*>(device); }

absl::Status NotCuda(Device* device, std::string_view who) {
  return absl::InvalidArgumentError(
      Cat(who, ": device ", device == nullptr ? std::string_view("(null)") : device->name(),
          " is not a CUDA device from MakeCudaDevice"));
}

}  // namespace

absl::StatusOr<int> CudaOrdinalOf(Device* device, std::string_view who) {
  CudaDevice* d = AsCuda(device);
  if (d == nullptr) return NotCuda(device, who);
  return d->ordinal();
}

absl::StatusOr<cudaStream_t> CudaStreamOf(Device* device, LaneId lane, std::string_view who) {
  CudaDevice* d = AsCuda(device);
  if (d == nullptr) return NotCuda(device, who);
  return d->Stream(lane, who);
}

bool CudaBuilt() { return true; }

int CudaDeviceCount() {
  int n = 0;
  // Without a GPU or driver this reports various errors (35, 100, ...): any
  // error means no usable GPU. Clear it so that later checks do not see it.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n < 0 ? 0 : n;
}

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int ordinal) {
  const int n = CudaDeviceCount();
  if (n == 0) {
    return absl::FailedPreconditionError(Cat("MakeCudaDevice(", ordinal,
                                             "): no usable GPU (cudaGetDeviceCount reports none; ",
                                             CudaVersions(), ")"));
  }
  if (ordinal < 0 || ordinal >= n) {
    return absl::InvalidArgumentError(
        Cat("MakeCudaDevice: ordinal ", ordinal, " out of range (", n, " GPUs)"));
  }
  auto dev = std::make_unique<CudaDevice>(ordinal);
  MOEPLAN_RETURN_IF_ERROR(dev->Init());
  return std::unique_ptr<Device>(std::move(dev));
}

std::string CudaVersions() {
  std::string out;
  int rt = 0;
  if (cudaError_t e = cudaRuntimeGetVersion(&rt); e == cudaSuccess) {
    out += Cat("cuda runtime ", rt / 1000, ".", (rt % 1000) / 10);
  } else {
    out += Cat("cuda runtime unknown (", cudaGetErrorString(e), ")");
  }
  int drv = 0;
  if (cudaError_t e = cudaDriverGetVersion(&drv); e != cudaSuccess) {
    out += Cat(", driver unknown (", cudaGetErrorString(e), ")");
  } else if (drv == 0) {
    out += ", no driver";  // cudaDriverGetVersion reports 0 when none is installed
  } else {
    out += Cat(", driver ", drv / 1000, ".", (drv % 1000) / 10);
  }
  (void)cudaGetLastError();
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
    out += Cat(", cublas ", major, ".", minor, ".", patch);
  } else {
    out += ", cublas unknown";
  }
  int nccl = 0;
  if (ncclResult_t r = ncclGetVersion(&nccl); r == ncclSuccess) {
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    out += Cat(", nccl ", nccl / 10000, ".", (nccl / 100) % 100, ".", nccl % 100);
  } else {
    out += Cat(", nccl unknown (", ncclGetErrorString(r), ")");
  }
  return out;
}

}  // namespace moeplan::executor
