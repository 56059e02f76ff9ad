#include "moeplan/proto/convert.h"

#include <gtest/gtest.h>

#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/planner/model.h"
#include "moeplan/proto/json.h"

namespace moeplan::proto {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

v1::LayerConfig Layer(const char* json) {
  v1::LayerConfig l;
  absl::Status s = ParseJson(json, &l);
  EXPECT_TRUE(s.ok()) << s;
  return l;
}

constexpr const char* kLayer = R"({"name": "t", "batch_size": 8, "seq_len": 512,
  "model_dim": 1024, "hidden_dim": 4096, "num_experts": 32, "top_k": 2,
  "capacity_factor": 1.0, "parallel": {"mp": 4, "ep": 16, "esp": 4}})";

TEST(LayerFromProto, FillsDefaults) {
  absl::StatusOr<planner::LayerConfig> l = LayerFromProto(Layer(kLayer));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->bytes_per_element, 2);
  EXPECT_EQ(l->token_skew, 1.0);
  EXPECT_EQ(l->parallel.dp, 16);  // ep * esp / mp = 16 * 4 / 4
  EXPECT_EQ(l->parallel.pp, 1);
  EXPECT_EQ(l->batch_size, 8);
}

TEST(LayerFromProto, KeepsExplicitValuesAndChecksDerivation) {
  absl::StatusOr<planner::LayerConfig> l = LayerFromProto(Layer(
      R"({"bytes_per_element": 4, "token_skew": 1.5, "parallel": {"mp": 2, "ep": 4, "esp": 2, "dp": 3, "pp": 2}})"));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->bytes_per_element, 4);
  EXPECT_EQ(l->token_skew, 1.5);
  EXPECT_EQ(l->parallel.dp, 3);  // explicit, even if inconsistent: validation says so later
  EXPECT_EQ(l->parallel.pp, 2);
  absl::StatusOr<planner::LayerConfig> bad =
      LayerFromProto(Layer(R"({"parallel": {"mp": 4, "ep": 3, "esp": 2}})"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(bad.status()).rfind("parallel.dp: ", 0), 0u) << bad.status();
  EXPECT_EQ(Msg(LayerFromProto(Layer(R"({"schema_version": 2})")).status()),
            "schema_version: must be 1 (got 2)");
}

// A model file without moe is a dense model: ep, esp and dp unset read as
// 1, and it is written back without moe. An empty moe is an error.
TEST(ModelFromProto, NoMoeIsADenseModel) {
  v1::ModelConfig m;
  ASSERT_TRUE(ParseJson(R"({"name": "d", "num_layers": 2, "hidden_size": 64,
      "num_attention_heads": 4, "ffn_hidden_size": 256, "seq_length": 32,
      "micro_batch_size": 1, "parallel": {"mp": 2}})",
                        &m)
                  .ok());
  absl::StatusOr<planner::ModelConfig> d = ModelFromProto(m);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->IsDense());
  EXPECT_EQ(d->parallel.mp, 2);
  EXPECT_EQ(d->parallel.ep, 1);
  EXPECT_EQ(d->parallel.esp, 1);
  EXPECT_EQ(d->parallel.dp, 1);
  EXPECT_TRUE(planner::ValidateModelShape(*d).ok());
  const v1::ModelConfig back = ModelToProto(*d);
  EXPECT_FALSE(back.has_moe());
  m.mutable_moe();
  EXPECT_EQ(Msg(ModelFromProto(m).status()),
            "moe.num_experts: must be > 0 (got 0; leave moe out for a dense model)");
  // A layout's ep and esp unset read as 1 (Megatron-Core's default).
  v1::Layout l;
  l.set_dp(4);
  l.set_tp(2);
  absl::StatusOr<planner::Layout> pl = LayoutFromProto(l);
  ASSERT_TRUE(pl.ok());
  EXPECT_EQ(pl->ep, 1);
  EXPECT_EQ(pl->esp, 1);
}

// --layout's layout= takes the rest of the spec (a Megatron-Core pipeline
// layout may hold commas); the stages are parsed into the planner's layout,
// its virtual stages derived when unset, and written back one symbol per
// layer. A bad layout names the field.
TEST(LayoutFromSpec, PipelineLayoutTakesTheRestOfTheSpec) {
  absl::StatusOr<v1::Layout> spec = LayoutFromSpec("dp=4,tp=2,pp=2,layout=Et*3|(t|)*2,tmL");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->pipeline_model_parallel_layout(), "Et*3|(t|)*2,tmL");
  absl::StatusOr<planner::Layout> l = LayoutFromProto(*spec);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->stage_layers.size(), 4u);
  EXPECT_EQ(l->virtual_stages, 2);  // 4 stages on pp 2
  EXPECT_EQ(l->pipeline, planner::PipelineSchedule::kInterleaved);
  EXPECT_EQ(l->stage_layers[3], (planner::PipelineStageLayers{5, 6, 0, 1, false, true}));
  EXPECT_EQ(LayoutToProto(*l, 1).pipeline_model_parallel_layout(), "Ettt|t|t|tmL");
  // Given, the virtual stages stay as given (ValidateLayout compares).
  v1::Layout given = *spec;
  given.set_virtual_stages(1);
  EXPECT_EQ(LayoutFromProto(given)->virtual_stages, 1);
  EXPECT_EQ(Msg(LayoutFromSpec("layout=Et|L,dp=1").status()), "--layout: dp= is required");
  given.set_pipeline_model_parallel_layout("Et|(tL");
  EXPECT_EQ(Msg(LayoutFromProto(given).status()),
            "layout.pipeline_model_parallel_layout: '(' is never closed (got '(' at offset 3)");
}

// sp=1 is Megatron-Core's --sequence-parallel: parsed into the layout and
// written back; anything but 0 or 1 names the key. The search's values are
// each tried once.
// etp is Megatron-Core's name for esp (--expert-tensor-parallel-size): the
// same degree, given once.
// LayoutToSpec is LayoutFromSpec's inverse: what it prints reads back as
// the same layout, every key included (selective recomputation, the
// pipeline layout with its commas last).
TEST(LayoutToSpec, ReadsBackAsTheSameLayout) {
  for (const char* spec :
       {"dp=2,tp=1,pp=1", "dp=8,tp=2,pp=8,ep=8,etp=1,microbatches=32,sp=1,pipeline=interleaved,v=7",
        "dp=64,tp=2,pp=8,ep=64,etp=1,microbatches=128,zero=1,sp=1,recompute=mla_up_proj+mlp,"
        "a2a_overlap=1,dispatcher=deepep,layout=Et|(tt|)*30mL",
        "dp=4,tp=2,cp=2,pp=2,ep=4,esp=2,microbatches=8,zero=3,family=parm,pipeline=dualpipe,"
        "recompute=1,layout=Et*3|(t|)*2,tmL"}) {
    SCOPED_TRACE(spec);
    absl::StatusOr<v1::Layout> first = LayoutFromSpec(spec);
    ASSERT_TRUE(first.ok()) << first.status();
    const std::string printed = LayoutToSpec(*first);
    absl::StatusOr<v1::Layout> again = LayoutFromSpec(printed);
    ASSERT_TRUE(again.ok()) << printed << ": " << again.status();
    EXPECT_EQ(again->SerializeAsString(), first->SerializeAsString()) << printed;
  }
  absl::StatusOr<v1::Layout> l = LayoutFromSpec("dp=2,tp=1,pp=1");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(LayoutToSpec(*l), "dp=2,tp=1,pp=1");
}

TEST(LayoutFromSpec, EtpIsEsp) {
  absl::StatusOr<v1::Layout> spec = LayoutFromSpec("dp=8,tp=2,pp=8,ep=8,etp=1,sp=1");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->esp(), 1);
  EXPECT_EQ(LayoutFromSpec("dp=8,tp=2,pp=8,ep=4,etp=2")->esp(), 2);
  EXPECT_EQ(Msg(LayoutFromSpec("dp=8,tp=2,pp=8,esp=2,etp=2").status()),
            "--layout: esp and etp name the same degree (etp is Megatron-Core's name); give one");
  EXPECT_EQ(Msg(LayoutFromSpec("dp=8,tp=2,pp=8,etp=1,esp=1").status()),
            "--layout: esp and etp name the same degree (etp is Megatron-Core's name); give one");
}

// cp: Megatron-Core's --context-parallel-size; unset or 0 is 1, and the
// family inferred counts the cp ranks with dp (ep 4 < dp 2 x cp 4: dpmoe).
TEST(LayoutFromSpec, ContextParallel) {
  absl::StatusOr<v1::Layout> spec = LayoutFromSpec("dp=2,tp=2,cp=4,pp=1,ep=4,etp=2");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->cp(), 4);
  absl::StatusOr<planner::Layout> l = LayoutFromProto(*spec);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->cp, 4);
  EXPECT_EQ(l->Gpus(), 16);
  EXPECT_EQ(l->family, planner::Family::kDpMoe);
  EXPECT_EQ(LayoutToProto(*l, 1).cp(), 4);
  EXPECT_EQ(LayoutFromProto(*LayoutFromSpec("dp=2,tp=2,pp=1"))->cp, 1);
  EXPECT_EQ(Msg(LayoutFromSpec("dp=2,tp=2,pp=1,cp=two").status()),
            "--layout: cp must be an integer (got 'two')");
}

// recompute=MODULE+MODULE: selective recomputation by Megatron-Core's module
// names, written back in module order; 0/1 stays full recomputation.
TEST(LayoutFromSpec, RecomputeModules) {
  absl::StatusOr<v1::Layout> spec = LayoutFromSpec("dp=4,tp=2,pp=1,recompute=moe_act+core_attn");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->recompute());
  ASSERT_EQ(spec->recompute_modules_size(), 2);
  absl::StatusOr<planner::Layout> l = LayoutFromProto(*spec);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->recompute_modules, planner::kRecomputeMoeAct | planner::kRecomputeCoreAttn);
  const v1::Layout back = LayoutToProto(*l, 1);
  ASSERT_EQ(back.recompute_modules_size(), 2);
  EXPECT_EQ(back.recompute_modules(0), "core_attn");
  EXPECT_EQ(back.recompute_modules(1), "moe_act");
  EXPECT_TRUE(LayoutFromProto(*LayoutFromSpec("dp=4,tp=2,pp=1,recompute=1"))->recompute);
  EXPECT_EQ(Msg(LayoutFromProto(*LayoutFromSpec("dp=4,tp=2,pp=1,recompute=moe")).status()),
            "layout.recompute_modules: each must be core_attn, layernorm, mlp, moe_act, "
            "shared_experts or mla_up_proj (got 'moe')");
  EXPECT_EQ(Msg(LayoutFromProto(*LayoutFromSpec("dp=4,tp=2,pp=1,recompute=mlp+mlp")).status()),
            "layout.recompute_modules: each may be listed once (got 'mlp' twice)");
  EXPECT_EQ(Msg(LayoutFromProto(*LayoutFromSpec("dp=4,tp=2,pp=1,recompute=mlp+")).status()),
            "layout.recompute_modules: each must be core_attn, layernorm, mlp, moe_act, "
            "shared_experts or mla_up_proj (got '')");
}

// a2a_overlap=0|1, pipeline=dualpipe and dispatcher=, read and written back.
TEST(LayoutFromSpec, A2aOverlapAndDualPipe) {
  absl::StatusOr<v1::Layout> spec =
      LayoutFromSpec("dp=8,tp=1,pp=4,ep=8,microbatches=8,pipeline=dualpipe,a2a_overlap=1");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->a2a_overlap());
  absl::StatusOr<planner::Layout> l = LayoutFromProto(*spec);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->a2a_overlap);
  EXPECT_EQ(l->pipeline, planner::PipelineSchedule::kDualPipe);
  EXPECT_EQ(l->Chunks(), 2);
  const v1::Layout back = LayoutToProto(*l, 1);
  EXPECT_TRUE(back.a2a_overlap());
  EXPECT_EQ(back.pipeline(), "dualpipe");
  EXPECT_EQ(Msg(LayoutFromSpec("dp=4,tp=2,pp=1,a2a_overlap=2").status()),
            "--layout: a2a_overlap must be 0 or 1 (got 2)");
  absl::StatusOr<planner::Layout> deepep =
      LayoutFromProto(*LayoutFromSpec("dp=8,tp=1,pp=1,ep=8,dispatcher=deepep"));
  ASSERT_TRUE(deepep.ok()) << deepep.status();
  EXPECT_EQ(deepep->dispatcher, planner::Dispatcher::kDeepEp);
  EXPECT_EQ(LayoutToProto(*deepep, 1).dispatcher(), "deepep");
  absl::StatusOr<planner::Layout> gather =
      LayoutFromProto(*LayoutFromSpec("dp=8,tp=1,pp=1,ep=2,dispatcher=allgather"));
  ASSERT_TRUE(gather.ok()) << gather.status();
  EXPECT_EQ(LayoutToProto(*gather, 1).dispatcher(), "allgather");
  EXPECT_EQ(Msg(LayoutFromProto(*LayoutFromSpec("dp=8,tp=1,pp=1,dispatcher=flex")).status()),
            "layout.dispatcher: must be alltoall, deepep or allgather (got 'flex')");
}

TEST(LayoutFromSpec, SequenceParallelIsZeroOrOne) {
  absl::StatusOr<v1::Layout> spec = LayoutFromSpec("dp=4,tp=2,pp=1,sp=1");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->sequence_parallel());
  absl::StatusOr<planner::Layout> l = LayoutFromProto(*spec);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->sequence_parallel);
  EXPECT_TRUE(LayoutToProto(*l, 1).sequence_parallel());
  EXPECT_FALSE(LayoutFromProto(*LayoutFromSpec("dp=4,tp=2,pp=1,sp=0"))->sequence_parallel);
  EXPECT_EQ(Msg(LayoutFromSpec("dp=4,tp=2,pp=1,sp=2").status()),
            "--layout: sp must be 0 or 1 (got 2)");
  EXPECT_EQ(Msg(LayoutFromSpec("dp=4,tp=2,pp=1,sp=yes").status()),
            "--layout: sp must be an integer (got 'yes')");
  v1::SearchOptions search;
  search.add_sequence_parallel(false);
  search.add_sequence_parallel(true);
  absl::StatusOr<planner::SearchOptions> both = SearchFromProto(search);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->sequence_parallel, (std::vector<bool>{false, true}));
  search.add_sequence_parallel(true);
  EXPECT_EQ(Msg(SearchFromProto(search).status()),
            "search.sequence_parallel: each of false and true may be listed once (got 3 values)");
  // A model file's parallel section carries it; a layer request refuses it.
  v1::ParallelLayout par;
  par.set_mp(2);
  par.set_ep(2);
  par.set_esp(1);
  par.set_sequence_parallel(true);
  absl::StatusOr<planner::ParallelLayout> p = ParallelFromProto(par);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->sequence_parallel);
}

TEST(ProfileFromProto, NamesMissingAndBadFields) {
  v1::ClusterProfile p = *calibration::BuiltinProfile("a100-8x8");
  ASSERT_TRUE(ProfileFromProto(p).ok());
  v1::ClusterProfile no_links = p;
  no_links.clear_links();
  EXPECT_EQ(Msg(ProfileFromProto(no_links).status()).rfind("links: ", 0), 0u);
  v1::ClusterProfile bad_fit = p;
  v1::CollectiveFit* f = bad_fit.add_collectives();
  f->mutable_shape()->set_ranks(8);
  f->mutable_shape()->set_nodes(1);
  f->mutable_cost()->set_beta_us_per_byte(1e-6);
  EXPECT_EQ(Msg(ProfileFromProto(bad_fit).status()).rfind("collectives[0].collective: ", 0), 0u)
      << ProfileFromProto(bad_fit).status();
  v1::ClusterProfile neg = p;
  neg.mutable_links()->mutable_inter()->set_alpha_us(-1);
  EXPECT_EQ(Msg(ProfileFromProto(neg).status()).rfind("links.inter.alpha_us: ", 0), 0u);
}

// A profile's name is echoed bounded and escaped (issue 35).
TEST(ProfileFromProto, EchoesABoundedEscapedName) {
  v1::ClusterProfile p = *calibration::BuiltinProfile("a100-8x8");
  p.set_name("\x1b[2J" + std::string(100 * 1024, 'A'));
  const std::string msg = Msg(ProfileFromProto(p).status());
  EXPECT_LT(msg.size(), 200u) << msg;
  EXPECT_EQ(msg.rfind("name: must not contain control characters (got '\\x1b[2JAAA", 0), 0u) << msg;
  EXPECT_NE(msg.find("'... (102404 bytes))"), std::string::npos) << msg;
}

// A user's value is echoed in an error as a bounded, escaped prefix: a 100 KB
// value in a header-sized gRPC status would be lost as "received initial
// metadata size exceeds limit" (issue 35).
TEST(Errors, EchoABoundedPrefixOfAUserValue) {
  const std::string big(100 * 1024, 'f');
  const std::string quoted = std::string("'") + std::string(64, 'f') + "'... (102400 bytes)";
  v1::Layout layout;
  layout.set_family(big);
  EXPECT_EQ(Msg(LayoutFromProto(layout).status()),
            "layout.family: must be dpmoe, ppmoe or parm (got " + quoted + ")");
  layout.clear_family();
  layout.set_pipeline(big);
  EXPECT_EQ(Msg(LayoutFromProto(layout).status()),
            "layout.pipeline: must be gpipe, 1f1b, interleaved or dualpipe (got " + quoted + ")");
  v1::SearchOptions search;
  search.add_families("parm");
  search.add_families(big);
  EXPECT_EQ(Msg(SearchFromProto(search).status()),
            "search.families: each must be dpmoe, ppmoe or parm (got " + quoted + ")");
  search.clear_families();
  search.add_pipelines(big);
  EXPECT_EQ(
      Msg(SearchFromProto(search).status()),
      "search.pipelines: each must be gpipe, 1f1b, interleaved or dualpipe (got " + quoted + ")");
  search.clear_pipelines();
  search.add_pipelines("1f1b");
  search.add_pipelines("1f1b");
  EXPECT_EQ(Msg(SearchFromProto(search).status()),
            "search.pipelines: each may be listed once (got '1f1b' twice)");
  search.clear_pipelines();
  search.add_dispatchers("deepep");
  search.add_dispatchers("flex");
  EXPECT_EQ(Msg(SearchFromProto(search).status()),
            "search.dispatchers: each must be alltoall, deepep or allgather (got 'flex')");
  search.clear_dispatchers();
  const std::string spec = Msg(LayoutFromSpec("dp=1,family" + big).status());
  EXPECT_LT(spec.size(), 360u) << spec;  // a 64-byte prefix and the keys
  EXPECT_NE(spec.find("'... (102406 bytes) (keys: "), std::string::npos) << spec;
  EXPECT_EQ(Msg(LayoutFromSpec("dp=1,dp=\x1b[2J").status()), "--layout: 'dp' given twice");
  EXPECT_EQ(Msg(LayoutFromSpec("dp=\x1b[2J").status()),
            "--layout: dp must be an integer (got '\\x1b[2J')");
}

// Names reach tables, progress lines and reports: a control character, even
// one escaped in JSON ("\u001b"), would reach a terminal (issue 35).
TEST(Names, RefuseControlCharacters) {
  v1::LayerConfig l = Layer(kLayer);
  for (const char* bad : {"a\x1b[31mred", "two\nlines", "bell\x07", "del\x7f", "c1\xc2\x9b"}) {
    l.set_name(bad);
    absl::Status s = LayerFromProto(l).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(Msg(s).rfind("name: must not contain control characters (got '", 0), 0u) << Msg(s);
    EXPECT_EQ(Msg(s).find_first_of("\x1b\n\x07\x7f"), std::string::npos) << Msg(s);
  }
  l.set_name("a\x1b[31m");
  EXPECT_EQ(Msg(LayerFromProto(l).status()),
            "name: must not contain control characters (got 'a\\x1b[31m')");
  l.set_name("ünïcode name, with spaces: fine");
  EXPECT_TRUE(LayerFromProto(l).ok());
  v1::ModelConfig m;
  m.set_name("m\x1b]0;title\x07");
  EXPECT_EQ(Msg(ModelFromProto(m).status()).rfind("name: must not contain control characters", 0),
            0u);
}

// Free text (a profile's comment, citations, provenance) reaches tables and
// report.md as names do: an escaped "\u001b" in a file, or a raw byte in a
// binary request, is refused naming the field, in files and in messages.
TEST(Text, FreeTextRefusesControlCharacters) {
  v1::ClusterProfile p = *calibration::BuiltinProfile("cpu-testbed-1x4");
  ASSERT_TRUE(ProfileFromProto(p).ok());
  v1::ClusterProfile bad = p;
  bad.set_comment("measured \x1b[2J here");
  EXPECT_EQ(Msg(ProfileFromProto(bad).status()),
            "comment: must not contain control characters (got 'measured \\x1b[2J here')");
  bad = p;
  bad.mutable_provenance()->add_hosts("node\a1");
  const std::string at = Cat("provenance.hosts[", p.provenance().hosts_size(), "]");
  EXPECT_EQ(Msg(ProfileFromProto(bad).status()).rfind(at + ": must not contain control", 0), 0u)
      << Msg(ProfileFromProto(bad).status());

  absl::StatusOr<std::string> json = ToJson(p);
  ASSERT_TRUE(json.ok());
  std::string text = *json;
  const size_t comment = text.find("\"comment\": \"");
  ASSERT_NE(comment, std::string::npos);
  text.insert(comment + 12, "\\u001b[31m");
  v1::ClusterProfile back;
  EXPECT_EQ(Msg(ParseJson(text, &back)).rfind("comment: must not contain control characters", 0),
            0u)
      << Msg(ParseJson(text, &back));
  EXPECT_EQ(back.ByteSizeLong(), 0u);  // nothing half-read
}

}  // namespace
}  // namespace moeplan::proto
