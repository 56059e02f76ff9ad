// Watchdog: a step that never ends exits the process naming the rank and the
// step; steps that keep coming keep it alive.
#include "moeplan/base/watchdog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace moeplan {
namespace {

using namespace std::chrono_literals;

TEST(WatchdogDeathTest, AStepThatNeverEndsExitsNamingTheRankAndTheStep) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Watchdog::Start("prog", 7, 200ms);
        Watchdog::Step("waiting in fwd.ep_alltoall_dispatch");
        std::this_thread::sleep_for(30s);
      },
      ::testing::ExitedWithCode(3),
      "prog: rank 7: no progress for 0\\.[2-9] s in 'waiting in fwd.ep_alltoall_dispatch'");
}

TEST(WatchdogDeathTest, StepsThatKeepComingKeepItAliveAndStopEndsTheWatch) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Watchdog::Start("prog", 0, 300ms);
        for (int i = 0; i < 20; ++i) {  // 1 s of steps 50 ms apart
          Watchdog::Step("step");
          std::this_thread::sleep_for(50ms);
        }
        Watchdog::Stop();
        std::this_thread::sleep_for(600ms);  // past the timeout: stopped, so no exit 3
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace moeplan
