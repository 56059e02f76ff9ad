// The per-rank memory model of a layout (docs/layouts.md "Memory"):
// parameters, gradients and optimizer states under ZeRO, activations of the
// micro-batches a pipeline stage holds, expert capacity buffers.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "moeplan/planner/layout.h"
#include "moeplan/planner/model.h"

namespace moeplan::planner {

struct MemoryOptions {
  double param_bytes = 0.0;  // per parameter; 0: the model's (bytes_per_element, + 2 with FP8)
  double grad_bytes = 4.0;
  double optimizer_bytes = 12.0;
  double gpu_memory_bytes = -1.0;  // < 0: the profile's; 0: not checked
};
// InvalidArgument naming "memory.<field>".
absl::Status ValidateMemoryOptions(const MemoryOptions& options);

struct MemoryBreakdown {
  double params = 0.0, grads = 0.0, optimizer = 0.0;
  double activations = 0.0;  // activation_per_microbatch * in_flight (+ one block when recomputing)
  double activation_per_microbatch = 0.0;
  double in_flight = 0.0;  // micro-batches whose activations are held at once
  double capacity_buffers = 0.0;
  double total = 0.0;
  double limit = 0.0;  // 0: not checked
  int stage = 0;
  bool fits() const { return limit <= 0.0 || total <= limit; }
  // "needs 41.2 GiB of 32 GiB (9.2 GiB over); largest term: optimizer states 24.1 GiB".
  std::string OverReason() const;
};

// Rows a rank's experts hold for `tokens` tokens of a micro-batch, over its
// local experts (0 for a dense model): `m` is the stage's model
// (ModelForLayout).
double ExpertRows(const ModelConfig& m, const Layout& l, double tokens);

// Stage `stage`'s memory with `in_flight` micro-batches of activations held
// (the pipeline schedule's peak at that stage).
MemoryBreakdown StageMemory(const ModelConfig& model, const Layout& layout,
                            int64_t micro_batch_size, int stage, double in_flight,
                            const MemoryOptions& options);

}  // namespace moeplan::planner
