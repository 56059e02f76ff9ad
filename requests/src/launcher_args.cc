#include "moeplan/requests/launcher_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

namespace moeplan::requests {

int64_t MicroBatchSize(const v1::Layout& l, int64_t global_batch) {
  if (l.micro_batch_size() > 0) return l.micro_batch_size();
  const int64_t replicas = int64_t{std::max(l.dp(), 1)} * std::max(l.microbatches(), 1);
  return global_batch / replicas;
}

namespace {

// The layout's own flags: parallel degrees, pipeline, memory savings, overlaps.
void LayoutArgs(const v1::ModelConfig& m, const v1::Layout& l, std::vector<std::string>* f) {
  const auto add = [f](std::initializer_list<std::string> args) {
    f->insert(f->end(), args.begin(), args.end());
  };
  if (!l.pipeline_model_parallel_layout().empty()) {
    add({"--pipeline-model-parallel-layout", l.pipeline_model_parallel_layout()});
  } else if (l.pipeline() == "interleaved" && l.virtual_stages() > 1 && l.pp() > 0) {
    add({"--num-layers-per-virtual-pipeline-stage",
         std::to_string(m.num_layers() / (l.pp() * l.virtual_stages()))});
  }
  if (l.zero_stage() >= 1) add({"--use-distributed-optimizer"});
  if (l.recompute()) {
    add({"--recompute-granularity", "full", "--recompute-method", "uniform"});
  } else if (l.recompute_modules_size() > 0) {
    add({"--recompute-granularity", "selective", "--recompute-modules"});
    f->insert(f->end(), l.recompute_modules().begin(), l.recompute_modules().end());
  }
  if (l.sequence_parallel()) add({"--sequence-parallel"});
  if (l.cp() > 1) add({"--context-parallel-size", std::to_string(l.cp())});
  if (l.dispatcher() == "deepep") {
    add({"--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"});
  } else if (l.dispatcher() == "allgather") {
    add({"--moe-token-dispatcher-type", "allgather"});
  } else if (l.a2a_overlap()) {
    add({"--moe-token-dispatcher-type", "alltoall"});
  }
  if (l.a2a_overlap()) add({"--overlap-moe-expert-parallel-comm"});
  // Megatron-Core overlaps the gathers only with the gradient reduction
  // overlapped too, which moeplan always assumes.
  if (l.overlap_param_gather()) add({"--overlap-grad-reduce", "--overlap-param-gather"});
  if (l.tp_comm_overlap()) add({"--tp-comm-overlap"});
}

}  // namespace

std::vector<std::string> MegatronArgs(const v1::ModelConfig& m, const v1::Layout& l,
                                      int64_t global_batch) {
  const v1::MoeConfig& moe = m.moe();
  std::vector<std::string> f = {"--tensor-model-parallel-size",
                                std::to_string(std::max(l.tp(), 1)),
                                "--pipeline-model-parallel-size",
                                std::to_string(std::max(l.pp(), 1)),
                                "--expert-model-parallel-size",
                                std::to_string(std::max(l.ep(), 1)),
                                "--expert-tensor-parallel-size",
                                std::to_string(std::max(l.esp(), 1)),
                                "--num-experts",
                                std::to_string(moe.num_experts()),
                                "--moe-router-topk",
                                std::to_string(std::max(moe.top_k(), 1)),
                                "--micro-batch-size",
                                std::to_string(MicroBatchSize(l, global_batch)),
                                "--global-batch-size",
                                std::to_string(global_batch)};
  LayoutArgs(m, l, &f);
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--seq-length", m.seq_length()},
                                    {"--num-layers", m.num_layers()},
                                    {"--hidden-size", m.hidden_size()},
                                    {"--num-attention-heads", m.num_attention_heads()},
                                    {"--ffn-hidden-size", m.ffn_hidden_size()},
                                    {"--moe-ffn-hidden-size", moe.expert_ffn_hidden_size()},
                                    {"--moe-layer-freq", std::max(moe.layer_freq(), 1)}}) {
    f.push_back(flag);
    f.push_back(std::to_string(value));
  }
  if (moe.has_shared_expert_ffn_hidden_size() && moe.shared_expert_ffn_hidden_size() > 0) {
    f.push_back("--moe-shared-expert-intermediate-size");
    f.push_back(std::to_string(moe.shared_expert_ffn_hidden_size()));
  }
  if (moe.capacity_factor() > 0) {
    f.push_back("--moe-expert-capacity-factor");
    f.push_back(fmt::format("{:g}", moe.capacity_factor()));
  }
  if (!m.fp8_format().empty() && m.fp8_format() != "none") {
    f.insert(f.end(), {"--fp8-format", m.fp8_format(), "--fp8-recipe",
                       m.fp8_recipe().empty() ? std::string("delayed") : m.fp8_recipe()});
    if (m.fp8_param_gather()) f.push_back("--fp8-param-gather");
  }
  return f;
}

std::string DeepSpeedConfig(const v1::ModelConfig& m, const v1::Layout& l, int64_t global_batch) {
  return fmt::format(
      "{{\"train_batch_size\": {}, \"train_micro_batch_size_per_gpu\": {}, "
      "\"gradient_accumulation_steps\": {}, \"zero_optimization\": {{\"stage\": {}}}, "
      "\"moe\": {{\"ep_size\": {}, \"num_experts\": {}, \"top_k\": {}}}, "
      "\"pipeline\": {{\"stages\": {}}}, \"tensor_parallel\": {{\"tp_size\": {}}}}}",
      global_batch, MicroBatchSize(l, global_batch), std::max(l.microbatches(), 1), l.zero_stage(),
      std::max(l.ep(), 1), m.moe().num_experts(), std::max(m.moe().top_k(), 1), std::max(l.pp(), 1),
      std::max(l.tp(), 1));
}

void FillLauncherArgs(const v1::ModelConfig& model, int64_t global_batch, v1::LayoutCandidate* c) {
  c->clear_megatron_args();
  for (std::string& a : MegatronArgs(model, c->layout(), global_batch)) {
    c->add_megatron_args(std::move(a));
  }
  c->set_deepspeed_config(DeepSpeedConfig(model, c->layout(), global_batch));
}

}  // namespace moeplan::requests
