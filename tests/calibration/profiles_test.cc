#include "moeplan/calibration/profiles.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "moeplan/proto/json.h"

namespace moeplan::calibration {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(BuiltinProfiles, TheSpecAndMeasuredProfilesAndTheDefault) {
  const std::vector<std::string> names = BuiltinProfileNames();
  EXPECT_EQ(names,
            (std::vector<std::string>{"a100-8x8", "a100-8x8-hdr", "b200-8x8", "cpu-testbed-1x4",
                                      "cpu-testbed-2x2", "gb200-nvl72", "h100-8x8", "h200-8x8",
                                      "h800-8x8", "rtx2080ti-8x4", "v100-8x8"}));
  EXPECT_TRUE(BuiltinProfile(kDefaultProfileName).ok());
}

TEST(BuiltinProfiles, EachIsAValidCitedSpecOrMeasuredProfile) {
  for (const std::string& name : BuiltinProfileNames()) {
    SCOPED_TRACE(name);
    absl::StatusOr<LoadedProfile> p = LoadProfile(name);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->message.name(), name);
    EXPECT_FALSE(p->message.comment().empty());
    EXPECT_GE(p->message.version(), 1u);
    if (name.rfind("cpu-testbed-", 0) == 0) {
      // Fitted by moeplan calibrate from moeplan-profile samples.
      EXPECT_EQ(p->message.source(), v1::PROFILE_SOURCE_MEASURED);
      EXPECT_THAT(p->message.comment(), ::testing::HasSubstr("moeplan-profile"));
      EXPECT_FALSE(p->message.collectives().empty());
    } else {
      EXPECT_EQ(p->message.source(), v1::PROFILE_SOURCE_SPEC);
      EXPECT_GE(p->message.citations_size(), 2);
    }
    // The inter link is slower than the intra link on every one of these
    // clusters (the one-node testbed copies intra to inter).
    if (name != "cpu-testbed-1x4") {
      EXPECT_GT(p->profile.inter.beta_us_per_byte, p->profile.intra.beta_us_per_byte);
    }
  }
}

TEST(BuiltinProfiles, NumbersFollowTheCitedSpecs) {
  // a100-8x8: 4 x 100 Gb/s NICs shared by 8 GPUs = 6.25 GB/s per GPU; NVLink 3 at
  // 300 GB/s per direction; 312 TFLOPS bf16 dense.
  LoadedProfile a = *LoadProfile("a100-8x8");
  EXPECT_EQ(a.profile.shape.nodes, 8);
  EXPECT_EQ(a.profile.shape.gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(a.profile.inter.beta_us_per_byte, 1.0 / 6.25e3);
  EXPECT_DOUBLE_EQ(a.profile.intra.beta_us_per_byte, 1.0 / 300e3);
  EXPECT_DOUBLE_EQ(a.profile.gemm.peak_tflops, 312.0);
  // rtx2080ti-8x4: PCIe 3.0 x16 15.75 GB/s, one 100 Gb/s NIC per 4 GPUs.
  LoadedProfile r = *LoadProfile("rtx2080ti-8x4");
  EXPECT_EQ(r.profile.shape.gpus_per_node, 4);
  EXPECT_DOUBLE_EQ(r.profile.intra.beta_us_per_byte, 1.0 / 15.75e3);
  EXPECT_DOUBLE_EQ(r.profile.inter.beta_us_per_byte, 1.0 / 3.125e3);
  // h200-8x8: one 400 Gb/s NIC per GPU = 50 GB/s; NVLink 4 at 450 GB/s per direction.
  LoadedProfile h = *LoadProfile("h200-8x8");
  EXPECT_DOUBLE_EQ(h.profile.inter.beta_us_per_byte, 1.0 / 50e3);
  EXPECT_DOUBLE_EQ(h.profile.intra.beta_us_per_byte, 1.0 / 450e3);
  EXPECT_DOUBLE_EQ(h.profile.gemm.peak_tflops, 989.0);
  // v100-8x8: NVLink 2, 6 links x 25 GB/s = 150 GB/s per direction; one 100 Gb/s NIC
  // per 8 GPUs = 1.5625 GB/s; 125 TFLOPS fp16 tensor; 80 % of 900 GB/s HBM2.
  LoadedProfile v = *LoadProfile("v100-8x8");
  EXPECT_EQ(v.profile.shape.nodes, 8);
  EXPECT_EQ(v.profile.shape.gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(v.profile.intra.beta_us_per_byte, 1.0 / 150e3);
  EXPECT_DOUBLE_EQ(v.profile.inter.beta_us_per_byte, 1.0 / 1.5625e3);
  EXPECT_DOUBLE_EQ(v.profile.gemm.peak_tflops, 125.0);
  EXPECT_DOUBLE_EQ(v.message.gpu_memory_gib(), 32.0);
  EXPECT_DOUBLE_EQ(v.message.memory().bandwidth_gbytes_per_s(), 720.0);
}

// The Hopper and Blackwell profiles: dense BF16 and FP8 peaks (the datasheets'
// with-sparsity figures halved), NVLink per direction, one 400 Gb/s NIC per GPU.
TEST(BuiltinProfiles, HopperAndBlackwellNumbersFollowTheCitedSpecs) {
  struct Want {
    const char* name;
    int nodes, gpus_per_node;
    double bf16, fp8, intra_gbs, inter_gbs, memory_gib, hbm_gbs;
  };
  for (const Want& w : {Want{"h100-8x8", 8, 8, 989.5, 1979, 450, 50, 80, 3350},
                        Want{"h800-8x8", 8, 8, 989.5, 1979, 200, 50, 80, 3350},
                        Want{"h200-8x8", 8, 8, 989, 1979, 450, 50, 141, 4800},
                        Want{"b200-8x8", 8, 8, 2250, 4500, 900, 50, 180, 8000},
                        Want{"gb200-nvl72", 16, 64, 2500, 5000, 900, 50, 186, 8000}}) {
    SCOPED_TRACE(w.name);
    absl::StatusOr<LoadedProfile> p = LoadProfile(w.name);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->profile.shape.nodes, w.nodes);
    EXPECT_EQ(p->profile.shape.gpus_per_node, w.gpus_per_node);
    EXPECT_DOUBLE_EQ(p->profile.gemm.peak_tflops, w.bf16);
    EXPECT_TRUE(p->message.gemm().has_fp8_peak_tflops());
    EXPECT_DOUBLE_EQ(p->profile.gemm.fp8_peak_tflops, w.fp8);
    EXPECT_DOUBLE_EQ(p->profile.intra.beta_us_per_byte, 1.0 / (w.intra_gbs * 1e3));
    EXPECT_DOUBLE_EQ(p->profile.inter.beta_us_per_byte, 1.0 / (w.inter_gbs * 1e3));
    EXPECT_DOUBLE_EQ(p->profile.gpu_memory_gib, w.memory_gib);
    EXPECT_DOUBLE_EQ(p->message.memory().bandwidth_gbytes_per_s(), 0.8 * w.hbm_gbs);
  }
  // GPUs without FP8 tensor cores leave the field unset.
  for (const char* name : {"a100-8x8", "rtx2080ti-8x4", "v100-8x8"}) {
    SCOPED_TRACE(name);
    LoadedProfile p = *LoadProfile(name);
    EXPECT_FALSE(p.message.gemm().has_fp8_peak_tflops());
    EXPECT_EQ(p.profile.gemm.fp8_peak_tflops, 0.0);
  }
}

TEST(ResolveProfile, UnknownNameListsTheBuiltins) {
  absl::StatusOr<v1::ClusterProfile> p = ResolveProfile("dgx-9000");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(
      Msg(p.status()),
      "cluster: 'dgx-9000' is neither a built-in profile (a100-8x8, a100-8x8-hdr, "
      "b200-8x8, cpu-testbed-1x4, cpu-testbed-2x2, gb200-nvl72, h100-8x8, h200-8x8, h800-8x8, "
      "rtx2080ti-8x4, v100-8x8) nor an existing file");
}

TEST(ResolveProfile, ReadsAndValidatesFiles) {
  char tmpl[] = "/tmp/moeplan_profile_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  v1::ClusterProfile p = *BuiltinProfile("h200-8x8");
  p.set_name("my-cluster");
  p.set_nodes(2);
  const std::string good = dir + "/good.json";
  ASSERT_TRUE(proto::WriteFileAtomic(good, *proto::ToJson(p)).ok());
  absl::StatusOr<LoadedProfile> loaded = LoadProfile(good);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->profile.name, "my-cluster");
  EXPECT_EQ(loaded->profile.shape.nodes, 2);

  p.mutable_gemm()->set_fp8_peak_tflops(500);
  const std::string slow_fp8 = dir + "/slow_fp8.json";
  ASSERT_TRUE(proto::WriteFileAtomic(slow_fp8, *proto::ToJson(p)).ok());
  EXPECT_EQ(
      Msg(LoadProfile(slow_fp8).status()),
      slow_fp8 + ": gemm.fp8_peak_tflops: must be >= gemm.peak_tflops when set (got 500 < 989)");
  p.mutable_gemm()->set_fp8_peak_tflops(0);  // set to 0 is not unset
  const std::string zero_fp8 = dir + "/zero_fp8.json";
  ASSERT_TRUE(proto::WriteFileAtomic(zero_fp8, *proto::ToJson(p)).ok());
  EXPECT_EQ(Msg(LoadProfile(zero_fp8).status()),
            zero_fp8 +
                ": gemm.fp8_peak_tflops: must be > 0 and <= 1e6 when set (leave it unset "
                "for no FP8 peak) (got 0)");
  p.mutable_gemm()->clear_fp8_peak_tflops();

  p.mutable_gemm()->set_peak_tflops(0);
  const std::string bad = dir + "/bad.json";
  ASSERT_TRUE(proto::WriteFileAtomic(bad, *proto::ToJson(p)).ok());
  EXPECT_EQ(Msg(LoadProfile(bad).status()),
            bad + ": gemm.peak_tflops: must be > 0 and <= 1e6 (got 0)");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeplan::calibration
