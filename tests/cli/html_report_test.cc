// The HTML report's page (html_report.h): what input strings can and cannot do
// to it, and the launcher arguments it lists. In a browser:
// tests/report/report_browser_test.sh.
#include "moeplan/client/html_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "moeplan/client/launcher_args.h"
#include "moeplan/proto/json.h"

namespace moeplan::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

TEST(HtmlReport, InputStringsCannotCloseTheScriptOrTheTitle) {
  EXPECT_EQ(EscapeScriptJson(R"({"name":"</script><b>&\u2028"})"),
            R"({"name":"\u003c/script\u003e\u003cb\u003e\u0026\u2028"})");
  EXPECT_EQ(EscapeScriptJson("\"\xe2\x80\xa8\xe2\x80\xa9\""), "\"\\u2028\\u2029\"");
  EXPECT_EQ(EscapeHtml("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");

  HtmlReport r;
  r.kind = "plan-model";
  r.title = "</title><script>alert(1)</script>";
  r.data_json = R"({"model":{"name":"</script><script>alert(2)</script>"}})";
  const std::string page = RenderHtml(r);
  // The data's, Chart.js's and report.js's: no input adds a fourth.
  EXPECT_EQ(Count(page, "</script>"), 3u);
  EXPECT_EQ(Count(page, "<title>"), 1u);
  EXPECT_THAT(page,
              HasSubstr("<title>&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;</title>"));
  EXPECT_THAT(page, HasSubstr(R"("name":"\u003c/script\u003e\u003cscript\u003ealert(2))"));
  EXPECT_THAT(page, Not(HasSubstr("alert(2)</script>")));
  // Self-contained: the page names no other file or host.
  EXPECT_THAT(page, Not(HasSubstr("<script src")));
  EXPECT_THAT(page, Not(HasSubstr("<link")));
  EXPECT_THAT(page, HasSubstr("Chart.js v"));
}

TEST(HtmlReport, MegatronArgumentsCarryTheLayout) {
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
}  // namespace moeplan::client
