// The speed probe: one fixed GEMM timed on a rank, a measure of how fast the
// machine computes at that moment. moeplan-profile times it after every GEMM
// sample and moeplan-exec after every timed iteration, so that validate can
// tell the machine's drift (clocks, a neighbour's job, a VM's host) from the
// model's error (docs/calibration.md "Machine drift").
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "moeplan/executor/device.h"
#include "moeplan/executor/kernels.h"

namespace moeplan::executor {

class SpeedProbe {
 public:
  // The GEMM's side and repetitions: 256 (f32, 4 GEMMs, ~7 ms at 20
  // GFLOP/s) on a CPU, 4096 on a GPU (4 GEMMs, ~1 ms at 500 TFLOP/s):
  // long enough to read the compute rate, short next to an iteration.
  static constexpr int64_t kCpuDim = 256;
  static constexpr int64_t kGpuDim = 4096;
  static constexpr int kReps = 4;

  // Buffers of the probe on `dev` in the kernels' dtype `t`.
  static absl::StatusOr<SpeedProbe> Create(Device* dev, Kernels* kernels, DType t);

  // Runs the GEMMs, waits for them and returns the rate in GFLOP/s.
  absl::StatusOr<double> Gflops();

  int64_t dim() const { return dim_; }

 private:
  Device* dev_ = nullptr;
  Kernels* kernels_ = nullptr;
  DType t_ = DType::kF32;
  int64_t dim_ = 0;
  DeviceBuffer a_, b_, c_;
};

}  // namespace moeplan::executor
