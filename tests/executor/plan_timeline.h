// A measured timeline against the plan that ran: every op timed under its
// planner name, in issue order, start <= end, and no op starting before an op
// it depends on has ended (the interpreter's rule, on this rank).
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "moeplan/executor/interpreter.h"
#include "moeplan/planner/op_graph.h"

namespace moeplan::executor {

inline void ExpectRunFollowsPlan(const planner::OpGraph& plan, const std::vector<OpTime>& t) {
  ASSERT_EQ(t.size(), static_cast<size_t>(plan.size()));
  for (planner::OpId id = 0; id < plan.size(); ++id) {
    const OpTime& ti = t[static_cast<size_t>(id)];
    EXPECT_EQ(ti.name, plan.op(id).Name());
    EXPECT_LE(ti.start_us, ti.end_us) << ti.name;
    for (planner::OpId d : plan.deps(id)) {
      EXPECT_GE(ti.start_us, t[static_cast<size_t>(d)].end_us)
          << ti.name << " started before " << plan.op(d).Name() << " ended";
    }
  }
}

}  // namespace moeplan::executor
