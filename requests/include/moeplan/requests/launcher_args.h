// The arguments that carry a planned layout into a training launcher:
// Megatron-LM's (Megatron-Core's flag names) and the DeepSpeed config keys.
// Every candidate of a plan-model response carries them
// (LayoutCandidate.megatron_args, deepspeed_config): the HTML report lists
// them to copy and examples/launcher.py prints the chosen one's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moeplan/v1/model.pb.h"

namespace moeplan::requests {

// --tensor-model-parallel-size ... for `layout` of `model` (defaults filled
// in) at `global_batch` sequences per step.
std::vector<std::string> MegatronArgs(const v1::ModelConfig& model, const v1::Layout& layout,
                                      int64_t global_batch);

// {"train_batch_size": ..., "zero_optimization": {...}, "moe": {...}, ...}, one line.
std::string DeepSpeedConfig(const v1::ModelConfig& model, const v1::Layout& layout,
                            int64_t global_batch);

// Sequences per micro-batch: the layout's, else the global batch over dp x m.
int64_t MicroBatchSize(const v1::Layout& layout, int64_t global_batch);

// Sets `c`'s megatron_args and deepspeed_config from its layout.
void FillLauncherArgs(const v1::ModelConfig& model, int64_t global_batch, v1::LayoutCandidate* c);

}  // namespace moeplan::requests
