// Megatron-Core's pipeline layout string (docs/layouts.md "Pipeline layout"):
// expansion, the stages it names, and its rules, each error naming the field.
#include "moeplan/planner/pipeline_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "moeplan/planner/accounting.h"
#include "moeplan/planner/layout_planner.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using Stages = std::vector<PipelineStageLayers>;

Stages ParseOrDie(std::string_view s) {
  absl::StatusOr<Stages> r = ParsePipelineLayout(s);
  EXPECT_TRUE(r.ok()) << s << ": " << r.status();
  return r.ok() ? *r : Stages{};
}

std::string ErrorOf(std::string_view s) {
  absl::StatusOr<Stages> r = ParsePipelineLayout(s);
  EXPECT_FALSE(r.ok()) << s;
  return r.ok() ? "" : std::string(r.status().message());
}

ModelConfig Layers(int n, int mtp = 0) {
  ModelConfig m;
  m.num_layers = n;
  m.mtp_num_layers = mtp;
  return m;
}

// DeepSeek-V3 on PP8 with 4 virtual stages (the Megatron-Core MoE report's
// layout): 32 stages, the embedding and layer 0 first, two layers in each of
// the next 30, the MTP layer and the loss last.
TEST(PipelineLayout, DeepSeekV3sUnevenLayout) {
  const Stages s = ParseOrDie("Et|(tt|)*30mL");
  ASSERT_EQ(s.size(), 32u);
  EXPECT_EQ(s[0], (PipelineStageLayers{0, 1, 0, 0, true, false}));
  for (int i = 1; i <= 30; ++i) {
    EXPECT_EQ(s[static_cast<size_t>(i)],
              (PipelineStageLayers{2 * i - 1, 2 * i + 1, 0, 0, false, false}))
        << i;
  }
  EXPECT_EQ(s[31], (PipelineStageLayers{61, 61, 0, 1, false, true}));
  EXPECT_TRUE(ValidatePipelineLayout(s, Layers(61, 1), 8).ok());
  // 32 stages are 4 per rank on 8 ranks, 2 on 16, not a whole number on 5.
  EXPECT_TRUE(ValidatePipelineLayout(s, Layers(61, 1), 16).ok());
  EXPECT_EQ(ValidatePipelineLayout(s, Layers(61, 1), 5).message(),
            "pipeline_model_parallel_layout: its stages must be a multiple of pp (5): pp x virtual "
            "stages per "
            "rank (got 32 stages)");
}

// Repetition of symbols and of groups holding '|', commas ignored: the
// same stages however they are spelled.
TEST(PipelineLayout, RepetitionsExpandAndCommasAreCosmetic) {
  EXPECT_EQ(ParseOrDie("Et*3|(tt|)*2,t|L"), ParseOrDie("Ettt|tt|tt|t|L"));
  EXPECT_EQ(ParseOrDie("E((t)*2|)*2L"), ParseOrDie("Ett|tt|L"));
  // Written out one symbol per layer, and read back the same.
  EXPECT_EQ(FormatPipelineLayout(ParseOrDie("Et*3|(tt|)*2,m|L")), "Ettt|tt|tt|m|L");
  const Stages ds = ParseOrDie("Et|(tt|)*30mL");
  EXPECT_EQ(ParseOrDie(FormatPipelineLayout(ds)), ds);
  const Stages s = ParseOrDie("E|t*4|L");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], (PipelineStageLayers{0, 0, 0, 0, true, false}));
  EXPECT_EQ(s[1], (PipelineStageLayers{0, 4, 0, 0, false, false}));
  EXPECT_EQ(s[2], (PipelineStageLayers{4, 4, 0, 0, false, true}));
  EXPECT_TRUE(ValidatePipelineLayout(s, Layers(4), 3).ok());
  EXPECT_TRUE(ValidatePipelineLayout(s, Layers(4), 1).ok());  // one rank, 3 virtual stages
}

TEST(PipelineLayout, SyntaxErrorsNameTheFieldAndThePlace) {
  EXPECT_EQ(ErrorOf(""), "pipeline_model_parallel_layout: must not be empty (got \"\")");
  // Commas alone name nothing (found by fuzz_pipeline_layout: it wrote back as "").
  EXPECT_EQ(ErrorOf(",(,)*3"),
            "pipeline_model_parallel_layout: must name a layer or a stage (got "
            "',(,)*3')");
  EXPECT_EQ(ErrorOf("Et|x|L").rfind("pipeline_model_parallel_layout: symbols are E (embedding)", 0),
            0u);
  EXPECT_NE(ErrorOf("Et|x|L").find("(got 'x' at offset 3)"), std::string::npos);
  EXPECT_NE(ErrorOf("Et |L").find("(got ' ' at offset 2)"), std::string::npos);
  EXPECT_NE(ErrorOf(std::string("Et\x01L", 4)).find("(got byte 0x01 at offset 2)"),
            std::string::npos);
  EXPECT_EQ(ErrorOf("E(t|L"),
            "pipeline_model_parallel_layout: '(' is never closed (got '(' at offset 1)");
  EXPECT_EQ(ErrorOf("Et)L"),
            "pipeline_model_parallel_layout: ')' closes no group (got ')' at offset 2)");
  EXPECT_EQ(
      ErrorOf("E*t"),
      "pipeline_model_parallel_layout: '*' must be followed by a count (got '*' at offset 1)");
  EXPECT_EQ(
      ErrorOf("*2E"),
      "pipeline_model_parallel_layout: '*' must follow a symbol or a group (got '*' at offset 0)");
  EXPECT_EQ(ErrorOf("Et*0L"),
            "pipeline_model_parallel_layout: a count must be at least 1 (got '0' at offset 3)");
  EXPECT_EQ(ErrorOf("tE|L"),
            "pipeline_model_parallel_layout: E (the embedding) must be the first symbol (got E "
            "after 1)");
  EXPECT_EQ(ErrorOf("EtL|t"),
            "pipeline_model_parallel_layout: L (the loss) must be the last symbol (got L before 2 "
            "more)");
  EXPECT_EQ(ErrorOf("Etmt|L"),
            "pipeline_model_parallel_layout: decoder layers (t) must come before MTP layers (m) "
            "(got t after 1 m)");
}

// A short string cannot expand without bound: counts and the expansion are
// capped, and so is nesting.
TEST(PipelineLayout, ExpansionIsBounded) {
  EXPECT_NE(ErrorOf("E((t*1024)*1024)*2L").find("expands to more than 1048576 symbols"),
            std::string::npos);
  EXPECT_NE(ErrorOf("Et*99999999999L").find("a count must be at most 1048576"), std::string::npos);
  std::string deep = "E" + std::string(40, '(') + "t" + std::string(40, ')') + "L";
  EXPECT_NE(ErrorOf(deep).find("groups nest at most 32 deep"), std::string::npos);
  std::string ok = "E" + std::string(32, '(') + "t" + std::string(32, ')') + "L";
  EXPECT_EQ(ParseOrDie(ok).size(), 1u);
}

TEST(PipelineLayout, RulesAgainstTheModelNameTheField) {
  EXPECT_EQ(ValidatePipelineLayout(ParseOrDie("Ett|ttL"), Layers(5), 2).message(),
            "pipeline_model_parallel_layout: must hold num_layers (5) decoder layers (t) (got 4)");
  EXPECT_EQ(ValidatePipelineLayout(ParseOrDie("Ett|ttL"), Layers(4, 1), 2).message(),
            "pipeline_model_parallel_layout: must hold mtp_num_layers (1) MTP layers (m) (got 0)");
  EXPECT_EQ(ValidatePipelineLayout(ParseOrDie("tt|ttL"), Layers(4), 2).message(),
            "pipeline_model_parallel_layout: must start with E (the embedding) (got 2 stages)");
  EXPECT_EQ(ValidatePipelineLayout(ParseOrDie("Ett|tt"), Layers(4), 2).message(),
            "pipeline_model_parallel_layout: must end with L (the loss) (got 2 stages)");
  EXPECT_EQ(ValidatePipelineLayout(ParseOrDie("Ett||ttL"), Layers(4), 3).message(),
            "pipeline_model_parallel_layout: every stage must hold a layer: moeplan plans no empty "
            "stage (got "
            "stage 1 (pipeline rank 1, virtual stage 0))");
  EXPECT_EQ(ValidatePipelineLayout(ParseOrDie("Ett|ttm|L"), Layers(4, 1), 3).message(),
            "pipeline_model_parallel_layout: MTP layers (m) must share the loss's stage: moeplan "
            "plans them with "
            "the output layer they share (got stage 1)");
}

// Eight equal dense blocks (hidden 64, one head, sequence 64, FFN 256: each
// 4 M^2 + M s + 2 M F = 53,248 flops a token) and an output layer of twice
// that (vocabulary 1,664): over 4 chunks the even split's last chunk carries
// 2 + 2 blocks' worth, the balanced one's at most 3, which is the least any
// split can do (10 blocks' worth over 4 chunks of whole blocks).
TEST(BalancedPipelineLayout, CountsTheOutputLayerWithTheLastChunk) {
  ModelConfig m = Layers(8);
  m.hidden_size = 64;
  m.num_attention_heads = 1;
  m.seq_length = 64;
  m.ffn_hidden_size = 256;
  m.vocab_size = 1664;
  const FlopTerms t = FlopTermsOf(m);
  ASSERT_EQ(t.Block(m, 0), 53248.0);
  ASSERT_EQ(t.output_layer, 2.0 * 53248.0);
  const Stages s = BalancedPipelineLayout(m, 4);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_TRUE(ValidatePipelineLayout(s, m, 4).ok()) << FormatPipelineLayout(s);
  double heaviest = 0.0;
  for (size_t i = 0; i < s.size(); ++i) {
    const double blocks = s[i].end_block - s[i].first_block + (s[i].loss ? 2.0 : 0.0);
    heaviest = std::max(heaviest, blocks);
  }
  EXPECT_EQ(heaviest, 3.0) << FormatPipelineLayout(s);
  EXPECT_LE(s.back().end_block - s.back().first_block, 1) << FormatPipelineLayout(s);
  // An MTP depth (a block and its projection, and an output layer more)
  // goes with the loss; too few layers for the chunks: no split.
  m.mtp_num_layers = 1;
  const Stages mtp = BalancedPipelineLayout(m, 4);
  ASSERT_EQ(mtp.size(), 4u);
  EXPECT_EQ(mtp.back().end_mtp, 1);
  EXPECT_EQ(mtp.back().first_block, 8) << FormatPipelineLayout(mtp);
  EXPECT_TRUE(BalancedPipelineLayout(Layers(2), 5).empty());
}

// The search tries the balanced split beside the even one where they
// differ, picks it on a model whose output layer outweighs a block, and its
// bounds still keep the exhaustive top N.
TEST(BalancedPipelineLayout, SearchTriesItWhenAsked) {
  ModelConfig m = testing::SmallDenseModel(1);
  m.vocab_size = 8192;
  m.global_batch_size = 16;
  LayoutPlanner lp(testing::RoundNumberModel());
  SearchOptions so;
  so.top = 8;
  so.gpus = 8;
  so.max_microbatches = 8;
  so.zero_stages = {1};
  so.balanced_pipeline = {false, true};
  LayoutSearchResult pruned, all;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &pruned).ok());
  so.exhaustive = true;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &all).ok());
  ASSERT_EQ(pruned.candidates.size(), all.candidates.size());
  int balanced = 0;
  for (size_t i = 0; i < all.candidates.size(); ++i) {
    EXPECT_EQ(pruned.candidates[i].iteration_us, all.candidates[i].iteration_us) << "rank " << i;
    balanced += !all.candidates[i].layout.stage_layers.empty();
  }
  EXPECT_GT(balanced, 0);
  so.balanced_pipeline = {true, true};
  EXPECT_EQ(lp.Search(m, so, {}, {}, &all).message(),
            "search.balanced_pipeline: each of false and true may be listed once (got 2 values)");
}

}  // namespace
}  // namespace moeplan::planner
