// The MoE-layer runner: default, S1 and S2 (docs/schedules.md, planner/README.md for
// where the planner refines the design) forward and backward on real data, with
// every op recorded under the planner's name.
//
// Buffers per rank (element counts; W = ep, N = mp, El = E / W, T the buffer's
// capacity, R the rows per group):
//   default: order -> disp [E][T][M] = [W][El][T][M] -> AlltoAll -> expert input
//            [W][El][T][M] (G = W groups of R = T rows) -> partial output ->
//            ESP-AllReduce -> AlltoAll -> comb [E][T][M] -> i-order.
//   dropless (default schedule only): every routed choice is kept. The
//            dispatch buffer is compact, [k*S][M] with expert e's rows from its
//            offset on (order / i-order see row i as slot i % S of "expert"
//            i / S); the EP ranks exchange their per-expert counts, then an
//            AlltoAllv; the expert input is [W][El][rows(w, l)][M], packed, and
//            each (peer, local expert) block is one GEMM of its own row count.
//   S1:      the rank's S/N tokens, capacity T1 per rank; after the AlltoAll the
//            ESP-AllGather gives [N][W][El][T1][M] (G = N*W); ESP-ReduceScatter
//            brings back the rank's own block.
//   S2:      the MP group's S tokens at the default's capacity T, buffer capacity
//            T2 = T rounded up to a multiple of N and stored as N parts
//            [N][E][T2/N][M]; the MP rank's part is what it dispatches. SAA
//            AllGathers each arrived chunk c into [n][c] of [N][W][El][T2/N][M].
#include "moeplan/executor/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/base/watchdog.h"
#include "moeplan/executor/saa.h"
#include "moeplan/planner/validate.h"

namespace moeplan::executor {

using planner::OpKind;
using planner::Phase;
using planner::Schedule;

namespace {

constexpr Phase F = Phase::kForward;
constexpr Phase B = Phase::kBackward;

enum Tensor : uint32_t {
  kTensorX = 1,
  kTensorGate = 2,
  kTensorW1 = 3,
  kTensorW2 = 4,
  kTensorDy = 5,
  kTensorSkew = 6
};

}  // namespace

std::vector<float> SkewBias(int64_t experts, double exponent, uint64_t seed) {
  // A seeded Fisher-Yates permutation: rank_of[e] is expert e's popularity rank.
  std::vector<int64_t> order(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) order[static_cast<size_t>(e)] = e;
  for (int64_t i = experts - 1; i > 0; --i) {
    const double u = 0.5 * (SeededValue(seed, kTensorSkew, static_cast<uint64_t>(i), 1.0f) + 1.0);
    const int64_t j = std::min(i, static_cast<int64_t>(u * static_cast<double>(i + 1)));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  std::vector<float> bias(static_cast<size_t>(experts));
  for (int64_t r = 0; r < experts; ++r) {
    bias[static_cast<size_t>(order[static_cast<size_t>(r)])] =
        static_cast<float>(-exponent * std::log(static_cast<double>(r + 1)));
  }
  return bias;
}

RankPlace PlaceOf(const planner::ParallelLayout& p, int rank) {
  RankPlace r;
  r.rank = rank;
  r.mp_group = rank / p.mp;
  r.mp_rank = rank % p.mp;
  r.esp_group = rank / p.esp;
  r.esp_rank = rank % p.esp;
  r.ep_group = rank % p.esp;
  r.ep_rank = rank / p.esp;
  return r;
}

absl::Status ValidateWorld(const planner::LayerConfig& layer, int world_size) {
  const planner::ParallelLayout& p = layer.parallel;
  if (p.pp != 1) {
    return absl::InvalidArgumentError(
        Cat("parallel.pp: the executor runs one pipeline stage; must be 1 (got ", p.pp, ")"));
  }
  if (int64_t{p.mp} * p.dp != world_size) {
    return absl::InvalidArgumentError(
        Cat("parallel: mp*dp must equal the number of ranks the executor runs on (got mp*dp=",
            int64_t{p.mp} * p.dp, ", ranks=", world_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateForExecutor(const planner::LayerConfig& layer, Schedule schedule,
                                 int world_size) {
  if (layer.dropless && schedule != Schedule::kDefault) {
    return absl::InvalidArgumentError(Cat(
        "dropless: the executor runs dropless layers (an irregular AlltoAll) under the default "
        "schedule only; ",
        planner::ScheduleName(schedule),
        "'s ESP gathers of uneven blocks are planned but not executable: use --schedule default "
        "or set dropless to false"));
  }
  // esp | mp, which the default schedule needs, is ValidateLayer's.
  return ValidateWorld(layer, world_size);
}

class MoeLayerRunner::Impl final : public OpRecorder {
 public:
  Impl(const planner::LayerConfig& layer, const RunOptions& opt, Device* dev, Kernels* k,
       Communicator* world)
      : layer_(layer), opt_(opt), dev_(dev), k_(k), world_(world) {}

  absl::Status Init();
  absl::Status RunIteration();
  absl::StatusOr<LayerResults> Results();
  absl::StatusOr<RouteCounts> Routing();

  const std::vector<OpTime>& timings() const { return times_; }
  double forward_us() const { return forward_us_; }
  double total_us() const { return total_us_; }
  const RankPlace& place() const { return place_; }

 private:
  // ---- op recording ----
  struct Rec {
    std::string name;
    Phase phase = F;
    OpKind kind = OpKind::kCompute;
    Stamp begin, end;
  };
  // A non-blocking collective in flight and its record.
  struct Pending {
    Communicator* comm = nullptr;  // nullptr: nothing in flight
    Request req;
    size_t rec = 0;
  };

  void Set(size_t handle, const Stamp& begin, const Stamp& end) override {
    recs_[handle].begin = begin;
    recs_[handle].end = end;
  }
  size_t Reserve(std::string_view base, int step, Phase phase, OpKind kind) override {
    if (nrec_ == recs_.size()) recs_.emplace_back();
    Rec& r = recs_[nrec_];
    r.name.assign(base);
    if (step >= 0) fmt::format_to(std::back_inserter(r.name), ".{}", step);
    r.phase = phase;
    r.kind = kind;
    Watchdog::Step(r.name);
    return nrec_++;
  }

  template <class Fn>
  absl::Status Compute(std::string_view name, Phase phase, Fn&& fn) {
    const size_t rec = Reserve(name, -1, phase, OpKind::kCompute);
    MOEPLAN_ASSIGN_OR_RETURN(recs_[rec].begin, dev_->Record(kComputeLane));
    MOEPLAN_RETURN_IF_ERROR(fn());
    MOEPLAN_ASSIGN_OR_RETURN(recs_[rec].end, dev_->Record(kComputeLane));
    return absl::OkStatus();
  }

  // Starts a collective on `c` and reserves its record; on a group of one rank
  // the planner emits no op, so `local` moves the data instead, unrecorded.
  template <class StartFn, class LocalFn>
  absl::StatusOr<Pending> Start(std::string_view name, int step, Phase phase, Communicator* c,
                                StartFn&& start, LocalFn&& local) {
    Pending p;
    if (c->size() == 1) {
      MOEPLAN_RETURN_IF_ERROR(local());
      return p;
    }
    p.rec = Reserve(name, step, phase, OpKind::kComm);
    MOEPLAN_ASSIGN_OR_RETURN(p.req, start());
    p.comm = c;
    return p;
  }
  absl::Status Finish(Pending* p) {
    if (p->comm == nullptr) return absl::OkStatus();
    Watchdog::Step(recs_[p->rec].name);  // the wait on the peers
    MOEPLAN_RETURN_IF_ERROR(p->comm->Wait(&p->req));
    recs_[p->rec].begin = p->req.begin;
    recs_[p->rec].end = p->req.end;
    p->comm = nullptr;
    return absl::OkStatus();
  }
  template <class StartFn, class LocalFn>
  absl::Status Coll(std::string_view name, Phase phase, Communicator* c, StartFn&& start,
                    LocalFn&& local) {
    MOEPLAN_ASSIGN_OR_RETURN(Pending p, Start(name, -1, phase, c, start, local));
    return Finish(&p);
  }

  // ---- building blocks ----
  char* At(const DeviceBuffer& b, int64_t elems) const {
    return b.as<char>() + static_cast<size_t>(elems) * es_;
  }
  absl::Status Copy(void* dst, const void* src, int64_t elems) {
    return dev_->Copy(dst, src, static_cast<size_t>(elems) * es_, kComputeLane);
  }
  // Allocation runs twice: first only adding up what it would allocate
  // (estimate_ set), so that a layer too large for the memory is refused
  // before anything is allocated or filled, naming its largest tensor.
  struct Estimate {
    size_t total = 0, largest = 0;
    std::string_view largest_name;
  };
  absl::Status Alloc(DeviceBuffer* b, int64_t elems, size_t elem_size, std::string_view what) {
    const size_t bytes = static_cast<size_t>(elems) * elem_size;
    if (estimate_) {
      estimate_->total += bytes;
      if (bytes > estimate_->largest) {
        estimate_->largest = bytes;
        estimate_->largest_name = what;
      }
      return absl::OkStatus();
    }
    MOEPLAN_ASSIGN_OR_RETURN(*b, DeviceBuffer::Make(dev_, bytes));
    return absl::OkStatus();
  }
  // The token side (inputs, gate, dispatch buffers, weights) and the expert
  // side (expert inputs, outputs and activations), separately: a dropless
  // layer knows the expert side's rows only once the tokens are routed.
  absl::Status AllocateBuffers(bool token_side, bool expert_side);
  // Adds up one call's buffers, refuses them over the memory limit (with
  // `before` bytes already allocated), then allocates them; returns their bytes.
  absl::StatusOr<size_t> AllocateChecked(bool token_side, bool expert_side, size_t before);
  absl::Status AlltoAll(std::string_view name, Phase ph, const void* send, void* recv,
                        int64_t per_peer) {
    return Coll(
        name, ph, ep_.get(),
        [&] { return ep_->StartAlltoAll(send, recv, static_cast<size_t>(per_peer), dt_); },
        [&] { return Copy(recv, send, per_peer); });
  }
  absl::Status AllGather(std::string_view name, Phase ph, Communicator* c, const void* send,
                         void* recv, int64_t count) {
    return Coll(
        name, ph, c, [&] { return c->StartAllGather(send, recv, static_cast<size_t>(count), dt_); },
        [&] { return Copy(recv, send, count); });
  }
  absl::Status ReduceScatter(std::string_view name, Phase ph, Communicator* c, const void* send,
                             void* recv, int64_t count) {
    return Coll(
        name, ph, c,
        [&] { return c->StartReduceScatter(send, recv, static_cast<size_t>(count), dt_); },
        [&] { return Copy(recv, send, count); });
  }
  absl::Status AllReduceInPlace(std::string_view name, Phase ph, Communicator* c, void* buf,
                                int64_t count, DType t) {
    return Coll(
        name, ph, c, [&] { return c->StartAllReduce(buf, buf, static_cast<size_t>(count), t); },
        [] { return absl::OkStatus(); });
  }

  // The default schedule's EP exchange, to the experts or back: padded, an
  // AlltoAll of the capacity blocks; dropless, an AlltoAllv of this
  // iteration's counts (back: the same blocks, reversed).
  absl::Status EpExchange(std::string_view name, Phase ph, const void* send, void* recv,
                          bool to_experts);

  // ---- dropless ----
  // The routing on the host: counts per expert, offsets, compact slots (uploaded).
  absl::Status CountRoutes();
  // fwd.ep_alltoall_counts, then the exchange's sizes from the counts.
  absl::Status ExchangeCounts();
  absl::Status SizeExchange();
  // The order kernels' view of the routing: dropless, k*S compact rows.
  const RouteBuffers& OrderRoute() const { return dropless_ ? flat_ : route_; }
  // Elements of the expert input (what the ESP AllReduce sums).
  int64_t ExpertTokenElements() const {
    return dropless_ ? recv_rows_ * M_ : xshape_.TokenElements();
  }
  // The expert FFN shard on uneven blocks: block (w, l) is peer_count_[w*El+l]
  // rows from block_off_, local expert l's weights; one GEMM per block.
  // ForBlocksOf visits local expert l's non-empty blocks, peer by peer.
  template <class Fn>
  absl::Status ForBlocksOf(int64_t l, Fn&& fn) {  // fn(rows, first row), non-empty blocks
    for (int64_t w = 0; w < W_; ++w) {
      const size_t b = static_cast<size_t>(w * El_ + l);
      if (peer_count_[b] > 0) MOEPLAN_RETURN_IF_ERROR(fn(peer_count_[b], block_off_[b]));
    }
    return absl::OkStatus();
  }
  absl::Status RaggedExpertForward();
  absl::Status RaggedExpertBackwardData();
  absl::Status RaggedExpertBackwardWeights();

  absl::Status ExpertForward();
  absl::Status ExpertBackward();
  absl::Status GateForward(const void* x);
  absl::Status GateBackward(void* dx);
  // The S2 fused collectives on the EP group and `group`, recorded here.
  SaaArgs Saa(Communicator* group, std::string_view a2a_name, std::string_view group_name,
              Phase ph) {
    SaaArgs a;
    a.device = dev_;
    a.a2a = ep_.get();
    a.group = group;
    a.dtype = dt_;
    a.chunk = El_ * part_rows_ * M_;
    a.stride = E_ * part_rows_ * M_;
    a.a2a_name = a2a_name;
    a.group_name = group_name;
    a.phase = ph;
    a.recorder = this;
    return a;
  }

  absl::Status ForwardDefault();
  absl::Status BackwardDefault();
  absl::Status ForwardS1();
  absl::Status BackwardS1();
  absl::Status ForwardS2();
  absl::Status BackwardS2();

  absl::Status FillInputs();

  planner::LayerConfig layer_;
  RunOptions opt_;
  std::optional<Estimate> estimate_;
  Device* dev_;
  Kernels* k_;
  Communicator* world_;
  std::unique_ptr<Communicator> mp_, ep_, esp_;
  RankPlace place_;
  DType dt_ = DType::kF32;
  size_t es_ = 4;

  int64_t S_ = 0, M_ = 0, H_ = 0, E_ = 0, K_ = 0;
  int N_ = 1, W_ = 1;
  int64_t El_ = 1, Hs_ = 1;
  int64_t gated_ = 0;      // tokens this rank gates
  int64_t route_cap_ = 0;  // capacity the routing applies
  int64_t part_rows_ = 0;  // T / parts: rows per expert in one part
  float dw_scale_ = 1.0f;
  BufferShape bshape_;
  ExpertShape xshape_;

  // Tokens and gate.
  DeviceBuffer x_, dy_, y_, dx_, xs_, ys_, dys_, dxs_;
  DeviceBuffer x32_, dxg32_, logits_, probs_, expert_, slot_, weight_, dweight_, dlogits_;
  DeviceBuffer ones_, skew_bias_;  // --skew: logits += ones [S x 1] * bias [1 x E]
  DeviceBuffer wg_, dwg_;
  // Experts.
  DeviceBuffer w1_, w2_, dw1_, dw2_, z_, a_, dz_;
  DeviceBuffer ein_, eout_, dein_, deout_;
  // Dispatch side.
  DeviceBuffer disp_, ddisp_, comb_, dcomb_;
  DeviceBuffer part_, dpart_, recv_, drecv_, back_, dback_, stage_;
  RouteBuffers route_;
  // Dropless: the routing seen as k "experts" of S slots each, so that the
  // choice at compact row i is slot i % S of expert i / S: the order kernels
  // then fill the [k*S][M] buffer expert by expert. And the irregular
  // exchange's sizes (host vectors sized once, reused).
  bool dropless_ = false;
  DeviceBuffer flat_expert_, flat_slot_;
  RouteBuffers flat_;
  std::vector<int32_t> host_expert_, host_slot_, host_flat_expert_, host_flat_;  // [S x k]
  std::vector<int64_t> count_;       // [E] choices routed to each expert here
  std::vector<int64_t> expert_off_;  // [E] the expert's first row in the compact buffer
  std::vector<int64_t> peer_count_;  // [W x El] rows peer w sends for local expert l
  std::vector<int64_t> block_off_;   // [W x El] their first row in the expert input
  std::vector<size_t> send_n_, send_off_, recv_n_, recv_off_;  // [W] AlltoAllv, elements
  int64_t recv_rows_ = 0;                                      // rows received this iteration
  int64_t recv_cap_ = 0;                                       // rows the expert-side buffers hold

  std::vector<Rec> recs_;
  size_t nrec_ = 0;
  std::vector<OpTime> times_;
  double forward_us_ = 0.0, total_us_ = 0.0;
};

absl::Status MoeLayerRunner::Impl::Init() {
  const int world = world_->size();
  MOEPLAN_RETURN_IF_ERROR(ValidateWorld(layer_, world));
  MOEPLAN_RETURN_IF_ERROR(planner::ValidateLayer(layer_, planner::ClusterShape{1, world}));
  MOEPLAN_RETURN_IF_ERROR(planner::ValidateForSchedule(layer_, opt_.schedule));
  MOEPLAN_RETURN_IF_ERROR(ValidateForExecutor(layer_, opt_.schedule, world));
  if (!k_->Supports(opt_.dtype)) {
    return absl::InvalidArgumentError(
        Cat("dtype: the ", k_->name(), " kernels do not support ", DTypeName(opt_.dtype)));
  }
  const planner::ParallelLayout& p = layer_.parallel;
  dt_ = opt_.dtype;
  es_ = SizeOf(dt_);
  S_ = layer_.batch_size * layer_.seq_len;
  M_ = layer_.model_dim;
  H_ = layer_.hidden_dim;
  E_ = layer_.num_experts;
  K_ = layer_.top_k;
  N_ = p.mp;
  W_ = p.ep;
  El_ = E_ / W_;
  Hs_ = H_ / p.esp;
  place_ = PlaceOf(p, world_->rank());
  const int64_t T = planner::Capacity(K_, layer_.capacity_factor, S_, E_);

  // Every rank has passed validation: the first collective.
  MOEPLAN_ASSIGN_OR_RETURN(mp_, world_->Split(place_.mp_group, place_.mp_rank));
  MOEPLAN_ASSIGN_OR_RETURN(esp_, world_->Split(place_.esp_group, place_.esp_rank));
  MOEPLAN_ASSIGN_OR_RETURN(ep_, world_->Split(place_.ep_group, place_.ep_rank));

  bshape_.model = M_;
  bshape_.experts = E_;
  bshape_.top_k = K_;
  bshape_.dtype = dt_;
  xshape_.local_experts = El_;
  xshape_.model = M_;
  xshape_.shard = Hs_;
  xshape_.dtype = dt_;
  int64_t groups = W_;
  switch (opt_.schedule) {
    case Schedule::kDefault:
      gated_ = S_;
      route_cap_ = T;
      bshape_.capacity = T;
      bshape_.parts = 1;
      // mp / esp ranks of an MP group send the same tokens to each shard: their
      // weight-gradient contributions are identical copies.
      dw_scale_ = static_cast<float>(p.esp) / static_cast<float>(p.mp);
      break;
    case Schedule::kS1:
      gated_ = S_ / N_;
      route_cap_ = planner::Capacity(K_, layer_.capacity_factor, gated_, E_);
      bshape_.capacity = route_cap_;
      bshape_.parts = 1;
      groups = int64_t{N_} * W_;
      break;
    case Schedule::kS2:
      gated_ = S_;
      route_cap_ = T;
      bshape_.capacity = (T + N_ - 1) / N_ * N_;
      bshape_.parts = N_;
      groups = int64_t{N_} * W_;
      break;
  }
  dropless_ = layer_.dropless;  // default schedule only (ValidateForExecutor)
  if (dropless_) {
    // No capacity: an expert gets a token at most once, so capacity S keeps
    // every choice; the buffer holds exactly the k*S routed rows.
    route_cap_ = S_;
    bshape_.experts = K_;
    bshape_.capacity = S_;
    const size_t n = static_cast<size_t>(S_ * K_);
    for (std::vector<int32_t>* v : {&host_expert_, &host_slot_, &host_flat_expert_, &host_flat_}) {
      v->resize(n);
    }
    for (std::vector<int64_t>* v : {&count_, &expert_off_, &peer_count_, &block_off_}) {
      v->assign(static_cast<size_t>(E_), 0);
    }
    for (std::vector<size_t>* v : {&send_n_, &send_off_, &recv_n_, &recv_off_}) {
      v->assign(static_cast<size_t>(W_), 0);
    }
  }
  bshape_.tokens = gated_;
  part_rows_ = bshape_.capacity / bshape_.parts;
  xshape_.groups = groups;
  xshape_.rows = part_rows_;

  if (!dropless_) {
    MOEPLAN_RETURN_IF_ERROR(AllocateChecked(true, true, 0).status());
    return FillInputs();
  }
  // Routing is a pure function of the seeded inputs, the same every
  // iteration: one untimed gate pass and count exchange size the expert side.
  absl::StatusOr<size_t> token_bytes = AllocateChecked(true, false, 0);
  absl::Status routed = token_bytes.status();
  if (routed.ok()) routed = FillInputs();
  if (routed.ok()) routed = GateForward(x_.data());
  if (routed.ok()) routed = CountRoutes();
  // Every rank takes part in the exchange whatever happened above, so that
  // none is left waiting in it; the errors are returned after.
  if (!routed.ok()) std::fill(count_.begin(), count_.end(), 0);
  const absl::Status exchanged = ep_->ExchangeCounts(count_, absl::MakeSpan(peer_count_));
  MOEPLAN_RETURN_IF_ERROR(routed);
  MOEPLAN_RETURN_IF_ERROR(exchanged);
  recv_cap_ = -1;  // not sized yet: SizeExchange accepts any row count
  MOEPLAN_RETURN_IF_ERROR(SizeExchange());
  recv_cap_ = recv_rows_;
  return AllocateChecked(false, true, *token_bytes).status();
}

absl::StatusOr<size_t> MoeLayerRunner::Impl::AllocateChecked(bool token_side, bool expert_side,
                                                             size_t before) {
  estimate_.emplace();
  MOEPLAN_RETURN_IF_ERROR(AllocateBuffers(token_side, expert_side));
  const Estimate need = *estimate_;
  estimate_.reset();
  const size_t total = before + need.total;
  if (opt_.memory_limit_bytes > 0 && total > opt_.memory_limit_bytes) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    return absl::ResourceExhaustedError(fmt::format(
        "memory: the {} schedule needs {:.2f} GiB per rank, over the {:.2f} GiB it may use ({}); "
        "the largest tensor is {} ({:.2f} GiB): lower batch_size * seq_len, model_dim, "
        "hidden_dim, num_experts or capacity_factor{}, or use more ranks",
        planner::ScheduleName(opt_.schedule), total / kGiB, opt_.memory_limit_bytes / kGiB,
        opt_.memory_limit_source, need.largest_name, need.largest / kGiB,
        dropless_ ? " (dropless: the heaviest rank's routed rows)" : ""));
  }
  MOEPLAN_RETURN_IF_ERROR(AllocateBuffers(token_side, expert_side));
  return need.total;
}

absl::Status MoeLayerRunner::Impl::AllocateBuffers(bool token_side, bool expert_side) {
  if (expert_side) {
    const int64_t tokens = dropless_ ? recv_cap_ * M_ : xshape_.TokenElements();
    const int64_t hidden = dropless_ ? recv_cap_ * Hs_ : xshape_.HiddenElements();
    for (DeviceBuffer* b : {&z_, &a_, &dz_}) {
      MOEPLAN_RETURN_IF_ERROR(
          Alloc(b, hidden, es_, "an expert hidden activation [E/ep x rows x H/esp]"));
    }
    for (DeviceBuffer* b : {&ein_, &eout_, &dein_, &deout_}) {
      MOEPLAN_RETURN_IF_ERROR(Alloc(b, tokens, es_, "an expert input/output [E/ep x rows x M]"));
    }
  }
  if (!token_side) return absl::OkStatus();
  const int64_t tok = S_ * M_;
  const int64_t buf = bshape_.BufferElements();  // E * T * M
  const int64_t part = E_ * part_rows_ * M_;     // what one rank dispatches
  MOEPLAN_RETURN_IF_ERROR(Alloc(&x_, tok, es_, "the input x [S x M]"));
  MOEPLAN_RETURN_IF_ERROR(Alloc(&dy_, tok, es_, "the output gradient dy [S x M]"));
  MOEPLAN_RETURN_IF_ERROR(Alloc(&y_, tok, es_, "the output y [S x M]"));
  MOEPLAN_RETURN_IF_ERROR(Alloc(&dx_, tok, es_, "the input gradient dx [S x M]"));
  if (opt_.schedule == Schedule::kS1) {
    for (DeviceBuffer* b : {&xs_, &ys_, &dys_, &dxs_}) {
      MOEPLAN_RETURN_IF_ERROR(Alloc(b, gated_ * M_, es_, "an S1 token slice [S/mp x M]"));
    }
  }
  if (dt_ != DType::kF32) {
    MOEPLAN_RETURN_IF_ERROR(Alloc(&x32_, gated_ * M_, 4, "the fp32 gate input [S x M]"));
    MOEPLAN_RETURN_IF_ERROR(Alloc(&dxg32_, gated_ * M_, 4, "the fp32 gate input gradient"));
  }
  for (DeviceBuffer* b : {&logits_, &probs_, &dlogits_}) {
    MOEPLAN_RETURN_IF_ERROR(Alloc(b, gated_ * E_, 4, "the gate logits [S x E]"));
  }
  for (DeviceBuffer* b : {&expert_, &slot_, &weight_, &dweight_}) {
    MOEPLAN_RETURN_IF_ERROR(Alloc(b, gated_ * K_, 4, "the routing table [S x k]"));
  }
  MOEPLAN_RETURN_IF_ERROR(Alloc(&wg_, M_ * E_, 4, "the gate weight [M x E]"));
  if (opt_.skew_exponent > 0.0) {
    MOEPLAN_RETURN_IF_ERROR(Alloc(&ones_, gated_, 4, "the gate bias's ones [S]"));
    MOEPLAN_RETURN_IF_ERROR(Alloc(&skew_bias_, E_, 4, "the gate bias [E]"));
  }
  MOEPLAN_RETURN_IF_ERROR(Alloc(&dwg_, M_ * E_, 4, "the gate weight gradient [M x E]"));
  route_ = RouteBuffers{probs_.as<float>(), expert_.as<int32_t>(), slot_.as<int32_t>(),
                        weight_.as<float>()};

  for (DeviceBuffer* b : {&w1_, &w2_, &dw1_, &dw2_}) {
    MOEPLAN_RETURN_IF_ERROR(
        Alloc(b, xshape_.WeightElements(), es_, "an expert weight shard [E/ep x M x H/esp]"));
  }
  if (dropless_) {
    for (DeviceBuffer* b : {&flat_expert_, &flat_slot_}) {
      MOEPLAN_RETURN_IF_ERROR(Alloc(b, gated_ * K_, 4, "the compact routing table [S x k]"));
    }
    flat_ = RouteBuffers{probs_.as<float>(), flat_expert_.as<int32_t>(), flat_slot_.as<int32_t>(),
                         weight_.as<float>()};
  }
  for (DeviceBuffer* b : {&disp_, &ddisp_, &comb_, &dcomb_}) {
    MOEPLAN_RETURN_IF_ERROR(Alloc(b, buf, es_, "a dispatch/combine buffer [E x capacity x M]"));
  }
  if (opt_.schedule != Schedule::kDefault) {
    // S1: AlltoAll results before the gather / after the scatter; S2: the
    // rank's part, SAA receive buffers and the dual's staging.
    for (DeviceBuffer* b : {&part_, &dpart_, &recv_, &drecv_, &back_, &dback_, &stage_}) {
      MOEPLAN_RETURN_IF_ERROR(Alloc(b, part, es_, "an AlltoAll part [E x capacity/mp x M]"));
    }
  }
  return absl::OkStatus();
}

absl::Status MoeLayerRunner::Impl::FillInputs() {
  const uint64_t seed = opt_.seed;
  const float ws1 = 1.0f / std::sqrt(static_cast<float>(M_));
  const float ws2 = 1.0f / std::sqrt(static_cast<float>(H_));
  std::vector<float> host;
  std::vector<uint16_t> half;
  auto upload = [&](DeviceBuffer& b, DType t) { return UploadAs(*dev_, b.data(), host, t, &half); };

  const uint64_t g = static_cast<uint64_t>(place_.mp_group);
  const uint64_t tok = static_cast<uint64_t>(S_ * M_);
  host.resize(tok);
  for (uint64_t i = 0; i < tok; ++i) host[i] = SeededValue(seed, kTensorX, g * tok + i, 1.0f);
  MOEPLAN_RETURN_IF_ERROR(upload(x_, dt_));
  for (uint64_t i = 0; i < tok; ++i) host[i] = SeededValue(seed, kTensorDy, g * tok + i, 1.0f);
  MOEPLAN_RETURN_IF_ERROR(upload(dy_, dt_));

  host.resize(static_cast<size_t>(M_ * E_));
  for (size_t i = 0; i < host.size(); ++i) host[i] = SeededValue(seed, kTensorGate, i, ws1);
  MOEPLAN_RETURN_IF_ERROR(upload(wg_, DType::kF32));
  if (opt_.skew_exponent > 0.0) {
    host = SkewBias(E_, opt_.skew_exponent, seed);
    MOEPLAN_RETURN_IF_ERROR(upload(skew_bias_, DType::kF32));
    host.assign(static_cast<size_t>(gated_), 1.0f);
    MOEPLAN_RETURN_IF_ERROR(upload(ones_, DType::kF32));
  }

  // Expert shards: global expert e = ep_rank * El + l, global hidden column
  // h = esp_rank * Hs + j.
  host.resize(static_cast<size_t>(xshape_.WeightElements()));
  const int64_t e0 = int64_t{place_.ep_rank} * El_, h0 = int64_t{place_.esp_rank} * Hs_;
  size_t i = 0;
  for (int64_t l = 0; l < El_; ++l) {
    for (int64_t m = 0; m < M_; ++m) {
      for (int64_t j = 0; j < Hs_; ++j) {
        host[i++] = SeededValue(seed, kTensorW1,
                                static_cast<uint64_t>(((e0 + l) * M_ + m) * H_ + h0 + j), ws1);
      }
    }
  }
  MOEPLAN_RETURN_IF_ERROR(upload(w1_, dt_));
  i = 0;
  for (int64_t l = 0; l < El_; ++l) {
    for (int64_t j = 0; j < Hs_; ++j) {
      for (int64_t m = 0; m < M_; ++m) {
        host[i++] = SeededValue(seed, kTensorW2,
                                static_cast<uint64_t>(((e0 + l) * H_ + h0 + j) * M_ + m), ws2);
      }
    }
  }
  return upload(w2_, dt_);
}

// fwd.gate: logits = x Wg in fp32, then softmax, top-k and capacity.
absl::Status MoeLayerRunner::Impl::GateForward(const void* x) {
  const float* x32 = static_cast<const float*>(x);
  if (dt_ != DType::kF32) {
    MOEPLAN_RETURN_IF_ERROR(k_->ToF32(x, dt_, x32_.as<float>(), gated_ * M_));
    x32 = x32_.as<float>();
  }
  MOEPLAN_RETURN_IF_ERROR(k_->Gemm(false, false, gated_, E_, M_, 1.0f, x32, M_, wg_.data(), E_,
                                   0.0f, logits_.data(), E_, DType::kF32));
  if (opt_.skew_exponent > 0.0) {
    MOEPLAN_RETURN_IF_ERROR(k_->Gemm(false, false, gated_, E_, 1, 1.0f, ones_.data(), 1,
                                     skew_bias_.data(), E_, 1.0f, logits_.data(), E_, DType::kF32));
  }
  return k_->Route(logits_.as<float>(), gated_, E_, K_, route_cap_, route_);
}

// bwd.gate: through the chosen probabilities to the logits, then dWg = x^T
// dlogits and dx += dlogits Wg^T.
absl::Status MoeLayerRunner::Impl::GateBackward(void* dx) {
  MOEPLAN_RETURN_IF_ERROR(
      k_->RouteBackward(route_, dweight_.as<float>(), gated_, E_, K_, dlogits_.as<float>()));
  const void* x32 =
      dt_ == DType::kF32
          ? static_cast<const void*>(opt_.schedule == Schedule::kS1 ? xs_.data() : x_.data())
          : x32_.data();
  MOEPLAN_RETURN_IF_ERROR(k_->Gemm(true, false, M_, E_, gated_, 1.0f, x32, M_, dlogits_.data(), E_,
                                   0.0f, dwg_.data(), E_, DType::kF32));
  if (dt_ == DType::kF32) {
    return k_->Gemm(false, true, gated_, M_, E_, 1.0f, dlogits_.data(), E_, wg_.data(), E_, 1.0f,
                    dx, M_, DType::kF32);
  }
  MOEPLAN_RETURN_IF_ERROR(k_->Gemm(false, true, gated_, M_, E_, 1.0f, dlogits_.data(), E_,
                                   wg_.data(), E_, 0.0f, dxg32_.data(), M_, DType::kF32));
  return k_->AddF32(dx, dt_, dxg32_.as<float>(), gated_ * M_);
}

// fwd.expert on the expert input buffer, the same in every schedule.
absl::Status MoeLayerRunner::Impl::ExpertForward() {
  return Compute("fwd.expert", F, [&] {
    if (dropless_) return RaggedExpertForward();
    return k_->ExpertForward(xshape_, ein_.data(), w1_.data(), w2_.data(), z_.data(), a_.data(),
                             eout_.data());
  });
}

// bwd.expert_dx then bwd.expert_dw (weight gradients scaled by dw_scale_: 1
// except for the default's duplicated tokens).
absl::Status MoeLayerRunner::Impl::ExpertBackward() {
  MOEPLAN_RETURN_IF_ERROR(Compute("bwd.expert_dx", B, [&] {
    if (dropless_) return RaggedExpertBackwardData();
    return k_->ExpertBackwardData(xshape_, deout_.data(), w1_.data(), w2_.data(), z_.data(),
                                  dz_.data(), dein_.data());
  }));
  return Compute("bwd.expert_dw", B, [&] {
    if (dropless_) return RaggedExpertBackwardWeights();
    return k_->ExpertBackwardWeights(xshape_, ein_.data(), a_.data(), deout_.data(), dz_.data(),
                                     dw_scale_, dw1_.data(), dw2_.data());
  });
}

// ---- dropless ----
absl::Status MoeLayerRunner::Impl::CountRoutes() {
  const size_t n = host_expert_.size();
  MOEPLAN_RETURN_IF_ERROR(dev_->Download(host_expert_.data(), expert_.data(), n * 4));
  MOEPLAN_RETURN_IF_ERROR(dev_->Download(host_slot_.data(), slot_.data(), n * 4));
  std::fill(count_.begin(), count_.end(), 0);
  for (const int32_t e : host_expert_) {
    if (e < 0 || e >= E_) {
      return absl::InternalError(Cat("dropless: the gate chose expert ", e, " of ", E_));
    }
    ++count_[static_cast<size_t>(e)];
  }
  int64_t row = 0;
  for (size_t e = 0; e < count_.size(); ++e) {
    expert_off_[e] = row;
    row += count_[e];
  }
  for (size_t i = 0; i < n; ++i) {
    if (host_slot_[i] < 0) {
      return absl::InternalError("dropless: the gate dropped a choice at capacity S");
    }
    const int64_t row = expert_off_[static_cast<size_t>(host_expert_[i])] + host_slot_[i];
    host_flat_expert_[i] = static_cast<int32_t>(row / S_);
    host_flat_[i] = static_cast<int32_t>(row % S_);
  }
  MOEPLAN_RETURN_IF_ERROR(dev_->Upload(flat_expert_.data(), host_flat_expert_.data(), n * 4));
  return dev_->Upload(flat_slot_.data(), host_flat_.data(), n * 4);
}

absl::Status MoeLayerRunner::Impl::ExchangeCounts() {
  if (ep_->size() == 1) {  // the planner has no op for a group of one rank
    std::copy(count_.begin(), count_.end(), peer_count_.begin());
    return SizeExchange();
  }
  const size_t rec = Reserve("fwd.ep_alltoall_counts", -1, F, OpKind::kComm);
  MOEPLAN_ASSIGN_OR_RETURN(recs_[rec].begin, dev_->Record(kComputeLane));
  MOEPLAN_RETURN_IF_ERROR(ep_->ExchangeCounts(count_, absl::MakeSpan(peer_count_)));
  MOEPLAN_ASSIGN_OR_RETURN(recs_[rec].end, dev_->Record(kComputeLane));
  return SizeExchange();
}

absl::Status MoeLayerRunner::Impl::SizeExchange() {
  int64_t received = 0;
  for (int64_t w = 0; w < W_; ++w) {
    const size_t pw = static_cast<size_t>(w), first = static_cast<size_t>(w * El_);
    int64_t sent = 0, from_w = 0;
    for (size_t b = first; b < first + static_cast<size_t>(El_); ++b) {
      sent += count_[b];
      block_off_[b] = received + from_w;
      from_w += peer_count_[b];
    }
    send_n_[pw] = static_cast<size_t>(sent * M_);
    send_off_[pw] = static_cast<size_t>(expert_off_[first] * M_);
    recv_n_[pw] = static_cast<size_t>(from_w * M_);
    recv_off_[pw] = static_cast<size_t>(received * M_);
    received += from_w;
  }
  recv_rows_ = received;
  if (recv_cap_ >= 0 && received > recv_cap_) {
    return absl::InternalError(Cat("dropless: ", received, " rows routed to this rank, over the ",
                                   recv_cap_, " sized at start (the routing changed)"));
  }
  return absl::OkStatus();
}

absl::Status MoeLayerRunner::Impl::RaggedExpertForward() {
  for (int64_t l = 0; l < El_; ++l) {
    MOEPLAN_RETURN_IF_ERROR(ForBlocksOf(l, [&](int64_t r, int64_t o) -> absl::Status {
      void* z = At(z_, o * Hs_);
      void* a = At(a_, o * Hs_);
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(false, false, r, Hs_, M_, 1.0f, At(ein_, o * M_), M_,
                                       At(w1_, l * M_ * Hs_), Hs_, 0.0f, z, Hs_, dt_));
      MOEPLAN_RETURN_IF_ERROR(k_->Activation(z, a, r * Hs_, dt_));
      return k_->Gemm(false, false, r, M_, Hs_, 1.0f, a, Hs_, At(w2_, l * Hs_ * M_), M_, 0.0f,
                      At(eout_, o * M_), M_, dt_);
    }));
  }
  return absl::OkStatus();
}

absl::Status MoeLayerRunner::Impl::RaggedExpertBackwardData() {
  for (int64_t l = 0; l < El_; ++l) {
    MOEPLAN_RETURN_IF_ERROR(ForBlocksOf(l, [&](int64_t r, int64_t o) -> absl::Status {
      void* dz = At(dz_, o * Hs_);
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(false, true, r, Hs_, M_, 1.0f, At(deout_, o * M_), M_,
                                       At(w2_, l * Hs_ * M_), M_, 0.0f, dz, Hs_, dt_));
      MOEPLAN_RETURN_IF_ERROR(k_->ActivationBackward(At(z_, o * Hs_), dz, r * Hs_, dt_));
      return k_->Gemm(false, true, r, M_, Hs_, 1.0f, dz, Hs_, At(w1_, l * M_ * Hs_), Hs_, 0.0f,
                      At(dein_, o * M_), M_, dt_);
    }));
  }
  return absl::OkStatus();
}

// dW2[l] = scale * sum over peers of a^T dout, dW1[l] = scale * sum of x^T dz:
// the first block with rows overwrites, later ones add; no rows at all, zero.
absl::Status MoeLayerRunner::Impl::RaggedExpertBackwardWeights() {
  for (int64_t l = 0; l < El_; ++l) {
    void* dw1 = At(dw1_, l * M_ * Hs_);
    void* dw2 = At(dw2_, l * Hs_ * M_);
    float beta = 0.0f;
    MOEPLAN_RETURN_IF_ERROR(ForBlocksOf(l, [&](int64_t r, int64_t o) -> absl::Status {
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(true, false, Hs_, M_, r, dw_scale_, At(a_, o * Hs_), Hs_,
                                       At(deout_, o * M_), M_, beta, dw2, M_, dt_));
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(true, false, M_, Hs_, r, dw_scale_, At(ein_, o * M_), M_,
                                       At(dz_, o * Hs_), Hs_, beta, dw1, Hs_, dt_));
      beta = 1.0f;
      return absl::OkStatus();
    }));
    if (beta == 0.0f) {
      const size_t bytes = static_cast<size_t>(M_ * Hs_) * es_;
      MOEPLAN_RETURN_IF_ERROR(dev_->Zero(dw1, bytes, kComputeLane));
      MOEPLAN_RETURN_IF_ERROR(dev_->Zero(dw2, bytes, kComputeLane));
    }
  }
  return absl::OkStatus();
}

// ---- default (padded or dropless) ----
absl::Status MoeLayerRunner::Impl::EpExchange(std::string_view name, Phase ph, const void* send,
                                              void* recv, bool to_experts) {
  if (!dropless_) return AlltoAll(name, ph, send, recv, El_ * part_rows_ * M_);
  const size_t* sn = (to_experts ? send_n_ : recv_n_).data();
  const size_t* so = (to_experts ? send_off_ : recv_off_).data();
  const size_t* rn = (to_experts ? recv_n_ : send_n_).data();
  const size_t* ro = (to_experts ? recv_off_ : send_off_).data();
  return Coll(
      name, ph, ep_.get(), [&] { return ep_->StartAlltoAllv(send, sn, so, recv, rn, ro, dt_); },
      [&] {
        return Copy(static_cast<char*>(recv) + ro[0] * es_,
                    static_cast<const char*>(send) + so[0] * es_, static_cast<int64_t>(sn[0]));
      });
}

absl::Status MoeLayerRunner::Impl::ForwardDefault() {
  MOEPLAN_RETURN_IF_ERROR(Compute("fwd.gate", F, [&] { return GateForward(x_.data()); }));
  MOEPLAN_RETURN_IF_ERROR(Compute("fwd.order", F, [&] {
    if (dropless_) MOEPLAN_RETURN_IF_ERROR(CountRoutes());
    return k_->Order(x_.data(), OrderRoute(), bshape_, disp_.data());
  }));
  if (dropless_) MOEPLAN_RETURN_IF_ERROR(ExchangeCounts());
  MOEPLAN_RETURN_IF_ERROR(
      EpExchange("fwd.ep_alltoall_dispatch", F, disp_.data(), ein_.data(), /*to_experts=*/true));
  MOEPLAN_RETURN_IF_ERROR(ExpertForward());
  MOEPLAN_RETURN_IF_ERROR(AllReduceInPlace("fwd.esp_allreduce", F, esp_.get(), eout_.data(),
                                           ExpertTokenElements(), dt_));
  MOEPLAN_RETURN_IF_ERROR(
      EpExchange("fwd.ep_alltoall_combine", F, eout_.data(), comb_.data(), /*to_experts=*/false));
  return Compute("fwd.iorder", F,
                 [&] { return k_->IOrder(comb_.data(), OrderRoute(), bshape_, y_.data()); });
}

absl::Status MoeLayerRunner::Impl::BackwardDefault() {
  MOEPLAN_RETURN_IF_ERROR(Compute("bwd.iorder", B, [&] {
    return k_->IOrderBackward(dy_.data(), comb_.data(), OrderRoute(), bshape_, dcomb_.data(),
                              dweight_.as<float>());
  }));
  MOEPLAN_RETURN_IF_ERROR(EpExchange("bwd.ep_alltoall_combine", B, dcomb_.data(), deout_.data(),
                                     /*to_experts=*/true));
  MOEPLAN_RETURN_IF_ERROR(ExpertBackward());
  MOEPLAN_RETURN_IF_ERROR(AllReduceInPlace("bwd.esp_allreduce", B, esp_.get(), dein_.data(),
                                           ExpertTokenElements(), dt_));
  MOEPLAN_RETURN_IF_ERROR(EpExchange("bwd.ep_alltoall_dispatch", B, dein_.data(), ddisp_.data(),
                                     /*to_experts=*/false));
  MOEPLAN_RETURN_IF_ERROR(Compute("bwd.order", B, [&] {
    return k_->OrderBackward(ddisp_.data(), OrderRoute(), bshape_, dx_.data());
  }));
  return Compute("bwd.gate", B, [&] { return GateBackward(dx_.data()); });
}

// ---- S1 ----
absl::Status MoeLayerRunner::Impl::ForwardS1() {
  const int64_t per_peer = El_ * part_rows_ * M_;
  const int64_t part = E_ * part_rows_ * M_;
  const int64_t slice = gated_ * M_;
  MOEPLAN_RETURN_IF_ERROR(Compute(
      "fwd.mp_split", F, [&] { return Copy(xs_.data(), At(x_, place_.mp_rank * slice), slice); }));
  MOEPLAN_RETURN_IF_ERROR(Compute("fwd.gate", F, [&] { return GateForward(xs_.data()); }));
  MOEPLAN_RETURN_IF_ERROR(Compute(
      "fwd.order", F, [&] { return k_->Order(xs_.data(), route_, bshape_, disp_.data()); }));
  MOEPLAN_RETURN_IF_ERROR(
      AlltoAll("fwd.ep_alltoall_dispatch", F, disp_.data(), recv_.data(), per_peer));
  MOEPLAN_RETURN_IF_ERROR(
      AllGather("fwd.esp_allgather", F, esp_.get(), recv_.data(), ein_.data(), part));
  MOEPLAN_RETURN_IF_ERROR(ExpertForward());
  MOEPLAN_RETURN_IF_ERROR(
      ReduceScatter("fwd.esp_reducescatter", F, esp_.get(), eout_.data(), back_.data(), part));
  MOEPLAN_RETURN_IF_ERROR(
      AlltoAll("fwd.ep_alltoall_combine", F, back_.data(), comb_.data(), per_peer));
  MOEPLAN_RETURN_IF_ERROR(Compute(
      "fwd.iorder", F, [&] { return k_->IOrder(comb_.data(), route_, bshape_, ys_.data()); }));
  return AllGather("fwd.mp_allgather", F, mp_.get(), ys_.data(), y_.data(), slice);
}

absl::Status MoeLayerRunner::Impl::BackwardS1() {
  const int64_t per_peer = El_ * part_rows_ * M_;
  const int64_t part = E_ * part_rows_ * M_;
  const int64_t slice = gated_ * M_;
  MOEPLAN_RETURN_IF_ERROR(Compute("bwd.mp_split", B, [&] {
    return Copy(dys_.data(), At(dy_, place_.mp_rank * slice), slice);
  }));
  MOEPLAN_RETURN_IF_ERROR(Compute("bwd.iorder", B, [&] {
    return k_->IOrderBackward(dys_.data(), comb_.data(), route_, bshape_, dcomb_.data(),
                              dweight_.as<float>());
  }));
  MOEPLAN_RETURN_IF_ERROR(
      AlltoAll("bwd.ep_alltoall_combine", B, dcomb_.data(), drecv_.data(), per_peer));
  MOEPLAN_RETURN_IF_ERROR(
      AllGather("bwd.esp_allgather", B, esp_.get(), drecv_.data(), deout_.data(), part));
  MOEPLAN_RETURN_IF_ERROR(ExpertBackward());
  MOEPLAN_RETURN_IF_ERROR(
      ReduceScatter("bwd.esp_reducescatter", B, esp_.get(), dein_.data(), dback_.data(), part));
  MOEPLAN_RETURN_IF_ERROR(
      AlltoAll("bwd.ep_alltoall_dispatch", B, dback_.data(), ddisp_.data(), per_peer));
  MOEPLAN_RETURN_IF_ERROR(Compute("bwd.order", B, [&] {
    return k_->OrderBackward(ddisp_.data(), route_, bshape_, dxs_.data());
  }));
  MOEPLAN_RETURN_IF_ERROR(Compute("bwd.gate", B, [&] { return GateBackward(dxs_.data()); }));
  // The gate saw only this rank's S/N tokens: sum its gradient over the MP group.
  MOEPLAN_RETURN_IF_ERROR(
      AllReduceInPlace("bwd.mp_allreduce_gate", B, mp_.get(), dwg_.data(), M_ * E_, DType::kF32));
  return AllGather("bwd.mp_allgather", B, mp_.get(), dxs_.data(), dx_.data(), slice);
}

// ---- S2 ----
absl::Status MoeLayerRunner::Impl::ForwardS2() {
  const int64_t part = E_ * part_rows_ * M_;  // the MP rank's part
  MOEPLAN_RETURN_IF_ERROR(Compute("fwd.gate", F, [&] { return GateForward(x_.data()); }));
  MOEPLAN_RETURN_IF_ERROR(
      Compute("fwd.order", F, [&] { return k_->Order(x_.data(), route_, bshape_, disp_.data()); }));
  MOEPLAN_RETURN_IF_ERROR(Compute("fwd.mp_split", F, [&] {
    return Copy(part_.data(), At(disp_, place_.mp_rank * part), part);
  }));
  MOEPLAN_RETURN_IF_ERROR(
      SaaGather(Saa(esp_.get(), "fwd.saa_dispatch.alltoall", "fwd.saa_dispatch.allgather", F),
                part_.data(), recv_.data(), ein_.data()));
  MOEPLAN_RETURN_IF_ERROR(ExpertForward());
  MOEPLAN_RETURN_IF_ERROR(
      ReduceScatter("fwd.esp_reducescatter", F, esp_.get(), eout_.data(), back_.data(), part));
  // Chunk c back from EP rank c holds this rank's tokens on c's experts: MP
  // member n's copy lands in part n, experts c*El... of the full buffer.
  MOEPLAN_RETURN_IF_ERROR(
      SaaGather(Saa(mp_.get(), "fwd.saa_combine.alltoall", "fwd.saa_combine.allgather", F),
                back_.data(), dback_.data(), comb_.data()));
  return Compute("fwd.iorder", F,
                 [&] { return k_->IOrder(comb_.data(), route_, bshape_, y_.data()); });
}

absl::Status MoeLayerRunner::Impl::BackwardS2() {
  const int64_t part = E_ * part_rows_ * M_;
  MOEPLAN_RETURN_IF_ERROR(Compute("bwd.iorder", B, [&] {
    return k_->IOrderBackward(dy_.data(), comb_.data(), route_, bshape_, dcomb_.data(),
                              dweight_.as<float>());
  }));
  MOEPLAN_RETURN_IF_ERROR(Compute("bwd.mp_split", B, [&] {
    return Copy(dpart_.data(), At(dcomb_, place_.mp_rank * part), part);
  }));
  // The combine's AlltoAll fused with the ESP-AllGather dual of the forward
  // ESP-ReduceScatter: lands in the expert input's layout.
  MOEPLAN_RETURN_IF_ERROR(
      SaaGather(Saa(esp_.get(), "bwd.saa_combine.alltoall", "bwd.saa_combine.allgather", B),
                dpart_.data(), drecv_.data(), deout_.data()));
  MOEPLAN_RETURN_IF_ERROR(ExpertBackward());
  MOEPLAN_RETURN_IF_ERROR(
      SaaScatter(Saa(esp_.get(), "bwd.saa_dispatch.alltoall", "bwd.saa_dispatch.reducescatter", B),
                 dein_.data(), stage_.data(), recv_.data()));
  MOEPLAN_RETURN_IF_ERROR(
      AllGather("bwd.mp_allgather", B, mp_.get(), recv_.data(), ddisp_.data(), part));
  MOEPLAN_RETURN_IF_ERROR(Compute("bwd.order", B, [&] {
    return k_->OrderBackward(ddisp_.data(), route_, bshape_, dx_.data());
  }));
  return Compute("bwd.gate", B, [&] { return GateBackward(dx_.data()); });
}

absl::Status MoeLayerRunner::Impl::RunIteration() {
  nrec_ = 0;
  MOEPLAN_RETURN_IF_ERROR(world_->Barrier());
  MOEPLAN_ASSIGN_OR_RETURN(Stamp t0, dev_->Record(kComputeLane));
  switch (opt_.schedule) {
    case Schedule::kDefault:
      MOEPLAN_RETURN_IF_ERROR(ForwardDefault());
      MOEPLAN_RETURN_IF_ERROR(BackwardDefault());
      break;
    case Schedule::kS1:
      MOEPLAN_RETURN_IF_ERROR(ForwardS1());
      MOEPLAN_RETURN_IF_ERROR(BackwardS1());
      break;
    case Schedule::kS2:
      MOEPLAN_RETURN_IF_ERROR(ForwardS2());
      MOEPLAN_RETURN_IF_ERROR(BackwardS2());
      break;
  }
  MOEPLAN_RETURN_IF_ERROR(dev_->Synchronize());
  times_.resize(nrec_);
  forward_us_ = total_us_ = 0.0;
  for (size_t i = 0; i < nrec_; ++i) {
    const Rec& r = recs_[i];
    OpTime& t = times_[i];
    t.name.assign(r.name);
    t.phase = r.phase;
    t.kind = r.kind;
    MOEPLAN_ASSIGN_OR_RETURN(t.start_us, dev_->ElapsedUs(t0, r.begin));
    MOEPLAN_ASSIGN_OR_RETURN(t.end_us, dev_->ElapsedUs(t0, r.end));
    total_us_ = std::max(total_us_, t.end_us);
    if (r.phase == F) forward_us_ = std::max(forward_us_, t.end_us);
  }
  dev_->RecycleStamps();
  return absl::OkStatus();
}

absl::StatusOr<LayerResults> MoeLayerRunner::Impl::Results() {
  MOEPLAN_RETURN_IF_ERROR(dev_->Synchronize());
  LayerResults r;
  std::vector<uint16_t> half;
  auto fetch = [&](const DeviceBuffer& b, int64_t n, DType t, std::vector<float>* out) {
    out->resize(static_cast<size_t>(n));
    return DownloadAs(*dev_, absl::MakeSpan(*out), b.data(), t, &half);
  };
  MOEPLAN_RETURN_IF_ERROR(fetch(y_, S_ * M_, dt_, &r.y));
  MOEPLAN_RETURN_IF_ERROR(fetch(dx_, S_ * M_, dt_, &r.dx));
  MOEPLAN_RETURN_IF_ERROR(fetch(dwg_, M_ * E_, DType::kF32, &r.dgate));
  MOEPLAN_RETURN_IF_ERROR(fetch(dw1_, xshape_.WeightElements(), dt_, &r.dw1));
  MOEPLAN_RETURN_IF_ERROR(fetch(dw2_, xshape_.WeightElements(), dt_, &r.dw2));
  r.route_offset = opt_.schedule == Schedule::kS1 ? place_.mp_rank * gated_ : 0;
  r.expert.resize(static_cast<size_t>(gated_ * K_));
  r.slot.resize(r.expert.size());
  MOEPLAN_RETURN_IF_ERROR(dev_->Download(r.expert.data(), expert_.data(), r.expert.size() * 4));
  MOEPLAN_RETURN_IF_ERROR(dev_->Download(r.slot.data(), slot_.data(), r.slot.size() * 4));
  return r;
}

absl::StatusOr<RouteCounts> MoeLayerRunner::Impl::Routing() {
  MOEPLAN_RETURN_IF_ERROR(dev_->Synchronize());
  const size_t n = static_cast<size_t>(gated_ * K_);
  std::vector<int32_t> expert(n), slot(n);
  MOEPLAN_RETURN_IF_ERROR(dev_->Download(expert.data(), expert_.data(), n * 4));
  MOEPLAN_RETURN_IF_ERROR(dev_->Download(slot.data(), slot_.data(), n * 4));
  RouteCounts c;
  c.routed.assign(static_cast<size_t>(E_), 0);
  for (size_t i = 0; i < n; ++i) {
    if (expert[i] >= 0 && expert[i] < E_) ++c.routed[static_cast<size_t>(expert[i])];
    if (slot[i] < 0) ++c.dropped;
  }
  return c;
}

// ---- the public face ----
MoeLayerRunner::MoeLayerRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MoeLayerRunner::~MoeLayerRunner() = default;

absl::StatusOr<std::unique_ptr<MoeLayerRunner>> MoeLayerRunner::Create(
    const planner::LayerConfig& layer, const RunOptions& options, Device* device, Kernels* kernels,
    Communicator* world) {
  auto impl = std::make_unique<Impl>(layer, options, device, kernels, world);
  MOEPLAN_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<MoeLayerRunner>(new MoeLayerRunner(std::move(impl)));
}

absl::Status MoeLayerRunner::RunIteration() { return impl_->RunIteration(); }
const std::vector<OpTime>& MoeLayerRunner::timings() const { return impl_->timings(); }
double MoeLayerRunner::forward_us() const { return impl_->forward_us(); }
double MoeLayerRunner::total_us() const { return impl_->total_us(); }
absl::StatusOr<LayerResults> MoeLayerRunner::Results() { return impl_->Results(); }
absl::StatusOr<RouteCounts> MoeLayerRunner::Routing() { return impl_->Routing(); }
const RankPlace& MoeLayerRunner::place() const { return impl_->place(); }

}  // namespace moeplan::executor
