// The profile store on disk: checksummed files, corrupt files reported and
// skipped (never used), torn measurement lines repaired, stale temporaries removed.
#include <gtest/gtest.h>

#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/proto/json.h"
#include "moeplan/server/profile_store.h"

namespace moeplan::server {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(ProfileFile, EncodeDecodeRoundTripAndDetectsDamage) {
  const std::string json = R"({"name": "x"})";
  const std::string file = EncodeProfileFile(json);
  EXPECT_EQ(file.rfind("moeplan-profile 1 crc32=", 0), 0u);
  EXPECT_EQ(*DecodeProfileFile(file), json);
  std::string flipped = file;
  flipped[flipped.size() - 3] ^= 0x20;
  EXPECT_EQ(DecodeProfileFile(flipped).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Msg(DecodeProfileFile(flipped).status()).rfind("checksum mismatch", 0), 0u);
  EXPECT_EQ(Msg(DecodeProfileFile(file.substr(0, file.size() - 1)).status()).rfind("truncated", 0),
            0u);
  EXPECT_EQ(Msg(DecodeProfileFile("{}").status()).rfind("not a moeplan profile file", 0), 0u);
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moeplan_store_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<ProfileStore> Open(ProfileStore::OpenReport* report) {
    absl::StatusOr<std::unique_ptr<ProfileStore>> s = ProfileStore::Open(dir_, report);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  v1::ClusterProfile Profile(const std::string& name, uint32_t version) {
    v1::ClusterProfile p = *calibration::BuiltinProfile("a100-8x8");
    p.set_name(name);
    p.set_version(version);
    return p;
  }
  void Write(const std::string& rel, const std::string& contents) {
    std::ofstream(dir_ + "/" + rel, std::ios::binary | std::ios::trunc) << contents;
  }
  std::string dir_;
};

TEST_F(StoreTest, CorruptFilesAreReportedAndSkippedOthersLoad) {
  ProfileStore::OpenReport report;
  {
    auto store = Open(&report);
    for (const char* n : {"good", "flipped", "truncated", "renamed"}) {
      ASSERT_TRUE(store->Put(Profile(n, 1)).ok()) << n;
    }
  }
  std::string flipped = *proto::ReadFile(dir_ + "/profiles/flipped.profile");
  flipped[flipped.size() / 2] ^= 0x01;
  Write("profiles/flipped.profile", flipped);
  std::string truncated = *proto::ReadFile(dir_ + "/profiles/truncated.profile");
  Write("profiles/truncated.profile", truncated.substr(0, truncated.size() / 2));
  // A valid file under the wrong name is not silently served under it.
  std::filesystem::rename(dir_ + "/profiles/renamed.profile", dir_ + "/profiles/other.profile");
  Write("profiles/garbage.profile", "hello");
  Write("profiles/good.profile.tmp.AbC123", "half a write");

  ProfileStore::OpenReport again;
  auto store = Open(&again);
  EXPECT_EQ(again.loaded, std::vector<std::string>{"good"});
  ASSERT_EQ(again.skipped.size(), 5u);
  auto has = [&](const std::string& what) {
    for (const std::string& s : again.skipped) {
      if (s.find(what) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("flipped.profile: checksum mismatch"));
  EXPECT_TRUE(has("truncated.profile: truncated or extended"));
  EXPECT_TRUE(has("other.profile: holds profile 'renamed'"));
  EXPECT_TRUE(has("garbage.profile: not a moeplan profile file"));
  EXPECT_TRUE(has("good.profile.tmp.AbC123: unacknowledged temporary file"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/profiles/good.profile.tmp.AbC123"));
  EXPECT_NE(store->Get("good"), nullptr);
  EXPECT_EQ(store->Get("flipped"), nullptr);
  EXPECT_EQ(store->Get("renamed"), nullptr);
  EXPECT_EQ(store->Get("other"), nullptr);
  EXPECT_NE(store->Get("a100-8x8"), nullptr) << "built-ins are always there";
}

TEST_F(StoreTest, TornMeasurementLineIsCutAndCountsResume) {
  ProfileStore::OpenReport report;
  {
    auto store = Open(&report);
    EXPECT_EQ(*store->AppendMeasurement("a100-8x8", "{\"a\":1}"), 1u);
    EXPECT_EQ(*store->AppendMeasurement("a100-8x8", "{\"a\":2}"), 2u);
  }
  {
    std::ofstream(dir_ + "/measurements/a100-8x8.jsonl", std::ios::app) << "{\"a\":3";  // torn
  }
  ProfileStore::OpenReport again;
  auto store = Open(&again);
  ASSERT_EQ(again.skipped.size(), 1u);
  EXPECT_NE(again.skipped[0].find("dropped a torn last line of 6 bytes"), std::string::npos);
  EXPECT_EQ(*store->AppendMeasurement("a100-8x8", "{\"a\":4}"), 3u);
  EXPECT_EQ(*proto::ReadFile(dir_ + "/measurements/a100-8x8.jsonl"),
            "{\"a\":1}\n{\"a\":2}\n{\"a\":4}\n");
}

// A refit reads a window of the log: the newest lines, oldest first, and
// how many the log holds in all.
TEST_F(StoreTest, ReadMeasurementsReturnsTheNewestLinesAndTheTotal) {
  ProfileStore::OpenReport report;
  auto store = Open(&report);
  absl::StatusOr<ProfileStore::Measurements> none = store->ReadMeasurements("lab", 2);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->lines.empty());
  EXPECT_EQ(none->total, 0u);
  for (int i = 1; i <= 5; ++i) ASSERT_TRUE(store->AppendMeasurement("lab", Cat("{\"a\":", i, "}")).ok());
  absl::StatusOr<ProfileStore::Measurements> two = store->ReadMeasurements("lab", 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->lines, (std::vector<std::string>{"{\"a\":4}", "{\"a\":5}"}));
  EXPECT_EQ(two->total, 5u);
  absl::StatusOr<ProfileStore::Measurements> all = store->ReadMeasurements("lab", 100);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->lines.size(), 5u);
  EXPECT_EQ(all->lines.front(), "{\"a\":1}");
  EXPECT_EQ(all->total, 5u);
  absl::StatusOr<ProfileStore::Measurements> count = store->ReadMeasurements("lab", 0);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_TRUE(count->lines.empty());
  EXPECT_EQ(count->total, 5u) << "counted, not kept";
}

TEST_F(StoreTest, PutIsDurableAndVersioned) {
  ProfileStore::OpenReport report;
  auto store = Open(&report);
  ASSERT_TRUE(store->Put(Profile("lab", 3)).ok());
  EXPECT_EQ(store->Put(Profile("lab", 2)).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::ClusterProfile changed = Profile("lab", 3);
  changed.set_comment("other numbers, same version");
  EXPECT_EQ(store->Put(changed).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store->Put(Profile("lab", 3)).ok()) << "identical retry";
  EXPECT_EQ(Msg(store->Put(Profile(".hidden", 1)).status()).rfind("name: must start with", 0), 0u);
  ProfileStore::OpenReport again;
  auto reopened = Open(&again);
  EXPECT_EQ(again.loaded, std::vector<std::string>{"lab"});
  EXPECT_TRUE(again.skipped.empty());
  EXPECT_EQ(reopened->Get("lab")->message.version(), 3u);
}

// A full disk during a put or an append: a clear error naming the file, the
// store serving what it had, nothing half-written left behind, and the data
// directory loading cleanly afterwards. The disk is a 256 KiB tmpfs (this
// needs the right to mount, which CI's containers have).
class FullDiskTest : public StoreTest {
 protected:
  void SetUp() override {
    StoreTest::SetUp();
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=256k") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                   << "): the full-disk test needs CAP_SYS_ADMIN";
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount(dir_.c_str());
    StoreTest::TearDown();
  }
  // Fills the file system up to its last bytes.
  void Fill() {
    std::ofstream f(Cat(dir_, "/filler", fills_++), std::ios::binary);
    f.rdbuf()->pubsetbuf(nullptr, 0);  // unbuffered: stop at the first byte that fails
    while (f.put('x')) {
    }
  }
  int fills_ = 0;
  bool mounted_ = false;
};

TEST_F(FullDiskTest, PutAndAppendFailCleanlyAndTheStoreStaysLoadable) {
  ProfileStore::OpenReport report;
  auto store = Open(&report);
  ASSERT_TRUE(store->Put(Profile("lab", 1)).ok());
  ASSERT_TRUE(store->AppendMeasurement("lab", R"({"total_us": 1})").ok());
  Fill();
  absl::StatusOr<std::shared_ptr<const ProfileEntry>> put = store->Put(Profile("lab", 2));
  ASSERT_EQ(put.status().code(), absl::StatusCode::kInternal) << put.status();
  EXPECT_NE(Msg(put.status()).find("No space left on device"), std::string::npos) << put.status();
  EXPECT_NE(Msg(put.status()).find("lab.profile"), std::string::npos) << put.status();
  EXPECT_EQ(store->Get("lab")->message.version(), 1u) << "the acknowledged version is served";
  Fill();  // the failed put gave its temporary file's blocks back
  const std::string line(16384, 'm');  // past the log's last page
  absl::StatusOr<uint64_t> app = store->AppendMeasurement("lab", Cat(R"({"x": ")", line, R"("})"));
  EXPECT_FALSE(app.ok());
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos)
        << "a temporary file was left: " << e.path();
  }
  for (int i = 0; i < fills_; ++i) std::filesystem::remove(Cat(dir_, "/filler", i));
  ProfileStore::OpenReport again;
  auto reopened = Open(&again);
  EXPECT_TRUE(again.skipped.empty()) << (again.skipped.empty() ? "" : again.skipped.front());
  EXPECT_EQ(reopened->Get("lab")->message.version(), 1u);
  // The measurement log keeps its whole lines: one before the disk filled.
  absl::StatusOr<uint64_t> n = reopened->AppendMeasurement("lab", R"({"total_us": 2})");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2u);
  // And with space again, the put goes through.
  EXPECT_TRUE(reopened->Put(Profile("lab", 2)).ok());
}

}  // namespace
}  // namespace moeplan::server
