#include "moeplan/proto/json.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "moeplan/v1/layer.pb.h"
#include "moeplan/v1/profile.pb.h"

namespace moeplan::proto {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(ParseJson, ReadsSnakeAndCamelCaseNames) {
  v1::LayerConfig l;
  ASSERT_TRUE(ParseJson(R"({"batch_size": 8, "seqLen": 16, "parallel": {"mp": 2}})", &l).ok());
  EXPECT_EQ(l.batch_size(), 8);
  EXPECT_EQ(l.seq_len(), 16);
  EXPECT_EQ(l.parallel().mp(), 2);
  EXPECT_FALSE(l.has_bytes_per_element());
}

TEST(ParseJson, RejectsUnknownTopLevelFieldNamingIt) {
  v1::LayerConfig l;
  absl::Status s = ParseJson(R"({"batch_size": 8, "bogus": 1})", &l);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(s), "bogus: unknown field (not in moeplan.v1.LayerConfig)");
  EXPECT_EQ(l.batch_size(), 0) << "a failed parse leaves the message cleared";
}

TEST(ParseJson, RejectsUnknownNestedFieldWithItsPath) {
  v1::LayerConfig l;
  absl::Status s = ParseJson(R"({"parallel": {"mp": 2, "tp": 4}})", &l);
  EXPECT_EQ(Msg(s), "parallel.tp: unknown field (not in moeplan.v1.LayerConfig)");
}

TEST(ParseJson, RejectsOutOfRangeAndWrongTypes) {
  v1::LayerConfig l;
  EXPECT_EQ(Msg(ParseJson(R"({"batch_size": 99999999999})", &l)),
            "batch_size: invalid value 99999999999 for type TYPE_INT32");
  EXPECT_EQ(Msg(ParseJson(R"({"parallel": {"ep": "x"}})", &l)),
            "parallel.ep: invalid value \"x\" for type TYPE_INT32");
  EXPECT_EQ(Msg(ParseJson(R"({"top_k": 1.5})", &l)),
            "top_k: invalid value 1.5 for type TYPE_INT32");
  v1::ClusterProfile p;
  absl::Status s = ParseJson(R"({"source": "PROFILE_SOURCE_GUESSED"})", &p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(s).find("source"), std::string::npos) << Msg(s);
}

TEST(ParseJson, SyntaxErrorsAreOneLine) {
  v1::LayerConfig l;
  absl::Status s = ParseJson("{\"batch_size\": 8", &l);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(s).rfind("invalid JSON: ", 0), 0u) << Msg(s);
  EXPECT_EQ(Msg(s).find('\n'), std::string::npos);
}

TEST(ToJson, RoundTrips) {
  v1::LayerConfig l;
  l.set_name("x");
  l.set_batch_size(3);
  l.set_capacity_factor(1.25);
  l.mutable_parallel()->set_dp(7);
  absl::StatusOr<std::string> json = ToJson(l);
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"batch_size\": 3"), std::string::npos) << *json;
  v1::LayerConfig back;
  ASSERT_TRUE(ParseJson(*json, &back).ok());
  EXPECT_EQ(back.SerializeAsString(), l.SerializeAsString());
  EXPECT_TRUE(back.parallel().has_dp());
}

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moeplan_json_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  size_t Entries() const {
    size_t n = 0;
    for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir_)) ++n;
    return n;
  }
  std::string dir_;
};

TEST_F(FilesTest, WriteFileAtomicCreatesAndReplaces) {
  const std::string path = dir_ + "/out.txt";
  ASSERT_TRUE(WriteFileAtomic(path, "first").ok());
  EXPECT_EQ(*ReadFile(path), "first");
  ASSERT_TRUE(WriteFileAtomic(path, "second, longer").ok());
  EXPECT_EQ(*ReadFile(path), "second, longer");
  EXPECT_EQ(Entries(), 1u) << "no temporary file is left behind";
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_NE(st.st_mode & 0044, 0u) << "not left at mkstemp's 0600";
}

TEST_F(FilesTest, WriteFileAtomicFailsCleanlyInAMissingDirectory) {
  const std::string path = dir_ + "/missing/out.txt";
  absl::Status s = WriteFileAtomic(path, "x");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(Msg(s).find(path), std::string::npos) << Msg(s);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(FilesTest, ReadJsonFileNamesThePath) {
  const std::string path = dir_ + "/layer.json";
  v1::LayerConfig l;
  absl::Status missing = ReadJsonFile(path, &l);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Msg(missing).rfind(path + ": ", 0), 0u) << Msg(missing);
  ASSERT_TRUE(WriteFileAtomic(path, R"({"seq_len": 4, "nope": 1})").ok());
  absl::Status bad = ReadJsonFile(path, &l);
  EXPECT_EQ(Msg(bad), path + ": nope: unknown field (not in moeplan.v1.LayerConfig)");
}

}  // namespace
}  // namespace moeplan::proto
