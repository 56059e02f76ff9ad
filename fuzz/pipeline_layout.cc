// A Megatron-Core pipeline layout string (--pipeline-model-parallel-layout)
// parsed (ParsePipelineLayout) and, when it parses, checked against the
// model it names (as many decoder and MTP layers as it holds) on one
// pipeline rank per stage and on one rank with them all as virtual stages.
// The stages must tile the layers in order and read back the same once
// written out (FormatPipelineLayout).
#include "moeplan/planner/pipeline_layout.h"

#include <cstdlib>

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeplan;
  auto stages = planner::ParsePipelineLayout(fuzz::View(data, size));
  if (!stages.ok()) return 0;
  if (stages->empty()) std::abort();
  int block = 0, mtp = 0;
  for (const planner::PipelineStageLayers& s : *stages) {
    if (s.first_block != block || s.end_block < s.first_block || s.first_mtp != mtp ||
        s.end_mtp < s.first_mtp) {
      std::abort();  // the stages do not tile the layers in order
    }
    block = s.end_block;
    mtp = s.end_mtp;
  }
  // Written out, the stages read back the same.
  auto again = planner::ParsePipelineLayout(planner::FormatPipelineLayout(*stages));
  if (!again.ok() || *again != *stages) std::abort();
  planner::ModelConfig model;
  model.num_layers = block;
  model.mtp_num_layers = mtp;
  const int n = static_cast<int>(stages->size());
  const absl::Status per_rank = planner::ValidatePipelineLayout(*stages, model, n);
  const absl::Status one_rank = planner::ValidatePipelineLayout(*stages, model, 1);
  if (per_rank.ok() != one_rank.ok()) std::abort();  // pp only sets the virtual stages
  if (per_rank.ok() && !(stages->front().embed && stages->back().loss)) std::abort();
  return 0;
}
