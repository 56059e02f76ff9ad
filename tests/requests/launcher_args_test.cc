// The launcher arguments every plan-model candidate carries
// (launcher_args.h): Megatron-LM's flags and DeepSpeed's keys of a layout.
#include "moeplan/requests/launcher_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "moeplan/proto/json.h"

namespace moeplan::requests {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(LauncherArgs, MegatronArgumentsCarryTheLayout) {
  v1::ModelConfig m;
  ASSERT_TRUE(proto::ParseJson(R"({"num_layers": 48, "hidden_size": 2048,
      "num_attention_heads": 32, "ffn_hidden_size": 6144, "seq_length": 4096,
      "moe": {"num_experts": 128, "top_k": 8, "expert_ffn_hidden_size": 768,
              "layer_freq": 1}})",
                               &m)
                  .ok());
  v1::Layout l;
  ASSERT_TRUE(proto::ParseJson(R"({"dp": 16, "tp": 8, "pp": 8, "ep": 8, "esp": 1,
      "microbatches": 32, "zero_stage": 1, "pipeline": "interleaved", "virtual_stages": 2,
      "sequence_parallel": true, "a2a_overlap": true, "dispatcher": "deepep"})",
                               &l)
                  .ok());
  std::string args;
  for (const std::string& a : MegatronArgs(m, l, 1024)) args += a + " ";
  for (const char* want :
       {"--tensor-model-parallel-size 8 ", "--pipeline-model-parallel-size 8 ",
        "--expert-model-parallel-size 8 ", "--expert-tensor-parallel-size 1 ", "--num-experts 128 ",
        "--moe-router-topk 8 ",
        "--micro-batch-size 2 ",  // 1024 / (dp 16 x m 32)
        "--global-batch-size 1024 ", "--num-layers-per-virtual-pipeline-stage 3 ",
        "--use-distributed-optimizer ", "--sequence-parallel ",
        "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep ",
        "--overlap-moe-expert-parallel-comm ", "--moe-ffn-hidden-size 768 "}) {
    EXPECT_THAT(args, HasSubstr(want));
  }
  EXPECT_THAT(args, Not(HasSubstr("--recompute")));
  EXPECT_EQ(DeepSpeedConfig(m, l, 1024),
            "{\"train_batch_size\": 1024, \"train_micro_batch_size_per_gpu\": 2, "
            "\"gradient_accumulation_steps\": 32, \"zero_optimization\": {\"stage\": 1}, "
            "\"moe\": {\"ep_size\": 8, \"num_experts\": 128, \"top_k\": 8}, "
            "\"pipeline\": {\"stages\": 8}, \"tensor_parallel\": {\"tp_size\": 8}}");
}

}  // namespace
}  // namespace moeplan::requests
