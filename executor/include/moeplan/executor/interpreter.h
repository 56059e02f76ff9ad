// The plan interpreter (docs/executor.md "The plan is the program"): runs a
// planner op graph on this rank, op for op, under the planner's names. Every op
// waits for its dependencies and for the op issued before it on each resource
// it holds (what the simulator assumes); ops run on lanes — the compute lane,
// and one per communicator — so overlap in the plan is overlap in the run:
//   threads:    CPU + MPI (MPI_THREAD_MULTIPLE): a host thread per lane, each
//               running its ops in issue order, blocking in its collectives;
//   sequential: one host thread issues every op in issue order (CUDA: onto
//               its lane's stream, edges across streams as events; the
//               streams run concurrently). On the CPU, the fallback where MPI
//               is not thread-safe: correct, but nothing overlaps.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/executor/comm.h"
#include "moeplan/executor/device.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/types.h"

namespace moeplan::executor {

// A rank's place in the layout of docs/notation.md: MP and ESP groups are consecutive
// ranks, EP groups strided by esp inside an expert replica of ep * esp
// consecutive ranks (a folded expert grid, dpmoe: several replicas per stage,
// their gradients summed over edp).
struct RankPlace {
  int rank = 0;
  int mp_group = 0, mp_rank = 0;
  int esp_group = 0, esp_rank = 0;
  int ep_group = 0, ep_rank = 0;
};
RankPlace PlaceOf(const planner::ParallelLayout& p, int rank);

// The communicators of a layout on this rank (planner::ExecGroup).
// A pipelined run's `stages` are consecutive blocks of world/stages ranks
// (stage = rank / stage size, docs/layouts.md's rank order); every group but
// the pipeline's is inside a stage, and place() is the rank's within it.
class RankGroups {
 public:
  // Collective over `world`: splits the stages (stages > 1: and the
  // pipeline's pp_even / pp_odd groups, ordered by stage), then the MP, EP and
  // ESP groups inside the rank's stage.
  static absl::StatusOr<std::unique_ptr<RankGroups>> Create(Communicator* world,
                                                            const planner::ParallelLayout& p,
                                                            int stages = 1);
  // Collective over `world`: a whole model's data-parallel groups inside the
  // stage, the ranks of one MP rank strided by `dense_stride` (dp) and the
  // replicas of an expert shard strided by `expert_stride` (edp).
  absl::Status AddDataParallel(int dense_stride, int expert_stride);
  Communicator* Of(planner::ExecGroup g) const;  // nullptr for kNone or a group not split
  Communicator* world() const { return world_; }
  const RankPlace& place() const { return place_; }
  int stage() const { return stage_; }

 private:
  Communicator* world_ = nullptr;
  Communicator* base_ = nullptr;  // the stage's ranks: world_ or stage_comm_
  int stage_ = 0;
  RankPlace place_;
  std::unique_ptr<Communicator> stage_comm_, mp_, ep_, esp_, dp_, edp_, pp_even_, pp_odd_;
};

// One timed op of an iteration, microseconds from the iteration's start.
struct OpTime {
  std::string name;  // the planner's op name, e.g. "fwd.saa_dispatch.alltoall.3"
  planner::Phase phase = planner::Phase::kForward;
  planner::OpKind kind = planner::OpKind::kCompute;
  double start_us = 0.0;
  double end_us = 0.0;
};

// What executes the ops of a plan (the MoE layer's buffers and kernels).
class OpHandler {
 public:
  virtual ~OpHandler() = default;
  // The communicator of a collective op (OpKind::kComm); nullptr: none.
  virtual Communicator* CommOf(const planner::OpExec& exec) const = 0;
  // Runs one op. A compute op is issued on the compute lane (the interpreter
  // stamps it); a collective is started on CommOf(exec) and waited for, and
  // `comm` receives its stamps (CUDA: Wait does not join the compute lane,
  // which the interpreter orders by the plan's edges).
  virtual absl::Status Run(const planner::Op& op, const planner::OpExec& exec, Request* comm) = 0;
};

// Every op of `plan` has executable semantics (planner::ExecKind other than
// kNone); InvalidArgument naming the first that has not.
absl::Status CheckExecutable(const planner::OpGraph& plan);

// A set of planner::Phase values.
class PhaseSet {
 public:
  static PhaseSet All() { return PhaseSet(0xff); }
  static PhaseSet Of(planner::Phase p) { return PhaseSet(uint8_t(1u << static_cast<unsigned>(p))); }
  bool Has(planner::Phase p) const { return bits_ & (1u << static_cast<unsigned>(p)); }
  PhaseSet() = default;

 private:
  explicit PhaseSet(uint8_t bits) : bits_(bits) {}
  uint8_t bits_ = 0xff;
};

enum class LaneMode : uint8_t {
  kAuto,     // threads on the CPU where MPI is thread-safe, else sequential
  kThreads,  // an error where it cannot be had
  kSequential,
};

class PlanInterpreter {
 public:
  // Checks that every op has executable semantics (InvalidArgument naming the
  // first that has not) and a communicator, and builds the lanes. The plan is
  // copied; handler, device and world must outlive the interpreter.
  // A pipeline program (planner::BuildPipelineProgram) runs the ops of
  // `stage` (planner::RunsOnStage); the others are not run and read 0 in
  // timings(). Other plans: stage 0, every op.
  static absl::StatusOr<std::unique_ptr<PlanInterpreter>> Create(const planner::OpGraph& plan,
                                                                 OpHandler* handler, Device* device,
                                                                 Communicator* world,
                                                                 LaneMode mode = LaneMode::kAuto,
                                                                 int stage = 0);
  ~PlanInterpreter();

  // Barrier over the world, every op of the plan this rank runs, synchronize;
  // then timings() holds this iteration's ops in issue order (every op of the
  // plan; those of other stages start and end at 0). After a failure the
  // interpreter is unusable (lanes may be stuck in a collective whose peers
  // failed: the caller aborts the job).
  absl::Status RunIteration();
  // The same for the ops of `phases` only (a training step's forward, then
  // its backward once the loss's gradient is known: moeplan.torch). Ops of
  // other phases count as done (an earlier call ran them); their timings stay
  // as they were, and the ops run now are timed from this call's barrier plus
  // `start_us`.
  absl::Status RunPhases(PhaseSet phases, double start_us);
  const std::vector<OpTime>& timings() const;
  double forward_us() const;  // end of the last forward op
  double total_us() const;    // end of the last op
  bool threaded() const;      // lanes are threads (overlap is real on the CPU)

  class Impl;

 private:
  explicit PlanInterpreter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::executor
