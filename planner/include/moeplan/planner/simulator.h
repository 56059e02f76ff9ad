// The timeline simulator of docs/simulator.md. Executes an OpGraph like CUDA streams do:
// each resource runs its ops in issue order; an op starts at
// max(end of its dependencies, end of the previous op on each resource it holds).
// One pass in vertex (= issue = topological) order, O(V + E), no allocation once
// the result's vectors have grown to the graph's size.
#pragma once

#include <algorithm>
#include <array>
#include <vector>

#include "absl/status/status.h"
#include "moeplan/planner/op_graph.h"

namespace moeplan::planner {

struct OpTime {
  double start_us = 0.0;
  double end_us = 0.0;
  // The dependency or resource predecessor whose end fixed this op's start
  // (kNoOp when it started at 0).
  OpId binding = kNoOp;
  bool critical = false;
};

// Statistics (busy, hidden, exposed) are of device 0, the representative rank;
// times and the critical path cover every device.
struct SimResult {
  std::vector<OpTime> times;        // per op id
  std::vector<OpId> critical_path;  // first op to last
  double makespan_us = 0.0;
  double forward_end_us = 0.0;   // end of the last forward op
  double compute_busy_us = 0.0;  // busy time of the compute resource
  double comm_busy_us = 0.0;     // union of intra and inter busy time
  double hidden_comm_us = 0.0;   // comm busy time overlapped by compute
  double exposed_comm_us = 0.0;  // comm_busy_us - hidden_comm_us
  int64_t inter_node_bytes = 0;
  // Critical-path time per term (indexed by Term); sums to makespan_us.
  std::array<double, kNumTerms> critical_term_us{};
};

// One op by the simulator's rule, for planners that time ops as they issue
// them instead of building a graph (Simulator::Schedule gives the same times
// to the bit): it starts at `ready`, the latest end of its dependencies
// (>= 0), or when each resource of `held` frees, whichever is later, and
// holds them to its end. `free_at`: its device's kNumResources resources.
// Returns the end; `start_out`, if given, gets the start.
inline double TimeOp(ResourceMask held, double cost_us, double ready, double* free_at,
                     double* start_out = nullptr) {
  double start = ready;
  for (int r = 0; r < kNumResources; ++r) {
    if (held & (1u << r)) start = std::max(start, free_at[r]);
  }
  const double end = start + cost_us;
  for (int r = 0; r < kNumResources; ++r) {
    if (held & (1u << r)) free_at[r] = end;
  }
  if (start_out != nullptr) *start_out = start;
  return end;
}

// Reusable: keeps scratch buffers between runs.
class Simulator {
 public:
  // InternalError if an edge points forward in issue order (a builder bug).
  // Schedule, then Details.
  absl::Status Run(const OpGraph& graph, SimResult* result);
  // The schedule alone: times, makespan, forward end and inter-node bytes;
  // no critical path or busy statistics (planners comparing makespans).
  // Ops with any flag of `pass_through` (OpFlag bits) run as pass-throughs:
  // no cost and no resource, their dependencies kept (lower bounds that
  // leave those ops out; their bytes still count).
  // `bindings` false: each op's binding is left kNoOp (planners that read
  // only times; Details needs them).
  absl::Status Schedule(const OpGraph& graph, SimResult* result, uint8_t pass_through = 0,
                        bool bindings = true);
  // Completes a Schedule of `graph` into what Run returns: the critical path
  // and the busy, hidden and exposed communication, read from its times.
  void Details(const OpGraph& graph, SimResult* result);

 private:
  // Run's passes after the schedule: the critical path back from `last_op`,
  // and the busy, hidden and exposed communication from the busy intervals.
  static void TraceCriticalPath(const OpGraph& graph, OpId last_op, SimResult* r);
  template <bool kBindings>
  absl::Status ScheduleOps(const OpGraph& graph, SimResult* r, uint8_t pass_through);
  void SumOverlap(SimResult* r);

  struct Interval {
    double begin, end;
  };
  std::array<std::vector<Interval>, kNumResources> busy_;
  // Per (device, resource): end of the last op issued on it, and that op.
  std::vector<double> free_at_;
  std::vector<OpId> last_on_;
  std::vector<Interval> comm_union_;
};

}  // namespace moeplan::planner
