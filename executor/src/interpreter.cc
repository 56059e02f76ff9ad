#include "moeplan/executor/interpreter.h"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/base/watchdog.h"
#include "moeplan/planner/pipeline_program.h"

namespace moeplan::executor {

using planner::ExecGroup;
using planner::ExecKind;
using planner::OpId;
using planner::OpKind;

RankPlace PlaceOf(const planner::ParallelLayout& p, int rank) {
  RankPlace r;
  r.rank = rank;
  r.mp_group = rank / p.mp;
  r.mp_rank = rank % p.mp;
  r.esp_group = rank / p.esp;
  r.esp_rank = rank % p.esp;
  // One expert replica is ep * esp consecutive ranks (ESP innermost, then
  // EP); a folded grid (dpmoe) repeats it over the stage, each replica an
  // EP group of its own per ESP rank.
  const int grid = std::max(1, p.ep) * p.esp;
  r.ep_group = rank / grid * p.esp + rank % p.esp;
  r.ep_rank = rank / p.esp % std::max(1, p.ep);
  return r;
}

absl::StatusOr<std::unique_ptr<RankGroups>> RankGroups::Create(Communicator* world,
                                                               const planner::ParallelLayout& p,
                                                               int stages) {
  auto g = std::make_unique<RankGroups>();
  g->world_ = world;
  g->base_ = world;
  if (stages > 1) {
    if (world->size() % stages != 0) {
      return absl::InvalidArgumentError(
          Cat("parallel.pp: ", stages, " stages must divide the ranks (", world->size(), ")"));
    }
    const int per = world->size() / stages, r = world->rank();
    g->stage_ = r / per;
    MOEPLAN_ASSIGN_OR_RETURN(g->stage_comm_, world->Split(g->stage_, r % per));
    MOEPLAN_ASSIGN_OR_RETURN(g->pp_even_, world->Split(r % per, g->stage_));
    MOEPLAN_ASSIGN_OR_RETURN(g->pp_odd_, world->Split(r % per, g->stage_));
    g->base_ = g->stage_comm_.get();
  }
  Communicator* base = g->base_;
  g->place_ = PlaceOf(p, base->rank());
  MOEPLAN_ASSIGN_OR_RETURN(g->mp_, base->Split(g->place_.mp_group, g->place_.mp_rank));
  MOEPLAN_ASSIGN_OR_RETURN(g->esp_, base->Split(g->place_.esp_group, g->place_.esp_rank));
  MOEPLAN_ASSIGN_OR_RETURN(g->ep_, base->Split(g->place_.ep_group, g->place_.ep_rank));
  return g;
}

absl::Status RankGroups::AddDataParallel(int dense_stride, int expert_stride) {
  const int r = base_->rank();
  MOEPLAN_ASSIGN_OR_RETURN(dp_, base_->Split(r % dense_stride, r / dense_stride));
  MOEPLAN_ASSIGN_OR_RETURN(edp_, base_->Split(r % expert_stride, r / expert_stride));
  return absl::OkStatus();
}

Communicator* RankGroups::Of(ExecGroup g) const {
  switch (g) {
    case ExecGroup::kDp:
      return dp_.get();
    case ExecGroup::kEdp:
      return edp_.get();
    case ExecGroup::kMp:
      return mp_.get();
    case ExecGroup::kEp:
      return ep_.get();
    case ExecGroup::kEsp:
      return esp_.get();
    case ExecGroup::kPpEven:
      return pp_even_.get();
    case ExecGroup::kPpOdd:
      return pp_odd_.get();
    case ExecGroup::kNone:
      break;
  }
  return nullptr;
}

absl::Status CheckExecutable(const planner::OpGraph& plan) {
  if (plan.size() == 0) return absl::InvalidArgumentError("plan: the op graph is empty");
  for (OpId id = 0; id < plan.size(); ++id) {
    if (plan.exec(id).kind == ExecKind::kNone) {
      return absl::InvalidArgumentError(
          Cat("plan: op ", plan.op(id).Name(),
              " carries no executable semantics (the planner costs it but does not say what it "
              "computes): this plan cannot be run"));
    }
  }
  return absl::OkStatus();
}

class PlanInterpreter::Impl {
 public:
  Impl(const planner::OpGraph& plan, OpHandler* handler, Device* device, Communicator* world,
       int stage)
      : plan_(plan), handler_(handler), dev_(device), world_(world), stage_(stage) {}
  ~Impl();

  absl::Status Init(LaneMode mode);
  // Init's steps: every op this rank runs onto its lane (one per
  // communicator, after the compute lane; `comms_thread_safe` says whether
  // all of them may be driven from threads), then the waits across lanes.
  absl::Status AssignLanes(bool* comms_thread_safe);
  absl::Status BuildWaits();
  absl::Status RunIteration(PhaseSet phases, double start_us);

  std::vector<OpTime> times_;
  double forward_us_ = 0.0, total_us_ = 0.0;
  bool threaded_ = false;

 private:
  // One lane: the compute lane (index 0) or a communicator's.
  struct Lane {
    Communicator* comm = nullptr;  // nullptr: compute
    LaneId id = kComputeLane;
    std::vector<OpId> ops;  // in issue order
  };

  // Whether op `id` runs in the current iteration: its stage's, of a phase asked for.
  bool RunsNow(OpId id) const {
    return runs_[static_cast<size_t>(id)] && phases_.Has(plan_.op(id).phase);
  }
  // An op of a phase not asked for was completed by an earlier call.
  bool Done(OpId w, uint64_t epoch) const {
    return done_[static_cast<size_t>(w)] == epoch || !phases_.Has(plan_.op(w).phase);
  }
  std::span<const OpId> WaitsOf(OpId id) const {
    return {waits_.data() + wait_begin_[static_cast<size_t>(id)],
            waits_.data() + wait_begin_[static_cast<size_t>(id) + 1]};
  }
  absl::Status Execute(OpId id);
  // Threads: runs lane `l`'s ops of iteration `epoch`, each once its waits are done.
  absl::Status RunLane(size_t l, uint64_t epoch);
  void Worker(size_t l);

  planner::OpGraph plan_;
  OpHandler* handler_;
  Device* dev_;
  Communicator* world_;
  int stage_;
  std::vector<Lane> lanes_;
  std::vector<size_t> lane_of_;
  std::vector<uint8_t> runs_;  // per op: run on this rank (its stage's)
  // Per op: the ops on other lanes it waits for (its dependencies and its
  // resources' previous ops), CSR.
  std::vector<uint32_t> wait_begin_;
  std::vector<OpId> waits_;
  std::vector<Stamp> begin_, end_;
  PhaseSet phases_;  // the phases of the current iteration

  // Threads.
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t epoch_ = 0;
  std::vector<uint64_t> done_;  // per op: the epoch it last completed in
  size_t lanes_left_ = 0;
  bool failed_ = false, stop_ = false, broken_ = false;
  absl::Status error_;
};

absl::Status PlanInterpreter::Impl::Init(LaneMode mode) {
  MOEPLAN_RETURN_IF_ERROR(CheckExecutable(plan_));
  bool comms_thread_safe = true;
  MOEPLAN_RETURN_IF_ERROR(AssignLanes(&comms_thread_safe));
  MOEPLAN_RETURN_IF_ERROR(BuildWaits());
  const bool can_thread = !dev_->is_gpu() && comms_thread_safe;
  if (mode == LaneMode::kThreads && !can_thread) {
    return absl::FailedPreconditionError(
        dev_->is_gpu() ? "plan: threaded lanes are for the CPU backend (CUDA lanes are streams)"
                       : "plan: threaded lanes need MPI initialised with MPI_THREAD_MULTIPLE");
  }
  threaded_ = mode != LaneMode::kSequential && can_thread;
  for (Lane& l : lanes_) {
    if (l.comm != nullptr) l.comm->SetLaneJoins(false);
  }
  if (threaded_) {
    for (size_t l = 0; l < lanes_.size(); ++l) threads_.emplace_back([this, l] { Worker(l); });
  }
  return absl::OkStatus();
}

absl::Status PlanInterpreter::Impl::AssignLanes(bool* comms_thread_safe) {
  const int n = plan_.size();
  lanes_.push_back(Lane{});
  lane_of_.assign(static_cast<size_t>(n), 0);
  times_.resize(static_cast<size_t>(n));
  begin_.resize(static_cast<size_t>(n));
  end_.resize(static_cast<size_t>(n));
  done_.assign(static_cast<size_t>(n), 0);
  runs_.assign(static_cast<size_t>(n), 0);
  for (OpId id = 0; id < n; ++id) {
    const planner::Op& op = plan_.op(id);
    const planner::OpExec& x = plan_.exec(id);
    OpTime& t = times_[static_cast<size_t>(id)];
    t.name = op.Name();
    t.phase = op.phase;
    t.kind = op.kind;
    if (!planner::RunsOnStage(plan_, id, stage_)) continue;
    runs_[static_cast<size_t>(id)] = 1;
    size_t lane = 0;
    if (op.kind == OpKind::kComm) {
      Communicator* c = handler_->CommOf(x);
      if (c == nullptr) {
        return absl::InvalidArgumentError(Cat("plan: op ", op.Name(), " runs on group ",
                                              planner::ExecGroupName(x.group),
                                              ", which this rank does not have"));
      }
      *comms_thread_safe = *comms_thread_safe && c->ThreadSafe();
      auto it =
          std::find_if(lanes_.begin(), lanes_.end(), [&](const Lane& l) { return l.comm == c; });
      lane = static_cast<size_t>(it - lanes_.begin());
      if (it == lanes_.end()) lanes_.push_back(Lane{c, c->lane(), {}});
    }
    lane_of_[static_cast<size_t>(id)] = lane;
    lanes_[lane].ops.push_back(id);
  }
  return absl::OkStatus();
}

absl::Status PlanInterpreter::Impl::BuildWaits() {
  const int n = plan_.size();
  // Waits: dependencies, and per (device, resource) the op issued before on
  // it; an op on the same lane is implied by the lane's order.
  std::vector<OpId> last_on;  // (device * kNumResources + resource) -> op
  wait_begin_.assign(1, 0);
  std::vector<OpId> w;
  // Ops of other stages are not run: the edges to them are the pipeline's
  // transfers, which this rank receives instead.
  for (OpId id = 0; id < n; ++id) {
    const planner::Op& op = plan_.op(id);
    w.clear();
    for (OpId d : plan_.deps(id)) {
      if (d < 0 || d >= id) {
        return absl::InvalidArgumentError(
            Cat("plan: op ", op.Name(), " depends on op ", d, ", not issued before it"));
      }
      if (runs_[static_cast<size_t>(d)]) w.push_back(d);
    }
    if (!runs_[static_cast<size_t>(id)]) {
      wait_begin_.push_back(static_cast<uint32_t>(waits_.size()));
      continue;
    }
    for (int r = 0; r < planner::kNumResources; ++r) {
      if (!(op.resources & (1 << r))) continue;
      const size_t slot = static_cast<size_t>(op.device) * planner::kNumResources + r;
      if (slot >= last_on.size()) last_on.resize(slot + 1, planner::kNoOp);
      if (last_on[slot] != planner::kNoOp) w.push_back(last_on[slot]);
      last_on[slot] = id;
    }
    std::sort(w.begin(), w.end());
    w.erase(std::unique(w.begin(), w.end()), w.end());
    for (OpId d : w) {
      if (lane_of_[static_cast<size_t>(d)] != lane_of_[static_cast<size_t>(id)])
        waits_.push_back(d);
    }
    wait_begin_.push_back(static_cast<uint32_t>(waits_.size()));
  }
  return absl::OkStatus();
}

PlanInterpreter::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    // A lane stuck in a collective whose peers failed never returns; the job
    // is being aborted then, so it is left behind rather than joined.
    if (broken_) {
      t.detach();
    } else {
      t.join();
    }
  }
  for (Lane& l : lanes_) {
    if (l.comm != nullptr) l.comm->SetLaneJoins(true);
  }
}

absl::Status PlanInterpreter::Impl::Execute(OpId id) {
  const planner::Op& op = plan_.op(id);
  const planner::OpExec& x = plan_.exec(id);
  const size_t i = static_cast<size_t>(id);
  Watchdog::Step(times_[i].name);
  if (op.kind == OpKind::kComm) {
    Request r;
    MOEPLAN_RETURN_IF_ERROR(handler_->Run(op, x, &r));
    begin_[i] = r.begin;
    end_[i] = r.end;
    return absl::OkStatus();
  }
  MOEPLAN_ASSIGN_OR_RETURN(begin_[i], dev_->Record(kComputeLane));
  MOEPLAN_RETURN_IF_ERROR(handler_->Run(op, x, nullptr));
  MOEPLAN_ASSIGN_OR_RETURN(end_[i], dev_->Record(kComputeLane));
  return absl::OkStatus();
}

absl::Status PlanInterpreter::Impl::RunLane(size_t l, uint64_t epoch) {
  for (OpId id : lanes_[l].ops) {
    if (!RunsNow(id)) continue;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        if (failed_) return true;
        for (OpId w : WaitsOf(id)) {
          if (!Done(w, epoch)) return false;
        }
        return true;
      });
      if (failed_) return absl::CancelledError("another lane failed");
    }
    MOEPLAN_RETURN_IF_ERROR(Execute(id));
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_[static_cast<size_t>(id)] = epoch;
    }
    cv_.notify_all();
  }
  return absl::OkStatus();
}

void PlanInterpreter::Impl::Worker(size_t l) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || epoch_ != seen; });
      if (stop_) return;
      seen = epoch_;
    }
    absl::Status st = RunLane(l, seen);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!st.ok() && !failed_) {
        failed_ = true;
        error_ = std::move(st);
      }
      --lanes_left_;
    }
    cv_.notify_all();
  }
}

absl::Status PlanInterpreter::Impl::RunIteration(PhaseSet phases, double start_us) {
  if (broken_) {
    return absl::FailedPreconditionError("plan: an earlier iteration failed; the lanes are gone");
  }
  phases_ = phases;
  MOEPLAN_RETURN_IF_ERROR(world_->Barrier());
  MOEPLAN_ASSIGN_OR_RETURN(Stamp t0, dev_->Record(kComputeLane));
  if (threaded_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++epoch_;
      lanes_left_ = lanes_.size();
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return lanes_left_ == 0 || failed_; });
    if (failed_) {
      broken_ = true;
      return error_;
    }
  } else {
    for (OpId id = 0; id < plan_.size(); ++id) {
      if (!RunsNow(id)) continue;
      const Lane& lane = lanes_[lane_of_[static_cast<size_t>(id)]];
      // Edges across lanes: the waiter's stream waits for the op's end (no-op
      // on the CPU, where every op is done when issued).
      for (OpId w : WaitsOf(id)) {
        if (!RunsNow(w)) continue;  // an earlier call's, synchronized since
        MOEPLAN_RETURN_IF_ERROR(dev_->WaitStamp(lane.id, end_[static_cast<size_t>(w)]));
      }
      if (absl::Status st = Execute(id); !st.ok()) {
        broken_ = true;
        return st;
      }
    }
  }
  MOEPLAN_RETURN_IF_ERROR(dev_->Synchronize());
  forward_us_ = total_us_ = 0.0;
  for (size_t i = 0; i < times_.size(); ++i) {
    OpTime& t = times_[i];
    if (!runs_[i]) continue;  // another stage's: 0
    if (RunsNow(static_cast<OpId>(i))) {
      MOEPLAN_ASSIGN_OR_RETURN(t.start_us, dev_->ElapsedUs(t0, begin_[i]));
      MOEPLAN_ASSIGN_OR_RETURN(t.end_us, dev_->ElapsedUs(t0, end_[i]));
      t.start_us += start_us;
      t.end_us += start_us;
    }
    total_us_ = std::max(total_us_, t.end_us);
    if (t.phase == planner::Phase::kForward) forward_us_ = std::max(forward_us_, t.end_us);
  }
  dev_->RecycleStamps();
  return absl::OkStatus();
}

PlanInterpreter::PlanInterpreter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PlanInterpreter::~PlanInterpreter() = default;

absl::StatusOr<std::unique_ptr<PlanInterpreter>> PlanInterpreter::Create(
    const planner::OpGraph& plan, OpHandler* handler, Device* device, Communicator* world,
    LaneMode mode, int stage) {
  auto impl = std::make_unique<Impl>(plan, handler, device, world, stage);
  MOEPLAN_RETURN_IF_ERROR(impl->Init(mode));
  return std::unique_ptr<PlanInterpreter>(new PlanInterpreter(std::move(impl)));
}

absl::Status PlanInterpreter::RunIteration() { return impl_->RunIteration(PhaseSet::All(), 0.0); }
absl::Status PlanInterpreter::RunPhases(PhaseSet phases, double start_us) {
  return impl_->RunIteration(phases, start_us);
}
const std::vector<OpTime>& PlanInterpreter::timings() const { return impl_->times_; }
double PlanInterpreter::forward_us() const { return impl_->forward_us_; }
double PlanInterpreter::total_us() const { return impl_->total_us_; }
bool PlanInterpreter::threaded() const { return impl_->threaded_; }

}  // namespace moeplan::executor
