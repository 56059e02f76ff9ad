#include "moeplan/executor/probe.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "moeplan/base/status.h"

namespace moeplan::executor {

absl::StatusOr<SpeedProbe> SpeedProbe::Create(Device* dev, Kernels* kernels, DType t) {
  SpeedProbe p;
  p.dev_ = dev;
  p.kernels_ = kernels;
  p.t_ = t;
  p.dim_ = dev->is_gpu() ? kGpuDim : kCpuDim;
  const size_t count = static_cast<size_t>(p.dim_ * p.dim_);
  const size_t bytes = count * SizeOf(t);
  // Small values, so that no repetition overflows or goes denormal.
  const std::vector<float> host(count, 1.0f / 64.0f);
  MOEPLAN_ASSIGN_OR_RETURN(p.a_, DeviceBuffer::Make(dev, bytes));
  MOEPLAN_ASSIGN_OR_RETURN(p.b_, DeviceBuffer::Make(dev, bytes));
  MOEPLAN_ASSIGN_OR_RETURN(p.c_, DeviceBuffer::Make(dev, bytes));
  MOEPLAN_RETURN_IF_ERROR(UploadAs(*dev, p.a_.data(), host, t));
  MOEPLAN_RETURN_IF_ERROR(UploadAs(*dev, p.b_.data(), host, t));
  return p;
}

absl::StatusOr<double> SpeedProbe::Gflops() {
  const int64_t d = dim_;
  MOEPLAN_RETURN_IF_ERROR(dev_->Synchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) {
    MOEPLAN_RETURN_IF_ERROR(kernels_->Gemm(false, false, d, d, d, 1.0f, a_.data(), d, b_.data(), d,
                                           0.0f, c_.data(), d, t_));
  }
  MOEPLAN_RETURN_IF_ERROR(dev_->Synchronize());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops =
      2.0 * static_cast<double>(d) * static_cast<double>(d) * static_cast<double>(d) * kReps;
  return flops / std::max(s, 1e-9) * 1e-9;
}

}  // namespace moeplan::executor
