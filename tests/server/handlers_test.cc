// The service's handlers in-process (handlers.h), at the limits of one
// request's work (docs/service.md "Limits"): for each, the worst legal request
// answers and the first illegal one is refused naming the limit, with nothing
// cached.
#include "moeplan/server/handlers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "moeplan/base/strings.h"
#include "moeplan/proto/json.h"

namespace moeplan::server {
namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

class HandlersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moeplan_handlers_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ProfileStore::OpenReport report;
    auto s = ProfileStore::Open(dir_, &report);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<Handlers> Make(HandlerOptions o) {
    o.log_requests = false;
    return std::make_unique<Handlers>(store_.get(), &cache_, o);
  }
  static v1::PlanLayerRequest LayerRequest(bool timeline) {
    v1::PlanLayerRequest r;
    r.set_profile_name("a100-8x8");
    EXPECT_TRUE(
        proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/gpt2-moe-layer.json", r.mutable_layer())
            .ok());
    r.set_include_timeline(timeline);
    return r;
  }
  static v1::PlanModelRequest ModelRequest() {
    v1::PlanModelRequest r;
    r.set_profile_name("a100-8x8");
    EXPECT_TRUE(proto::ReadJsonFile(MOEPLAN_SOURCE_DIR "/examples/models/gpt3-medium-moe.json",
                                    r.mutable_model())
                    .ok());
    return r;
  }

  std::string dir_;
  std::unique_ptr<ProfileStore> store_;
  PlanCache cache_{100};
  NoDeadline call_;
};

TEST_F(HandlersTest, AResponseOverTheMessageLimitIsRefusedAndNotCached) {
  // The worst legal response is exactly the limit.
  size_t small = 0;
  {
    PlanCache scratch(0);
    HandlerOptions o;
    o.log_requests = false;
    Handlers probe(store_.get(), &scratch, o);
    v1::PlanLayerResponse r;
    ASSERT_TRUE(probe.PlanLayer(call_, LayerRequest(false), &r).ok());
    small = r.ByteSizeLong();
  }
  HandlerOptions o;
  o.max_response_bytes = small;
  auto h = Make(o);
  v1::PlanLayerResponse r;
  ASSERT_TRUE(h->PlanLayer(call_, LayerRequest(false), &r).ok());
  EXPECT_EQ(r.ByteSizeLong(), small);
  EXPECT_EQ(cache_.size(), 1u);
  const absl::Status s = h->PlanLayer(call_, LayerRequest(true), &r);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(Msg(s).rfind("response: ", 0), 0u) << s;
  EXPECT_NE(Msg(s).find(Cat("exceed the message limit of ", small, " bytes")),
            std::string::npos)
      << s;
  EXPECT_EQ(r.ByteSizeLong(), 0u) << "the refused response is cleared";
  EXPECT_EQ(cache_.size(), 1u) << "a response that cannot be sent is never cached";
}

TEST_F(HandlersTest, APlanPastItsTimeLimitStopsAndIsNotCached) {
  HandlerOptions o;
  o.max_plan_time = std::chrono::milliseconds(0);
  auto h = Make(o);
  v1::PlanModelRequest req = ModelRequest();
  v1::PlanModelResponse r;
  absl::Status s = h->PlanModel(call_, req, &r);
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(Msg(s).rfind("model plan: the plan ran past its time limit", 0), 0u) << s;
  req.mutable_search();  // the layout search checks between candidates
  s = h->PlanModel(call_, req, &r);
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(Msg(s).rfind("search: the plan ran past its time limit", 0), 0u) << s;
  EXPECT_EQ(cache_.size(), 0u);
  // Layer plans take microseconds and are not cut short.
  v1::PlanLayerResponse lr;
  EXPECT_TRUE(h->PlanLayer(call_, LayerRequest(false), &lr).ok());
}

// A call that, once its plan is counted as running, waits until released.
class GatedCall final : public CallContext {
 public:
  explicit GatedCall(const Handlers* h) : h_(*h) {}
  bool IsCancelled() const override { return false; }
  std::chrono::system_clock::time_point deadline() const override {
    if (h_.model_plans_running() > 0) {
      std::unique_lock lock(mu_);
      inside_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
    }
    return std::chrono::system_clock::time_point::max();
  }
  void WaitInside() {
    std::unique_lock lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(60), [&] { return inside_; }));
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  const Handlers& h_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool inside_ = false, released_ = false;
};

TEST_F(HandlersTest, UncachedModelPlansBeyondTheCapAreRefusedWhileCheapCallsAnswer) {
  HandlerOptions o;
  o.max_model_plans = 1;
  auto h = Make(o);
  GatedCall gate(h.get());
  absl::Status first;
  v1::PlanModelRequest req = ModelRequest();
  std::thread t([&] {
    v1::PlanModelResponse r;
    first = h->PlanModel(gate, req, &r);
  });
  gate.WaitInside();
  EXPECT_EQ(h->model_plans_running(), 1);
  v1::PlanModelRequest other = ModelRequest();
  other.mutable_options()->add_variants(v1::OVERLAP_VARIANT_NONE);
  v1::PlanModelResponse r;
  const absl::Status busy = h->PlanModel(call_, other, &r);
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted) << busy;
  EXPECT_EQ(Msg(busy).rfind("server busy: 1 uncached model plans are running", 0), 0u) << busy;
  // Layer plans, lists and gets do not wait for the expensive call.
  v1::PlanLayerResponse lr;
  EXPECT_TRUE(h->PlanLayer(call_, LayerRequest(false), &lr).ok());
  v1::ListProfilesResponse lp;
  EXPECT_TRUE(h->ListProfiles(call_, {}, &lp).ok());
  gate.Release();
  t.join();
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_EQ(h->model_plans_running(), 0);
  // Once it is done the refused request goes through, and the first is a hit.
  EXPECT_TRUE(h->PlanModel(call_, other, &r).ok());
  EXPECT_TRUE(h->PlanModel(call_, req, &r).ok());
  EXPECT_EQ(cache_.hits(), 1u);
}

TEST_F(HandlersTest, AnInlineProfileMayNotTakeAStoredProfilesName) {
  auto h = Make({});
  v1::PlanLayerRequest req = LayerRequest(false);
  v1::GetProfileRequest get;
  get.set_name("a100-8x8");
  v1::ClusterProfile builtin;
  ASSERT_TRUE(h->GetProfile(call_, get, &builtin).ok());
  *req.mutable_profile() = builtin;
  v1::PlanLayerResponse r;
  ASSERT_TRUE(h->PlanLayer(call_, req, &r).ok()) << "the identical profile is the same profile";
  req.mutable_profile()->set_gpu_memory_gib(builtin.gpu_memory_gib() / 2);
  const absl::Status s = h->PlanLayer(call_, req, &r);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(s).rfind("profile.name: 'a100-8x8' is the name of a built-in profile", 0), 0u) << s;
}

}  // namespace
}  // namespace moeplan::server
