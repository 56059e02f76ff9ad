// The arguments that carry a planned layout into a training launcher:
// Megatron-LM's (Megatron-Core's flag names) and the DeepSpeed config keys.
// The HTML report (html_report.h) lists them for each candidate to copy;
// examples/launcher.py builds the same from a served plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moeplan/v1/model.pb.h"

namespace moeplan::client {

// --tensor-model-parallel-size ... for `layout` of `model` (defaults filled
// in) at `global_batch` sequences per step.
std::vector<std::string> MegatronArgs(const v1::ModelConfig& model, const v1::Layout& layout,
                                      int64_t global_batch);

// {"train_batch_size": ..., "zero_optimization": {...}, "moe": {...}, ...}, one line.
std::string DeepSpeedConfig(const v1::ModelConfig& model, const v1::Layout& layout,
                            int64_t global_batch);

// Sequences per micro-batch: the layout's, else the global batch over dp x m.
int64_t MicroBatchSize(const v1::Layout& layout, int64_t global_batch);

}  // namespace moeplan::client
