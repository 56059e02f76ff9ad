// SAA, the fused collective of docs/schedules.md (simultaneous AlltoAll and
// AllGather), and its backward dual, on two communicators so that the intra
// and inter steps overlap: non-blocking MPI on the CPU, two NCCL streams on a
// GPU. The MoE runner uses them for S2 and the profiler times them.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "moeplan/executor/comm.h"
#include "moeplan/executor/device.h"
#include "moeplan/planner/op_graph.h"

namespace moeplan::executor {

// Where the steps of a fused collective are recorded (the runner's timeline).
class OpRecorder {
 public:
  virtual ~OpRecorder() = default;
  // A record for the op "<base>.<step>", in issue order; returns its handle.
  virtual size_t Reserve(std::string_view base, int step, planner::Phase phase,
                         planner::OpKind kind) = 0;
  virtual void Set(size_t handle, const Stamp& begin, const Stamp& end) = 0;
};

struct SaaArgs {
  Device* device = nullptr;
  Communicator* a2a = nullptr;    // the AlltoAll's group (EP), W ranks
  Communicator* group = nullptr;  // the AllGather's / ReduceScatter's group (ESP or MP)
  DType dtype = DType::kF32;
  int64_t chunk = 0;   // elements per AlltoAll peer
  int64_t stride = 0;  // elements between the group members' blocks in the strided buffer
  // Op names of the two step kinds, e.g. "fwd.saa_dispatch.alltoall" and
  // "fwd.saa_dispatch.allgather"; steps are recorded as "<name>.<i>".
  std::string_view a2a_name, group_name;
  planner::Phase phase = planner::Phase::kForward;
  OpRecorder* recorder = nullptr;  // optional
};

// Forward SAA. `send` holds W chunks (chunk c for a2a rank c); the pairwise
// AlltoAll runs in W-1 steps (step i: send to q+i, receive from q-i into
// a2a_recv's chunk q-i); each chunk c, once here (the local chunk q first), is
// AllGathered over `group` while the next step runs: member n's copy lands at
// out + c*chunk + n*stride. The result equals an AlltoAll into a2a_recv
// followed by an AllGather of it over the group into [n][c] blocks, element
// for element. Steps are recorded in the planner's issue order:
// alltoall.1, allgather.0, alltoall.2, allgather.1, ..., allgather.W-1.
// A one-rank group gathers by a local copy (no op, as in the planner).
absl::Status SaaGather(const SaaArgs& args, const void* send, void* a2a_recv, void* out);

// Backward dual: for step i the ReduceScatter over `group` of the chunk for
// a2a rank q+i (member n's block at in + c*chunk + n*stride) into staging's
// chunk q+i, then its exchange (to q+i, receiving from q-i into a2a_recv's
// chunk q-i); the exchange of step i overlaps the ReduceScatter of step i+1.
// The local chunk q is reduced last, straight into a2a_recv. Equals a
// ReduceScatter of every chunk followed by an AlltoAll. Recorded as
// reducescatter.1, alltoall.1, reducescatter.2, ..., reducescatter.0.
absl::Status SaaScatter(const SaaArgs& args, const void* in, void* staging, void* a2a_recv);

}  // namespace moeplan::executor
