// Megatron-Core's pipeline layout string (--pipeline-model-parallel-layout,
// docs/layouts.md "Pipeline layout"): which layers every pipeline stage
// holds, for uneven splits such as DeepSeek-V3's "Et|(tt|)*30mL" (PP8 with 4
// virtual stages: the embedding and one decoder layer first, the MTP layer
// and the loss last).
//
// Grammar: stages in forward order (every pipeline rank's first virtual
// stage, then every rank's second, ...), split by '|'. Symbols: E the
// embedding, t a decoder layer, m an MTP layer, L the loss (final norm,
// output layer and loss). "x*N" repeats a symbol, "(...)*N" a group (which
// may hold '|'); commas are cosmetic; whitespace is refused.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/planner/model.h"

namespace moeplan::planner {

// One stage of a layout: decoder layers [first_block, end_block) (the layers
// before it counted in order), MTP depths [first_mtp, end_mtp), and whether
// it holds the embedding and the loss.
struct PipelineStageLayers {
  int first_block = 0, end_block = 0;
  int first_mtp = 0, end_mtp = 0;
  bool embed = false, loss = false;
  friend bool operator==(const PipelineStageLayers&, const PipelineStageLayers&) = default;
};

// Most symbols a layout may expand to, and most nested groups: a layout
// names each layer once, so anything larger is a mistake (and would make a
// small string expand without bound).
inline constexpr int kMaxPipelineLayoutSymbols = 1 << 20;
inline constexpr int kMaxPipelineLayoutDepth = 32;

// The stages of `layout`, in forward order. InvalidArgument
// "pipeline_model_parallel_layout: <rule> (got ...)" naming the offending character's
// offset: an unknown symbol, an unbalanced group, a count that is not a
// positive integer, nothing to repeat, or an expansion over the limits.
absl::StatusOr<std::vector<PipelineStageLayers>> ParsePipelineLayout(std::string_view layout);

// The stages against the model and `pp` pipeline ranks: their count a
// multiple of pp (the quotient is the virtual stages per rank), every
// decoder layer and MTP depth of the model exactly once, E first in the first
// stage and L last in the last, the MTP depths after the last decoder layer
// and in the loss's stage (moeplan plans the MTP depths with the output
// layer they share), and no stage empty. InvalidArgument
// "pipeline_model_parallel_layout: <rule> (got ...)".
absl::Status ValidatePipelineLayout(const std::vector<PipelineStageLayers>& stages,
                                    const ModelConfig& model, int pp);

// The stages written out, one symbol per layer ("Et|tt|...|mL"): what
// ParsePipelineLayout reads back as the same stages.
std::string FormatPipelineLayout(const std::vector<PipelineStageLayers>& stages);

// The split of the model over `stages` (>= 2) chunks whose heaviest chunk
// computes the least (model FLOPs, FlopTermsOf): decoder layers in order,
// the embedding with the first chunk, the MTP depths and the loss with the
// last (which carries the output layers' FLOPs), every chunk between them
// holding a layer. Empty when the model has fewer than stages - 2 layers.
// What the search tries as search.pipeline_splits "balanced".
std::vector<PipelineStageLayers> BalancedPipelineLayout(const ModelConfig& model, int stages);

}  // namespace moeplan::planner
