// Validation of layer configs and layouts (docs/notation.md): a table of bad configs, each
// rejected with InvalidArgument and a one-line message that starts with the field;
// valid configs that pass; and the capacity rounding of Capacity() / Derive().
#include "moeplan/planner/validate.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "moeplan/base/strings.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/schedules.h"
#include "moeplan/planner/types.h"
#include "test_profile.h"

namespace moeplan::planner {
namespace {

using testing::RoundNumberModel;
using testing::RoundNumberProfile;
const CostModel& Model() { return RoundNumberModel(); }

constexpr ClusterShape kCluster{4, 8};  // 32 GPUs

// A valid layer for every schedule: S = 1024, T = 128, mp = esp = 4, ep = 8, dp = 8.
LayerConfig BaseLayer() { return testing::SmallLayer(4, 8, 4, 8); }

void SetLayout(LayerConfig& l, int mp, int ep, int esp, int dp, int pp = 1) {
  l.parallel = {.mp = mp, .ep = ep, .esp = esp, .dp = dp, .pp = pp};
}

std::string Message(const absl::Status& s) { return std::string(View(s.message())); }

// Where the error must come from.
enum class Stage {
  kLayer,     // ValidateLayer (and LayerPlanner::Plan with all valid schedules)
  kSchedule,  // ValidateForSchedule for `schedules` (ValidateLayer passes)
  kPlan,      // only LayerPlanner::Plan with `schedules`
};

struct BadCase {
  std::string label;
  std::function<void(LayerConfig&)> mutate;
  std::string prefix;  // the message starts with this
  Stage stage = Stage::kLayer;
  std::vector<Schedule> schedules = {};
};

std::vector<BadCase> BadCases() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  return {
      {"batch_size 0", [](LayerConfig& l) { l.batch_size = 0; }, "batch_size: must be > 0"},
      {"batch_size negative", [](LayerConfig& l) { l.batch_size = -4; }, "batch_size: must be > 0"},
      {"seq_len negative", [](LayerConfig& l) { l.seq_len = -3; }, "seq_len: must be > 0"},
      {"model_dim 0", [](LayerConfig& l) { l.model_dim = 0; }, "model_dim: must be > 0"},
      {"hidden_dim too large", [](LayerConfig& l) { l.hidden_dim = (int64_t{1} << 24) + 1; },
       "hidden_dim: must be <= 16777216"},
      {"num_experts 0", [](LayerConfig& l) { l.num_experts = 0; }, "num_experts: must be > 0"},
      {"top_k 0", [](LayerConfig& l) { l.top_k = 0; }, "top_k: must be >= 1"},
      {"top_k above num_experts", [](LayerConfig& l) { l.top_k = 17; },
       "top_k: must be <= num_experts"},
      {"capacity_factor 0", [](LayerConfig& l) { l.capacity_factor = 0.0; },
       "capacity_factor: must be > 0 and <= 1024"},
      {"capacity_factor negative", [](LayerConfig& l) { l.capacity_factor = -1.0; },
       "capacity_factor: must be > 0"},
      {"capacity_factor NaN", [nan](LayerConfig& l) { l.capacity_factor = nan; },
       "capacity_factor: must be > 0 and <= 1024"},
      {"capacity_factor inf", [inf](LayerConfig& l) { l.capacity_factor = inf; },
       "capacity_factor: "},
      {"capacity_factor above 1024", [](LayerConfig& l) { l.capacity_factor = 1024.5; },
       "capacity_factor: "},
      {"bytes_per_element 3", [](LayerConfig& l) { l.bytes_per_element = 3; },
       "bytes_per_element: must be 1 (fp8), 2 (fp16/bf16) or 4 (fp32)"},
      {"bytes_per_element 0", [](LayerConfig& l) { l.bytes_per_element = 0; },
       "bytes_per_element: "},
      {"bytes_per_element 8", [](LayerConfig& l) { l.bytes_per_element = 8; },
       "bytes_per_element: "},
      {"token_skew 0.5", [](LayerConfig& l) { l.token_skew = 0.5; }, "token_skew: must be >= 1"},
      {"capacity_factor unset when padded", [](LayerConfig& l) { l.capacity_factor = 0.0; },
       "capacity_factor: must be > 0 and <= 1024 (or unset when dropless)"},
      {"token_skew NaN", [nan](LayerConfig& l) { l.token_skew = nan; }, "token_skew: "},
      {"token_skew above 1024", [](LayerConfig& l) { l.token_skew = 2000.0; }, "token_skew: "},
      {"too many tokens",
       [](LayerConfig& l) {
         l.batch_size = int64_t{1} << 24;
         l.seq_len = 256;
       },
       "batch_size: batch_size*seq_len must be <= 2147483648"},
      // S = 2^31, M = 2^20, b = 1: X = 2^51 B > 1 PiB.
      {"activation above 1 PiB",
       [](LayerConfig& l) {
         l.batch_size = int64_t{1} << 16;
         l.seq_len = int64_t{1} << 15;
         l.model_dim = int64_t{1} << 20;
         l.bytes_per_element = 1;
       },
       "batch_size: the activation S*M*b and dispatch buffer E*T*M*b must each be <= 1 PiB"},
      {"parallel.mp 0", [](LayerConfig& l) { SetLayout(l, 0, 8, 4, 8); },
       "parallel.mp: must be >= 1"},
      {"parallel.ep negative", [](LayerConfig& l) { SetLayout(l, 4, -1, 4, 8); },
       "parallel.ep: must be >= 1"},
      {"parallel.esp 0", [](LayerConfig& l) { SetLayout(l, 4, 8, 0, 8); },
       "parallel.esp: must be >= 1"},
      {"parallel.dp 0", [](LayerConfig& l) { SetLayout(l, 4, 8, 4, 0); },
       "parallel.dp: must be >= 1"},
      {"parallel.pp 0", [](LayerConfig& l) { SetLayout(l, 4, 8, 4, 8, 0); },
       "parallel.pp: must be >= 1"},
      {"parallel.dp huge", [](LayerConfig& l) { SetLayout(l, 1, 1, 1, (1 << 20) + 1); },
       "parallel.dp: must be <= 1048576"},
      {"mp*dp != ep*esp", [](LayerConfig& l) { SetLayout(l, 4, 8, 4, 4); },
       "parallel: mp*dp must equal ep*esp"},
      {"ep not dividing num_experts", [](LayerConfig& l) { SetLayout(l, 1, 3, 1, 3); },
       "parallel.ep: must divide num_experts"},
      {"esp not dividing hidden_dim", [](LayerConfig& l) { SetLayout(l, 1, 2, 3, 6); },
       "parallel.esp: must divide hidden_dim"},
      {"too many ranks for the cluster", [](LayerConfig& l) { SetLayout(l, 4, 16, 4, 16); },
       "parallel: mp*dp*pp must be <= the cluster's GPUs (4 nodes x 8)"},
      {"too many ranks with pipeline stages", [](LayerConfig& l) { SetLayout(l, 4, 8, 4, 8, 2); },
       "parallel: mp*dp*pp must be <= the cluster's GPUs"},
      {"mp not tiling gpus_per_node",
       [](LayerConfig& l) {
         l.hidden_dim = 3072;
         SetLayout(l, 3, 2, 3, 2);
       },
       "parallel.mp: must divide gpus_per_node (8) or be a multiple of it"},
      {"mp 12 on 8-GPU nodes",
       [](LayerConfig& l) {
         l.hidden_dim = 3072;
         SetLayout(l, 12, 1, 12, 1);
       },
       "parallel.mp: must divide gpus_per_node (8) or be a multiple of it"},
      {"esp not tiling gpus_per_node",
       [](LayerConfig& l) {
         l.hidden_dim = 3072;
         SetLayout(l, 24, 2, 12, 1);
       },
       "parallel.esp: must divide gpus_per_node (8) or be a multiple of it"},
      {"esp not dividing mp",
       [](LayerConfig& l) { SetLayout(l, 2, 4, 4, 8); },
       "parallel.esp: must divide mp: each ESP group sits inside an MP group"},
      {"stage not tiling gpus_per_node",
       [](LayerConfig& l) {
         l.num_experts = 24;
         SetLayout(l, 2, 12, 1, 6);
       },
       "parallel: mp*dp must divide gpus_per_node (8) or be a multiple of it"},
      {"s1 with esp != mp",
       [](LayerConfig& l) { SetLayout(l, 2, 8, 1, 4); },
       "parallel.esp: schedules s1 and s2 need esp == mp",
       Stage::kSchedule,
       {Schedule::kS1}},
      {"s2 with esp != mp",
       [](LayerConfig& l) { SetLayout(l, 4, 8, 2, 4); },
       "parallel.esp: schedules s1 and s2 need esp == mp",
       Stage::kSchedule,
       {Schedule::kS2}},
      {"s1 with tokens not divisible by mp",
       [](LayerConfig& l) {
         l.batch_size = 1;
         l.seq_len = 6;
       },
       "batch_size: s1 splits the batch_size*seq_len tokens over the mp ranks",
       Stage::kSchedule,
       {Schedule::kS1}},
      {"all schedules (empty list) for a default-only layout",
       [](LayerConfig& l) { SetLayout(l, 2, 8, 1, 4); },
       "parallel.esp: schedules s1 and s2 need esp == mp",
       Stage::kPlan,
       {}},
      {"duplicate schedule in the list",
       [](LayerConfig&) {},
       "schedules: each schedule may be listed once",
       Stage::kPlan,
       {Schedule::kDefault, Schedule::kS1, Schedule::kDefault}},
      {"unknown schedule",
       [](LayerConfig&) {},
       "schedules: unknown schedule",
       Stage::kPlan,
       {Schedule::kS2, static_cast<Schedule>(7)}},
  };
}

class BadLayerTest : public ::testing::TestWithParam<BadCase> {};

void ExpectFieldError(const absl::Status& s, const BadCase& c, bool need_got) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const std::string msg = Message(s);
  EXPECT_EQ(msg.rfind(c.prefix, 0), 0u) << "message: " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  if (need_got) {
    EXPECT_NE(msg.find(" (got "), std::string::npos) << msg;
  }
}

TEST_P(BadLayerTest, IsRejectedNamingTheField) {
  const BadCase& c = GetParam();
  LayerConfig l = BaseLayer();
  c.mutate(l);
  LayerPlanner planner(Model());
  LayerPlan plan;
  switch (c.stage) {
    case Stage::kLayer: {
      const absl::Status s = ValidateLayer(l, kCluster);
      ExpectFieldError(s, c, /*need_got=*/true);
      // The planner validates first and returns the same error.
      EXPECT_EQ(planner.Plan(l, {}, &plan), s);
      const Schedule def[] = {Schedule::kDefault};
      EXPECT_EQ(planner.Plan(l, def, &plan), s);
      break;
    }
    case Stage::kSchedule: {
      ASSERT_TRUE(ValidateLayer(l, kCluster).ok()) << ValidateLayer(l, kCluster);
      for (Schedule sched : c.schedules) {
        const absl::Status s = ValidateForSchedule(l, sched);
        ExpectFieldError(s, c, /*need_got=*/true);
        const Schedule one[] = {sched};
        EXPECT_EQ(planner.Plan(l, one, &plan), s);
        // The builder refuses the layout too.
        LayerContext ctx;
        ctx.layer = &l;
        ctx.cost = &Model();
        ctx.topo = MakeTopology(l.parallel, kCluster);
        OpGraph g;
        EXPECT_EQ(BuildSchedule(sched, ctx, &g), s);
      }
      // The default schedule is always allowed.
      EXPECT_TRUE(ValidateForSchedule(l, Schedule::kDefault).ok());
      break;
    }
    case Stage::kPlan: {
      ASSERT_TRUE(ValidateLayer(l, kCluster).ok());
      ExpectFieldError(planner.Plan(l, c.schedules, &plan), c, /*need_got=*/false);
      break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, BadLayerTest, ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           std::string name;
                           for (char ch : info.param.label) {
                             name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           }
                           return name + "_" + std::to_string(info.index);
                         });

TEST(BadLayerTableTest, HasAtLeastTwentyCases) { EXPECT_GE(BadCases().size(), 20u); }

// ---------------------------------------------------------------------------
// Valid configs.

struct ValidCase {
  std::string label;
  std::function<void(LayerConfig&)> mutate;
  bool s1_s2;  // S1 and S2 allowed (esp == mp)
};

TEST(ValidLayerTest, PassAndPlan) {
  const std::vector<ValidCase> cases = {
      {"base", [](LayerConfig&) {}, true},
      {"mp=esp=8 ep=4", [](LayerConfig& l) { SetLayout(l, 8, 4, 8, 4); }, true},
      {"mp=esp=1 ep=16", [](LayerConfig& l) { SetLayout(l, 1, 16, 1, 16); }, true},
      {"mp=esp=16 across nodes", [](LayerConfig& l) { SetLayout(l, 16, 2, 16, 2); }, true},
      {"pipeline stages", [](LayerConfig& l) { SetLayout(l, 4, 4, 4, 4, 2); }, true},
      {"default only: esp != mp", [](LayerConfig& l) { SetLayout(l, 2, 8, 1, 4); }, false},
      {"single GPU", [](LayerConfig& l) { SetLayout(l, 1, 1, 1, 1); }, true},
      {"all 32 GPUs dp only",
       [](LayerConfig& l) {
         l.num_experts = 32;
         SetLayout(l, 1, 32, 1, 32);
       },
       true},
      {"boundaries",
       [](LayerConfig& l) {
         l.top_k = l.num_experts;
         l.capacity_factor = 1024.0;
         l.token_skew = 1024.0;
         l.bytes_per_element = 4;
       },
       true},
      {"fp8, skew 1.5, f 1.25",
       [](LayerConfig& l) {
         l.bytes_per_element = 1;
         l.token_skew = 1.5;
         l.capacity_factor = 1.25;
       },
       true},
      {"dropless, capacity_factor unset",
       [](LayerConfig& l) {
         l.dropless = true;
         l.capacity_factor = 0.0;
         l.token_skew = 3.0;
       },
       true},
  };
  for (const ValidCase& c : cases) {
    SCOPED_TRACE(c.label);
    LayerConfig l = BaseLayer();
    c.mutate(l);
    EXPECT_TRUE(ValidateLayer(l, kCluster).ok()) << ValidateLayer(l, kCluster);
    EXPECT_TRUE(ValidateForSchedule(l, Schedule::kDefault).ok());
    EXPECT_EQ(ValidateForSchedule(l, Schedule::kS1).ok(), c.s1_s2);
    EXPECT_EQ(ValidateForSchedule(l, Schedule::kS2).ok(), c.s1_s2);
    const Schedule def[] = {Schedule::kDefault};
    absl::StatusOr<LayerPlan> plan = c.s1_s2 ? PlanLayer(l, Model()) : PlanLayer(l, Model(), def);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // At mp = 1 S1 and S2 are the default's collectives: planned once.
    EXPECT_EQ(plan->candidates.size(), c.s1_s2 && l.parallel.mp > 1 ? 3u : 1u);
    if (l.parallel.mp == 1) {
      EXPECT_NE(plan->decision.summary.find("default is the only schedule at mp = 1"),
                std::string::npos)
          << plan->decision.summary;
      // Named with the default, the same; named alone, planned as asked.
      const Schedule all[] = {Schedule::kDefault, Schedule::kS1, Schedule::kS2};
      ASSERT_TRUE(PlanLayer(l, Model(), all).ok());
      EXPECT_EQ(PlanLayer(l, Model(), all)->candidates.size(), 1u);
      const Schedule s1[] = {Schedule::kS1};
      ASSERT_TRUE(PlanLayer(l, Model(), s1).ok());
      EXPECT_EQ(PlanLayer(l, Model(), s1)->candidates.front().schedule, Schedule::kS1);
    }
    for (const Candidate& cand : plan->candidates) {
      EXPECT_GT(cand.total_us(), 0.0);
      EXPECT_TRUE(std::isfinite(cand.total_us()));
    }
  }
}

TEST(ValidLayerTest, OtherClusterShapes) {
  LayerConfig l = BaseLayer();
  SetLayout(l, 4, 8, 4, 8);
  EXPECT_TRUE(ValidateLayer(l, ClusterShape{1, 32}).ok());
  EXPECT_TRUE(ValidateLayer(l, ClusterShape{8, 4}).ok());
  EXPECT_TRUE(ValidateLayer(l, ClusterShape{32, 1}).ok());
  // 3 GPUs per node: mp = 4 neither divides 3 nor is a multiple of it.
  const absl::Status s = ValidateLayer(l, ClusterShape{11, 3});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s).rfind("parallel.mp: must divide gpus_per_node (3)", 0), 0u) << s;
  // 31 GPUs: one too few.
  const absl::Status t = ValidateLayer(l, ClusterShape{1, 31});
  EXPECT_EQ(Message(t).rfind("parallel: mp*dp*pp must be <= the cluster's GPUs (1 nodes x 31)", 0),
            0u)
      << t;
}

// ---------------------------------------------------------------------------
// Capacity.

TEST(CapacityTest, ExactProductsDoNotRoundUp) {
  // 2 * 1.2 * 1000 / 8 is 300 exactly (in doubles too); the capacity is 300, not 301.
  EXPECT_EQ(Capacity(2, 1.2, 1000, 8), 300);
  // Products that come out just above an integer in doubles must not round up:
  EXPECT_EQ(Capacity(1, 1.1, 100, 1), 110);  // 1.1 * 100 = 110.00000000000001
  EXPECT_EQ(Capacity(2, 1.1, 100, 2), 110);  // 2.2 * 100 / 2 = 110.00000000000001
  EXPECT_EQ(Capacity(3, 0.1, 10, 1), 3);     // 0.30000000000000004 * 10
  EXPECT_EQ(Capacity(3, 0.7, 10, 1), 21);    // 20.999999999999996
  EXPECT_EQ(Capacity(1, 1.1, 10, 1), 11);
  EXPECT_EQ(Capacity(2, 1.0, 1024, 16), 128);
  EXPECT_EQ(Capacity(1, 1.0, 9, 3), 3);
  EXPECT_EQ(Capacity(4, 1.25, 64, 5), 64);
}

TEST(CapacityTest, NonIntegersRoundUp) {
  EXPECT_EQ(Capacity(1, 1.0, 10, 3), 4);       // 3.33
  EXPECT_EQ(Capacity(2, 1.25, 100, 8), 32);    // 31.25
  EXPECT_EQ(Capacity(2, 1.0, 1, 8), 1);        // 0.25
  EXPECT_EQ(Capacity(2, 1.0, 1001, 8), 251);   // 250.25
  EXPECT_EQ(Capacity(1, 1.0, 8193, 8192), 2);  // 1.000122
  EXPECT_EQ(Capacity(1, 1.2, 1001, 1), 1202);  // 1201.2
  EXPECT_EQ(Capacity(2, 1.2, 1001, 8), 301);   // 300.3
}

TEST(CapacityTest, DeriveUsesIt) {
  LayerConfig l = BaseLayer();
  l.top_k = 2;
  l.capacity_factor = 1.2;
  l.batch_size = 1;
  l.seq_len = 1000;
  l.num_experts = 8;
  l.model_dim = 64;
  l.bytes_per_element = 2;
  const DerivedShape d = Derive(l);
  EXPECT_EQ(d.tokens, 1000);
  EXPECT_EQ(d.capacity, 300);
  EXPECT_EQ(d.activation_bytes, 1000 * 64 * 2);
  EXPECT_EQ(d.dispatch_bytes, 8 * 300 * 64 * 2);
}

// Regression (a bug found while writing these tests, fixed in 095835c): Capacity()
// used to subtract a relative slack of 1e-12 before ceil, an absolute slack above 1 once
// k*f*S/E > 1e12, which ValidateLayer allows (f <= 1024, S <= 2^31). k = 1, f = 1024,
// S = 2^31, E = 1 is exactly 2^41 = 2199023255552 but came out as 2199023255550.
TEST(CapacityTest, LargeExactProductsAreNotRoundedDown) {
  LayerConfig l;
  l.batch_size = int64_t{1} << 24;
  l.seq_len = 128;  // S = 2^31
  l.model_dim = 1;
  l.hidden_dim = 1;
  l.num_experts = 1;
  l.top_k = 1;
  l.capacity_factor = 1024.0;
  l.bytes_per_element = 1;
  ASSERT_TRUE(ValidateLayer(l, ClusterShape{1, 1}).ok()) << ValidateLayer(l, ClusterShape{1, 1});
  EXPECT_EQ(Capacity(1, 1024.0, int64_t{1} << 31, 1), int64_t{1} << 41);
  EXPECT_EQ(Derive(l).capacity, int64_t{1} << 41);
}

// Regression, same cause: 1024 * 2^30 / 3 = 366503875925.33 must round up to
// 366503875926; the old slack of 0.37 swallowed the fraction and returned ...925.
TEST(CapacityTest, LargeNonIntegersStillRoundUp) {
  LayerConfig l;
  l.batch_size = int64_t{1} << 15;
  l.seq_len = int64_t{1} << 15;  // S = 2^30
  l.model_dim = 1;
  l.hidden_dim = 1;
  l.num_experts = 3;
  l.top_k = 1;
  l.capacity_factor = 1024.0;
  l.bytes_per_element = 1;
  ASSERT_TRUE(ValidateLayer(l, ClusterShape{1, 1}).ok()) << ValidateLayer(l, ClusterShape{1, 1});
  EXPECT_EQ(Capacity(1, 1024.0, int64_t{1} << 30, 3), int64_t{366503875926});
}

// Regression: the 6-decimal integer path once snapped any factor within 1e-9 of a
// 6-decimal value to it. f = 1 + 2^-30 is exactly representable and passes
// ValidateLayer; with k = 1, E = 1, S = 2^31, k*f*S/E = 2^31 + 2 exactly, so
// T = ceil(...) = 2147483650 (docs/notation.md), not 2147483648.
TEST(CapacityTest, FactorsCloseToSixDecimalsAreNotSnapped) {
  const double f = 1.0 + 1.0 / (1 << 30);
  LayerConfig l = BaseLayer();
  l.batch_size = int64_t{1} << 24;
  l.seq_len = 128;  // S = 2^31
  l.model_dim = 1;
  l.hidden_dim = 1;
  l.num_experts = 1;
  l.top_k = 1;
  l.capacity_factor = f;
  l.bytes_per_element = 1;
  SetLayout(l, 1, 1, 1, 1);
  ASSERT_TRUE(ValidateLayer(l, ClusterShape{1, 1}).ok()) << ValidateLayer(l, ClusterShape{1, 1});
  EXPECT_EQ(Capacity(1, f, int64_t{1} << 31, 1), int64_t{2147483650});
  // A 7-decimal factor far from any 6-decimal value takes the long-double path:
  // 1.0000001 * 10^7 = 10000001 slots (the double 1.0000001 is a hair above, 1e-16 rel.).
  EXPECT_EQ(Capacity(1, 1.0000001, 10000000, 1), 10000001);
}

// Regression (a bug found while writing these tests, fixed in 095835c by bounding the
// buffers in double before Derive): for accepted field values E*T can reach
// k*f*S <= 2^24 * 2^10 * 2^31 = 2^65, so forming D = E*T*M*b in int64 (types.cc Derive)
// overflowed and the wrapped, negative D passed the "<= 1 PiB" check: ValidateLayer
// returned OK. Here E = k = 2^24, f = 1024, S = 2^31, M = b = 1: D is about 2^65 B and
// must be rejected.
TEST(ValidateLayerTest, HugeDispatchBufferIsRejectedWithoutOverflow) {
  LayerConfig l;
  l.batch_size = int64_t{1} << 24;
  l.seq_len = 128;
  l.model_dim = 1;
  l.hidden_dim = 1;
  l.num_experts = int64_t{1} << 24;
  l.top_k = int64_t{1} << 24;
  l.capacity_factor = 1024.0;
  l.bytes_per_element = 1;
  const absl::Status s = ValidateLayer(l, ClusterShape{1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(Message(s).rfind("batch_size: the activation S*M*b and dispatch buffer", 0), 0u) << s;
}

TEST(ScheduleNamesTest, RoundTrip) {
  for (Schedule s : kAllSchedules) {
    Schedule parsed = Schedule::kDefault;
    ASSERT_TRUE(ParseSchedule(ScheduleName(s), &parsed));
    EXPECT_EQ(parsed, s);
  }
  EXPECT_EQ(ScheduleName(Schedule::kDefault), "default");
  EXPECT_EQ(ScheduleName(Schedule::kS1), "s1");
  EXPECT_EQ(ScheduleName(Schedule::kS2), "s2");
  Schedule out = Schedule::kS2;
  EXPECT_FALSE(ParseSchedule("S1", &out));
  EXPECT_FALSE(ParseSchedule("", &out));
  EXPECT_EQ(out, Schedule::kS2);
}

}  // namespace
}  // namespace moeplan::planner
