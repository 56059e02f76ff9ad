// What a model is, counted the way its users count it (docs/model.md
// "Accounting"): parameters as model cards state them, model FLOPs per token
// in Megatron-LM's convention (num_floating_point_operations), and what a
// plan's step time makes of them: tokens/s, TFLOP/s per GPU and MFU.
#pragma once

#include <cstdint>

#include "moeplan/planner/model.h"
#include "moeplan/planner/profile.h"

namespace moeplan::planner {

// Whole-model parameter counts (elements), Hugging Face's convention
// (num_parameters()): every weight, bias and norm, routed experts all counted
// in `total`, only the top_k a token reaches in `active`.
struct ParamCounts {
  double embedding = 0.0;       // the input embedding (and learned positions)
  double output_layer = 0.0;    // the output layer when untied; 0 when it is the embedding
  double transformer = 0.0;     // the num_layers blocks and the final norm
  double mtp = 0.0;             // the MTP depths (their embedding and output layer are shared)
  double routed_experts = 0.0;  // of the blocks (in transformer)
  double routed_experts_active = 0.0;  // top_k of them per MoE layer
  // embedding + output_layer + transformer (a model card's total, MTP excluded).
  double total = 0.0;
  // What one token computes with: total less the routed experts it does not reach.
  double active = 0.0;
  double total_with_mtp = 0.0;
};
ParamCounts CountParams(const ModelConfig& model);

// Parameters of one block, whole (not split by any parallel degree).
struct BlockParamCounts {
  double attention = 0.0;  // projections, their biases and norms, the two block norms
  double ffn = 0.0;        // a dense block's FFN
  double router = 0.0;
  double shared_experts = 0.0;  // with their gate
  double routed_expert = 0.0;   // one routed expert
};
BlockParamCounts CountBlockParams(const ModelConfig& model, bool moe);

// An MTP depth's own parameters besides its block (whole): its three norms
// (the next tokens' embedding, the hidden state, its output), held whole by
// every tensor-parallel rank, and the 2M -> M input projection, split.
struct MtpInputParams {
  double norms = 0.0;
  double projection = 0.0;
};
MtpInputParams CountMtpInputParams(const ModelConfig& model);

// Model FLOPs per token of one training step, Megatron-LM's
// num_floating_point_operations over global_batch x seq_length: 3 x the
// forward's GEMMs (2 flops a multiply-add), causal attention halved, MoE
// layers at top_k routed experts plus the shared ones, MTP depths (each of
// the last layer's kind) and their output layers included, the router,
// element-wise ops and recomputation not counted.
double FlopsPerToken(const ModelConfig& model);

// Its parts per token, before the factor 6 (3 passes x 2 flops a
// multiply-add): a block's attention (weights and causal core), a dense
// block's FFN, a MoE block's experts (top_k routed and the shared ones), an
// MTP depth's input projection and norms (besides its block), the output
// layer.
struct FlopTerms {
  double attention = 0.0, dense_ffn = 0.0, moe_ffn = 0.0, mtp_input = 0.0, output_layer = 0.0;
  double Block(const ModelConfig& m, int block) const {
    return attention + (m.IsMoeBlock(block) ? moe_ffn : dense_ffn);
  }
};
FlopTerms FlopTermsOf(const ModelConfig& model);

// What a step of `iteration_us` for `tokens` tokens on `gpus` GPUs makes.
struct Throughput {
  double tokens_per_s_per_gpu = 0.0;
  double tflops_per_gpu = 0.0;  // model TFLOP/s per GPU
  double mfu = 0.0;             // tflops_per_gpu / peak_tflops; 0 when the peak is unknown
};
Throughput ThroughputOf(double flops_per_token, double tokens, double iteration_us, int gpus,
                        double peak_tflops);

// MFU's denominator: the profile's dense GEMM peak at `bytes_per_element`.
double DensePeakTflops(const ClusterProfile& profile, int bytes_per_element);

}  // namespace moeplan::planner
