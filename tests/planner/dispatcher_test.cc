// Token dispatchers (docs/model.md "AlltoAll algorithms"): DeepEP's
// node-deduplicated dispatch and group-limited routing's inter-node bytes,
// and the layout's dispatcher= that picks it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <string_view>
#include <tuple>

#include "moeplan/planner/layout.h"
#include "moeplan/planner/layout_planner.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberModel;

// Four blocks, MoE every other one: 32 experts, top 4, EP 32 over the
// round-number profile's 4 nodes of 8 (linear AlltoAlls only: one variant).
ModelConfig Ep32(int groups, int group_topk) {
  ModelConfig m;
  m.name = "ep32";
  m.num_layers = 4;
  m.hidden_size = 256;
  m.num_attention_heads = 8;
  m.ffn_hidden_size = 1024;
  m.seq_length = 128;
  m.micro_batch_size = 2;
  m.bytes_per_element = 2;
  m.moe.layer_freq = 2;
  m.moe.num_experts = 32;
  m.moe.top_k = 4;
  m.moe.capacity_factor = 1.0;
  m.moe.expert_ffn_hidden_size = 512;
  m.moe.router_num_groups = groups;
  m.moe.router_group_topk = group_topk;
  m.parallel = {.mp = 1, .ep = 32, .esp = 1, .dp = 32, .pp = 1};
  return m;
}

// The forward dispatch op of the plan of `m` with AlltoAll algorithm `a`.
Op Dispatch(const ModelConfig& m, AllToAllAlgo a) {
  ModelPlanner planner(RoundNumberModel());
  ModelPlanOptions o;
  o.variants = {Variant::kNone};
  o.schedules = {Schedule::kDefault};
  o.algos = {a};
  ModelPlan plan;
  EXPECT_TRUE(planner.Plan(m, o, &plan).ok());
  const OpGraph& g = plan.variants[static_cast<size_t>(plan.best)].graph;
  for (OpId id = 0; id < g.size(); ++id) {
    if (g.op(id).base == "fwd.ep_alltoall_dispatch") return g.op(id);
  }
  ADD_FAILURE() << "no fwd.ep_alltoall_dispatch";
  return {};
}

// By hand, n bytes per rank over 4 nodes of 8: the linear AlltoAll sends
// 3/4 of n off-node. DeepEP sends a token once per remote node it reaches:
// with top 4 of 32 experts spread over 4 nodes, 4 (1 - (3/4)^4) = 2.734
// distinct nodes of its 4 copies (share 0.6836); with 4 groups (one per
// node) and top 2 groups, 2 nodes reachable, 2 (1 - (1/2)^4) = 1.875
// (share 0.46875). The op holds both links for the slower of RDMA (an
// AlltoAll among the 4 nodes of n x share) and NVLink forwarding (among the
// node's 8, of n): 3 (10 + n s / 4 x 0.01) against 7 (2 + n / 8 x 0.001).
TEST(DeepEp, SendsATokenOncePerRemoteNode) {
  const Op linear = Dispatch(Ep32(0, 0), AllToAllAlgo::kLinear);
  const double n = static_cast<double>(linear.bytes);
  EXPECT_EQ(linear.inter_node_bytes, static_cast<int64_t>(std::llround(n * 3.0 / 4.0)));
  for (auto [groups, topk, share] :
       {std::tuple{0, 0, (4.0 * (1.0 - std::pow(0.75, 4))) / 4.0}, std::tuple{4, 2, 0.46875}}) {
    const Op deepep = Dispatch(Ep32(groups, topk), AllToAllAlgo::kDeepEp);
    EXPECT_EQ(deepep.bytes, linear.bytes);
    EXPECT_EQ(deepep.resources, kIntra | kInter);
    const double inter = 3.0 * (10.0 + n * share / 4.0 * 0.01);
    const double intra = 7.0 * (2.0 + n / 8.0 * 0.001);
    EXPECT_REL(deepep.cost_us, std::max(inter, intra)) << "groups " << groups;
    EXPECT_NEAR(static_cast<double>(deepep.inter_node_bytes), n * share * 3.0 / 4.0, 1.0);
  }
  // The linear AlltoAll's bytes do not depend on the groups.
  EXPECT_EQ(Dispatch(Ep32(4, 2), AllToAllAlgo::kLinear).cost_us, linear.cost_us);
}

Layout Ep32Layout() {
  Layout l;
  l.dp = 32;
  l.ep = 32;
  l.microbatches = 2;
  l.family = Family::kDpMoe;
  return l;
}

// dispatcher=deepep plans every MoE layer with DeepEP's dispatch: on this
// inter-node-bound layout the iteration is faster than the AlltoAll
// dispatcher's (linear or 2DH, the faster).
TEST(DeepEp, LayoutDispatcherPicksIt) {
  ModelConfig m = Ep32(4, 2);
  m.global_batch_size = 128;
  LayoutPlanner lp(RoundNumberModel());
  Layout l = Ep32Layout();
  LayoutCandidate a2a, deepep;
  ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &a2a).ok());
  l.dispatcher = Dispatcher::kDeepEp;
  ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &deepep).ok());
  EXPECT_EQ(deepep.algo, AllToAllAlgo::kDeepEp);
  EXPECT_NE(a2a.algo, AllToAllAlgo::kDeepEp);
  EXPECT_LT(deepep.iteration_us, a2a.iteration_us);
  l.ep = 1;
  l.family = Family::kDpMoe;
  EXPECT_EQ(ValidateLayout(m, l, 128, {4, 8}).message(),
            "layout.dispatcher: deepep needs expert parallelism (ep >= 2) over an exchange (not "
            "ppmoe, which dispatches inside the TP group) (got ep=1, family=dpmoe)");
}

// The search tries DeepEP beside the AlltoAll dispatcher when asked, and
// its bounds still keep the exhaustive top N.
TEST(DeepEp, SearchTriesItWhenAsked) {
  ModelConfig m = Ep32(4, 2);
  m.global_batch_size = 128;
  LayoutPlanner lp(RoundNumberModel());
  SearchOptions so;
  so.top = 6;
  so.max_microbatches = 4;
  so.zero_stages = {1};
  so.dispatchers = {Dispatcher::kAllToAll, Dispatcher::kDeepEp};
  LayoutSearchResult pruned, all;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &pruned).ok());
  so.exhaustive = true;
  ASSERT_TRUE(lp.Search(m, so, {}, {}, &all).ok());
  ASSERT_EQ(pruned.candidates.size(), all.candidates.size());
  int deepep = 0;
  for (size_t i = 0; i < all.candidates.size(); ++i) {
    EXPECT_EQ(pruned.candidates[i].iteration_us, all.candidates[i].iteration_us) << "rank " << i;
    deepep += all.candidates[i].layout.dispatcher == Dispatcher::kDeepEp;
  }
  EXPECT_GT(deepep, 0);
  so.dispatchers = {Dispatcher::kDeepEp, Dispatcher::kDeepEp};
  EXPECT_EQ(lp.Search(m, so, {}, {}, &all).message(),
            "search.dispatchers: each of alltoall, deepep and allgather may be listed once (got 2 "
            "values)");
}

// The op of `base` in the plan of `m` with algorithm `a` (null when none).
const Op* OpOf(const ModelPlan& plan, std::string_view base) {
  const OpGraph& g = plan.variants[static_cast<size_t>(plan.best)].graph;
  for (OpId id = 0; id < g.size(); ++id) {
    if (g.op(id).base == base) return &g.op(id);
  }
  return nullptr;
}

// The allgather dispatcher: EP 4 inside a node, 256 tokens of hidden 256 in
// 2 bytes per rank. Towards the experts each rank AllGathers its 131,072
// bytes of tokens (the forward's with 5 bytes per expert of routing: 40,960
// more); back, the outputs are ReduceScattered, 131,072 bytes a rank. No
// AlltoAll is left, and the layout's dispatcher= plans it.
TEST(AllGatherDispatcher, GathersTokensAndReduceScattersOutputs) {
  ModelConfig m = Ep32(0, 0);
  m.parallel = {.mp = 1, .ep = 4, .esp = 1, .dp = 4, .pp = 1};
  ModelPlanner planner(RoundNumberModel());
  ModelPlanOptions o;
  o.variants = {Variant::kNone};
  o.algos = {AllToAllAlgo::kAllGather};
  ModelPlan plan;
  ASSERT_TRUE(planner.Plan(m, o, &plan).ok());
  const GroupShape ep{4, 1};
  const double tokens = 256.0 * 256 * 2, routing = 5.0 * 256 * 32;
  const struct {
    std::string_view base;
    Collective c;
    double bytes;
  } expected[] = {{"fwd.ep_allgather_dispatch", Collective::kAllGather, tokens + routing},
                  {"fwd.ep_reducescatter_combine", Collective::kReduceScatter, tokens},
                  {"bwd.ep_allgather_combine", Collective::kAllGather, tokens},
                  {"bwd.ep_reducescatter_dispatch", Collective::kReduceScatter, tokens}};
  for (const auto& e : expected) {
    const Op* op = OpOf(plan, e.base);
    ASSERT_NE(op, nullptr) << e.base;
    EXPECT_EQ(op->bytes, static_cast<int64_t>(e.bytes)) << e.base;
    EXPECT_REL(op->cost_us, RoundNumberModel().CollectiveUs(e.c, ep, e.bytes));
  }
  EXPECT_EQ(OpOf(plan, "fwd.ep_alltoall_dispatch"), nullptr);
  EXPECT_EQ(plan.variants[0].schedule, Schedule::kDefault);

  m.global_batch_size = 64;
  LayoutPlanner lp(RoundNumberModel());
  Layout l;
  l.dp = 16;
  l.ep = 4;
  l.microbatches = 1;
  l.family = Family::kDpMoe;
  l.dispatcher = Dispatcher::kAllGather;
  LayoutCandidate c;
  ASSERT_TRUE(lp.Evaluate(m, l, {}, {}, &c).ok());
  EXPECT_EQ(c.algo, AllToAllAlgo::kAllGather);
  l.ep = 1;
  EXPECT_EQ(ValidateLayout(m, l, 64, {4, 8}).message(),
            "layout.dispatcher: allgather needs expert parallelism (ep >= 2) over an exchange (not "
            "ppmoe, which dispatches inside the TP group) (got ep=1, family=dpmoe)");
}

}  // namespace
}  // namespace moeplan::planner
