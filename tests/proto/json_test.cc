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
  EXPECT_EQ(Msg(s), "column 17: invalid JSON: missing a comma or '}' after an object member");
  EXPECT_EQ(Msg(s).find('\n'), std::string::npos);
}

// One strict syntax pass runs before protobuf's parser, which kept the last of
// a repeated key, took trailing commas and let raw control characters through
// (issue 35). Errors name the line (left out for one-line text, such as a
// JSON Lines line) and column, then the field.
TEST(StrictJson, RefusesARepeatedKeyAtAnyDepth) {
  v1::LayerConfig l;
  EXPECT_EQ(Msg(ParseJson("{\"batch_size\": 8,\n  \"batch_size\": 16}", &l)),
            "line 2, column 3: batch_size: duplicate key (a key may appear once per object)");
  EXPECT_EQ(l.batch_size(), 0) << "a failed parse leaves the message cleared";
  EXPECT_EQ(Msg(ParseJson(R"({"parallel": {"mp": 2, "mp": 4}})", &l)),
            "column 24: parallel.mp: duplicate key (a key may appear once per object)");
  EXPECT_EQ(Msg(ParseJson("{\"parallel\": {\"mp\": 2},\n\"parallel\": {\"ep\": 4}}", &l)),
            "line 2, column 1: parallel: duplicate key (a key may appear once per object)");
  // Protobuf reads both spellings of a field: together they are one key twice.
  EXPECT_EQ(Msg(ParseJson(R"({"seq_len": 4, "seqLen": 8})", &l)),
            "column 16: seqLen: duplicate key (seq_len and seqLen are one field; a key may "
            "appear once per object)");
  v1::LayerGrid g;
  EXPECT_EQ(Msg(ParseJson(R"({"parallel": [{"mp": 1}, {"mp": 2, "ep": 1, "ep": 2}]})", &g)),
            "column 45: parallel[1].ep: duplicate key (a key may appear once per object)");
  // The same key in different objects is no repetition.
  EXPECT_TRUE(ParseJson(R"({"parallel": [{"mp": 1}, {"mp": 2}], "name": "mp"})", &g).ok());
}

TEST(StrictJson, RefusesTrailingCommas) {
  v1::LayerConfig l;
  EXPECT_EQ(Msg(ParseJson("{\"batch_size\": 8,\n}\n", &l)),
            "line 1, column 17: trailing comma before '}' (JSON allows none after the last "
            "member)");
  v1::LayerGrid g;
  EXPECT_EQ(Msg(ParseJson(R"({"batch_size": [1, 2, ]})", &g)),
            "column 21: batch_size: trailing comma before ']' (JSON allows none after the last "
            "element)");
}

TEST(StrictJson, RefusesRawControlCharactersInStrings) {
  v1::LayerConfig l;
  EXPECT_EQ(Msg(ParseJson("{\"batch_size\": 8,\n \"name\": \"a\x1b[31mred\"}", &l)),
            "line 2, column 12: name: raw control character U+001B in a string (write it as "
            "\\u001b)");
  EXPECT_EQ(Msg(ParseJson("{\"name\": \"\x07\"}", &l)),
            "column 11: name: raw control character U+0007 in a string (write it as \\u0007)");
  EXPECT_EQ(Msg(ParseJson(std::string_view("{\"name\": \"a\0b\"}", 15), &l)),
            "column 12: name: raw control character U+0000 in a string (write it as \\u0000)");
  EXPECT_EQ(Msg(ParseJson("{\"name\": \"a\tb\"}", &l)),
            "column 12: name: raw control character U+0009 in a string (write it as \\t)");
  EXPECT_EQ(Msg(ParseJson("{\"name\": \"a\nb\"}", &l)),
            "line 1, column 12: name: line break in a string (close the string, or write it as "
            "\\n)");
  // A NUL after the document is no end of it.
  EXPECT_EQ(Msg(ParseJson(std::string_view("{\"top_k\": 1}\0{", 14), &l)),
            "column 13: raw control character U+0000 outside a string");
  // Escaped, they are JSON, but no string field may hold them (CheckText): they
  // would reach a terminal all the same.
  EXPECT_EQ(Msg(ParseJson(R"({"name": "a\u001bb"})", &l)),
            "name: must not contain control characters (got 'a\\x1bb')");
  EXPECT_EQ(l.ByteSizeLong(), 0u);
}

TEST(StrictJson, RefusesWhatJsonIsNot) {
  v1::LayerConfig l;
  for (const char* bad : {R"({"top_k": 1} // two)", R"({/* c */ "top_k": 1})", R"({'top_k': 1})",
                          R"({top_k: 1})", R"({"capacity_factor": NaN})", R"({"top_k": 01})",
                          R"({"top_k": 1} {"top_k": 2})", "", "{\"name\": \"\xff\"}"}) {
    absl::Status s = ParseJson(bad, &l);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(Msg(s).rfind("column ", 0), 0u) << bad << ": " << Msg(s);
  }
  EXPECT_EQ(Msg(ParseJson("{\"top_k\": 1 /* one */}", &l)),
            "column 13: invalid JSON: a comment (JSON has none)");
  EXPECT_EQ(Msg(ParseJson("{'top_k': 1}", &l)),
            "column 2: invalid JSON: a single quote (JSON quotes with \")");
  std::string deep(200, '[');
  EXPECT_EQ(Msg(ParseJson("{\"name\": " + deep, &l)),
            "column 109: nested deeper than 100 arrays and objects");
}

// What protobuf's parser says about a value is bounded, escaped and one line.
TEST(StrictJson, ErrorsEchoABoundedPrefixOfAValue) {
  v1::LayerConfig l;
  const std::string big(100 * 1024, 'x');
  const std::string unknown = Msg(ParseJson("{\"" + big + "\": 1}", &l));
  EXPECT_LT(unknown.size(), 300u) << unknown;
  EXPECT_NE(unknown.find("unknown field (not in moeplan.v1.LayerConfig)"), std::string::npos);
  const std::string value = Msg(ParseJson("{\"batch_size\": \"" + big + "\"}", &l));
  EXPECT_LT(value.size(), 300u) << value;
  EXPECT_EQ(value.rfind("batch_size: invalid value", 0), 0u) << value;
  const std::string twice = Msg(ParseJson("{\"" + big + "\": 1, \"" + big + "\": 2}", &l));
  EXPECT_LT(twice.size(), 300u) << twice;
  const std::string esc = Msg(ParseJson("{\"batch_size\": \"\\u001b[31m\"}", &l));
  EXPECT_EQ(esc.find('\x1b'), std::string::npos) << esc;
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
