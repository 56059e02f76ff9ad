// The MoE layer's ops, as the plan states them (moe_layer.h): here its
// buffers sized from the plan, allocated and filled; what each op does is in
// moe_layer_ops.cc, the dropless layer's uneven side in moe_layer_dropless.cc.
// Semantics the buffers follow (docs/executor.md):
//   - x, y, dy, dx are the MP group's [S x M] tokens; the other buffers are
//     sized by the ops that touch them (the planner's element counts), one
//     root per alias class (an identity collective of a one-rank group).
//   - The dispatch buffer of an order op is [parts][E][capacity/parts][M];
//     the expert side is `groups` groups of [E/ep][rows][M].
//   - Dropless (ragged ops): order / i-order fill a compact [k*S][M] buffer,
//     expert by expert; the EP ranks exchange per-expert counts, then an
//     AlltoAllv moves the uneven blocks, and each (peer, local expert) block
//     is one GEMM of its own row count.
#include "moe_layer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::executor {

using planner::Buf;
using planner::ExecKind;
using planner::OpExec;

namespace {

enum Tensor : uint32_t {
  kTensorX = 1,
  kTensorGate = 2,
  kTensorW1 = 3,
  kTensorW2 = 4,
  kTensorDy = 5,
  kTensorSkew = 6
};

std::string Describe(Buf b) {
  switch (b) {
    case Buf::kX:
      return "the input x [S x M]";
    case Buf::kDisp:
    case Buf::kDdisp:
    case Buf::kComb:
    case Buf::kDcomb:
      return Cat("a dispatch/combine buffer [E x capacity x M] (", planner::BufName(b), ")");
    case Buf::kEin:
    case Buf::kEout:
    case Buf::kDein:
    case Buf::kDeout:
      return Cat("an expert input/output [E/ep x rows x M] (", planner::BufName(b), ")");
    default:
      return Cat("the ", planner::BufName(b), " buffer");
  }
}

// The kinds that run on uneven (dropless) blocks: the routing kernels on the
// compact buffer, the experts on ragged blocks, AlltoAllv and the AllReduce of
// the routed rows.
bool RunsUneven(ExecKind k) {
  switch (k) {
    case ExecKind::kOrder:
    case ExecKind::kIOrder:
    case ExecKind::kIOrderBackward:
    case ExecKind::kOrderBackward:
    case ExecKind::kExpertForward:
    case ExecKind::kExpertBackwardData:
    case ExecKind::kExpertBackwardWeights:
    case ExecKind::kAllToAll:
    case ExecKind::kAllReduce:
      return true;
    default:
      return false;
  }
}

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

namespace internal {

absl::StatusOr<std::unique_ptr<MoeLayerOps>> MoeLayerOps::Create(
    const planner::LayerConfig& layer, const planner::OpGraph& plan, int instance, int block,
    const RunOptions& options, const RankGroups* groups, Device* device, Kernels* kernels) {
  std::unique_ptr<MoeLayerOps> ops(new MoeLayerOps(layer, options, groups, device, kernels));
  MOEPLAN_RETURN_IF_ERROR(ops->Init(plan, instance, block));
  return ops;
}

absl::StatusOr<size_t> MoeLayerOps::PlannedBytes(const planner::LayerConfig& layer,
                                                 const planner::OpGraph& plan, int instance,
                                                 int block, const RunOptions& options,
                                                 const RankGroups* groups) {
  // Init's sizing steps without its allocation (no device, no kernels used).
  MoeLayerOps ops(layer, options, groups, nullptr, nullptr);
  ops.SetDimensions();
  ops.ResolveAliases(plan, block);
  for (Buf b : {Buf::kX, Buf::kY, Buf::kDy, Buf::kDx}) ops.Need(b, ops.S_ * ops.M_);
  ops.Need(Buf::kGateGrad, ops.M_ * ops.E_, /*f32=*/true);
  MOEPLAN_RETURN_IF_ERROR(ops.SizeAndRoute(plan, instance).status());
  Estimate need;
  // Dropless: the expert side follows the routing; its token side is the floor.
  MOEPLAN_RETURN_IF_ERROR(ops.Allocate(true, !ops.dropless_, &need));
  return need.total;
}

void MoeLayerOps::Need(Buf b, int64_t elems, bool f32) {
  if (b == Buf::kNone) return;
  const size_t r = Root(b);
  const int64_t bytes = elems * static_cast<int64_t>(f32 ? 4 : es_);
  need_[r] = std::max(need_[r], bytes);
}

int64_t MoeLayerOps::GroupSize(planner::ExecGroup g) const {
  const Communicator* c = groups_->Of(g);
  return c == nullptr ? 1 : c->size();
}

void MoeLayerOps::NeedOf(const OpExec& x, int64_t in, int64_t mid, int64_t out) {
  Need(x.in, in, x.f32);
  Need(x.mid, mid, x.f32);
  Need(x.out, out, x.f32);
}

void MoeLayerOps::MarkExpertSide(Buf b) {
  if (b != Buf::kNone) expert_side_[Root(b)] = true;
}

absl::Status MoeLayerOps::SizeFromOp(const planner::Op& op, const OpExec& x) {
  if (x.ragged && !RunsUneven(x.kind)) {
    return absl::InvalidArgumentError(
        Cat("plan: op ", op.Name(), ": a ", planner::ExecKindName(x.kind),
            " of uneven (dropless) blocks is planned but not executable"));
  }
  switch (x.kind) {
    case ExecKind::kNone:
    case ExecKind::kCounts:
      return absl::OkStatus();
    case ExecKind::kNop:
    case ExecKind::kDenseGemm:
    case ExecKind::kDenseMemory:
    case ExecKind::kSendRecv:
      return absl::InvalidArgumentError(Cat("plan: op ", op.Name(), ": a dense ",
                                            planner::ExecKindName(x.kind),
                                            " is not an op of an MoE layer"));
    case ExecKind::kGate:
    case ExecKind::kGateBackward:
    case ExecKind::kOrder:
    case ExecKind::kIOrder:
    case ExecKind::kIOrderBackward:
    case ExecKind::kOrderBackward:
    case ExecKind::kExpertForward:
    case ExecKind::kExpertBackwardData:
    case ExecKind::kExpertBackwardWeights:
      SizeFromComputeOp(x);
      return absl::OkStatus();
    case ExecKind::kSlice:
    case ExecKind::kAllToAll:
    case ExecKind::kAllReduce:
    case ExecKind::kAllGather:
    case ExecKind::kReduceScatter:
    case ExecKind::kSaaExchange:
    case ExecKind::kSaaGather:
    case ExecKind::kSaaReduce:
      SizeFromCollective(x);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

void MoeLayerOps::SizeFromComputeOp(const OpExec& x) {
  const int64_t tok = x.tokens * M_, buf = OrderShape(x).BufferElements();
  switch (x.kind) {
    case ExecKind::kGate:
      NeedOf(x, tok, 0, 0);
      break;
    case ExecKind::kGateBackward:
      NeedOf(x, tok, 0, tok);
      break;
    case ExecKind::kOrder:
      NeedOf(x, tok, 0, buf);
      break;
    case ExecKind::kIOrder:
      NeedOf(x, buf, 0, tok);
      break;
    case ExecKind::kIOrderBackward:
      NeedOf(x, tok, buf, buf);
      break;
    case ExecKind::kOrderBackward:
      NeedOf(x, buf, 0, tok);
      break;
    default: {         // the expert FFN's forward, input and weight gradients
      if (x.ragged) {  // sized from the routed rows
        for (Buf b : {x.in, x.mid, x.out}) MarkExpertSide(b);
        break;
      }
      const ExpertShape e = ExpertsOf(x);
      NeedOf(x, e.TokenElements(), e.TokenElements(), e.TokenElements());
      hidden_elems_ = std::max(hidden_elems_, e.HiddenElements());
      pre_elems_ = std::max(pre_elems_, e.PreActivationElements());
      break;
    }
  }
}

void MoeLayerOps::SizeFromCollective(const OpExec& x) {
  const int64_t g = GroupSize(x.group), n = x.count;
  switch (x.kind) {
    case ExecKind::kSlice:
      NeedOf(x, n * g, 0, n);
      break;
    case ExecKind::kAllToAll:
      if (x.ragged) {  // the token side is the order ops' compact buffer
        MarkExpertSide(x.to_experts ? x.out : x.in);
      } else {
        NeedOf(x, n * g, 0, n * g);
      }
      break;
    case ExecKind::kAllReduce:
      if (x.ragged) {
        MarkExpertSide(x.in);
      } else {
        NeedOf(x, n, 0, n);
      }
      break;
    case ExecKind::kAllGather:
      NeedOf(x, n, 0, n * g);
      break;
    case ExecKind::kReduceScatter:
      NeedOf(x, n * g, 0, n);
      break;
    case ExecKind::kSaaExchange:
      NeedOf(x, n * g, 0, n * g);
      break;
    case ExecKind::kSaaGather:
    case ExecKind::kSaaReduce: {
      // Chunk c of member m at c*chunk + m*stride; W chunks of the AlltoAll.
      const int64_t w = GroupSize(x.pairs);
      const int64_t strided = (w - 1) * n + (g - 1) * x.stride + n;
      if (x.kind == ExecKind::kSaaGather) {
        NeedOf(x, n * w, n * w, strided);
      } else {
        NeedOf(x, strided, n * w, n * w);
      }
      break;
    }
    default:
      break;
  }
}

absl::Status MoeLayerOps::Init(const planner::OpGraph& plan, int instance, int block) {
  if (!k_->Supports(opt_.dtype)) {
    return absl::InvalidArgumentError(
        Cat("dtype: the ", k_->name(), " kernels do not support ", DTypeName(opt_.dtype)));
  }
  SetDimensions();
  ResolveAliases(plan, block);
  for (Buf b : {Buf::kX, Buf::kY, Buf::kDy, Buf::kDx}) Need(b, S_ * M_);
  Need(Buf::kGateGrad, M_ * E_, /*f32=*/true);
  MOEPLAN_ASSIGN_OR_RETURN(const OpExec* slice_to_gate, SizeAndRoute(plan, instance));
  if (!dropless_) return InitPadded(slice_to_gate);
  if (route_once_) {
    return absl::InvalidArgumentError(
        "plan: a dropless MoE layer without its forward gate (a partitioned forward) is not "
        "executable");
  }
  return InitDropless();
}

void MoeLayerOps::SetDimensions() {
  const planner::ParallelLayout& p = layer_.parallel;
  dt_ = opt_.dtype;
  es_ = SizeOf(dt_);
  S_ = layer_.batch_size * layer_.seq_len;
  M_ = layer_.model_dim;
  H_ = layer_.hidden_dim;
  E_ = layer_.num_experts;
  K_ = layer_.top_k;
  W_ = p.ep;
  El_ = E_ / W_;
  Hs_ = H_ / p.esp;
  F_ = layer_.gated_linear_unit ? 2 * Hs_ : Hs_;
}

void MoeLayerOps::ResolveAliases(const planner::OpGraph& plan, int block) {
  // Alias classes: every buffer resolves to one root.
  for (size_t i = 0; i < kBufs; ++i) root_[i] = i;
  auto find = [&](size_t i) {
    while (root_[i] != i) i = root_[i];
    return i;
  };
  for (const planner::BufAlias& a : plan.aliases()) {
    if (a.block != block) continue;
    const size_t ra = find(static_cast<size_t>(a.buf)), rb = find(static_cast<size_t>(a.same_as));
    if (ra != rb) root_[ra] = rb;
  }
  for (size_t i = 0; i < kBufs; ++i) root_[i] = find(i);
}

absl::StatusOr<const OpExec*> MoeLayerOps::SizeAndRoute(const planner::OpGraph& plan,
                                                        int instance) {
  // How tokens are routed: the forward gate says; an instance without one (a
  // whole model's backward of a partitioned forward, or a piece of Tutel's
  // pipelined exchange) takes it from its gate's backward or its order ops.
  auto rank_of = [](ExecKind k) {
    switch (k) {
      case ExecKind::kGate:
        return 3;
      case ExecKind::kGateBackward:
        return 2;
      case ExecKind::kOrder:
      case ExecKind::kIOrder:
      case ExecKind::kIOrderBackward:
      case ExecKind::kOrderBackward:
        return 1;
      default:
        return 0;
    }
  };
  int routed_by = 0;
  written_.fill(false);
  for (planner::OpId id = 0; id < plan.size(); ++id) {
    const planner::Op& op = plan.op(id);
    const OpExec& x = plan.exec(id);
    if (x.layer != instance) continue;
    dropless_ = dropless_ || x.ragged;
    if (x.out != Buf::kNone) written_[Root(x.out)] = true;
    if (rank_of(x.kind) > routed_by) {
      routed_by = rank_of(x.kind);
      gate_in_ = routed_by == 1 ? Buf::kX : x.in;
      gated_ = x.tokens;
      route_cap_ = x.capacity;
    }
    MOEPLAN_RETURN_IF_ERROR(SizeFromOp(op, x));
  }
  if (routed_by == 0) {
    return absl::InvalidArgumentError("plan: the MoE layer has no gate, gate backward or order op");
  }
  route_once_ = routed_by < 3;
  // A gate on an MP slice of x (S1) routes the slice's tokens.
  const OpExec* slice_to_gate = nullptr;
  for (planner::OpId id = 0; id < plan.size(); ++id) {
    const OpExec& x = plan.exec(id);
    if (x.layer == instance && x.kind == ExecKind::kSlice && Root(x.out) == Root(gate_in_) &&
        Root(x.in) == Root(Buf::kX)) {
      slice_to_gate = &x;
    }
  }
  if (slice_to_gate != nullptr) {
    route_offset_ = int64_t{groups_->Of(slice_to_gate->group)->rank()} * gated_;
  }
  // Sequence parallelism: the layer reads the rank's MP slice of its input
  // (and of the output gradient) and nothing of it writes that slice.
  sp_input_ =
      need_[Root(Buf::kXs)] > 0 && Root(Buf::kXs) != Root(Buf::kX) && !written_[Root(Buf::kXs)];
  if (sp_input_ && gate_in_ == Buf::kXs) {
    route_offset_ = int64_t{groups_->Of(planner::ExecGroup::kMp)->rank()} * gated_;
  }
  return slice_to_gate;
}

absl::Status MoeLayerOps::InitPadded(const OpExec* slice_to_gate) {
  MOEPLAN_RETURN_IF_ERROR(AllocateChecked(true, true, 0).status());
  MOEPLAN_RETURN_IF_ERROR(FillInputs());
  if (!route_once_) return absl::OkStatus();
  // The gate input of the backward's own instance (S1: the slice is its
  // first op) is routed from x.
  MOEPLAN_RETURN_IF_ERROR(GateForward(Ptr(slice_to_gate != nullptr ? Buf::kX : gate_in_)));
  return dev_->Synchronize();
}

absl::Status MoeLayerOps::InitDropless() {
  const size_t n = static_cast<size_t>(gated_ * K_);
  for (std::vector<int32_t>* v : {&host_expert_, &host_slot_, &host_flat_expert_, &host_flat_}) {
    v->resize(n);
  }
  for (std::vector<int64_t>* v : {&count_, &expert_off_, &peer_count_, &block_off_}) {
    v->assign(static_cast<size_t>(E_), 0);
  }
  for (std::vector<size_t>* v : {&send_n_, &send_off_, &recv_n_, &recv_off_}) {
    v->assign(static_cast<size_t>(W_), 0);
  }
  // Routing is a pure function of the seeded inputs, the same every
  // iteration: one untimed gate pass and count exchange size the expert side.
  absl::StatusOr<size_t> token_bytes = AllocateChecked(true, false, 0);
  absl::Status routed = token_bytes.status();
  if (routed.ok()) routed = FillInputs();
  if (routed.ok()) routed = GateForward(Ptr(gate_in_));
  if (routed.ok()) routed = CountRoutes();
  // Every rank takes part in the exchange whatever happened above, so that
  // none is left waiting in it; the errors are returned after.
  if (!routed.ok()) std::fill(count_.begin(), count_.end(), 0);
  const absl::Status exchanged =
      groups_->Of(planner::ExecGroup::kEp)->ExchangeCounts(count_, absl::MakeSpan(peer_count_));
  MOEPLAN_RETURN_IF_ERROR(routed);
  MOEPLAN_RETURN_IF_ERROR(exchanged);
  recv_cap_ = -1;  // not sized yet: SizeExchange accepts any row count
  MOEPLAN_RETURN_IF_ERROR(SizeExchange());
  recv_cap_ = recv_rows_;
  for (size_t r = 0; r < kBufs; ++r) {
    if (expert_side_[r]) need_[r] = recv_cap_ * M_ * static_cast<int64_t>(es_);
  }
  return AllocateChecked(false, true, *token_bytes).status();
}

absl::StatusOr<size_t> MoeLayerOps::AllocateChecked(bool token_side, bool expert_side,
                                                    size_t before) {
  Estimate need;
  MOEPLAN_RETURN_IF_ERROR(Allocate(token_side, expert_side, &need));
  const size_t total = before + need.total;
  if (opt_.memory_limit_bytes > 0 && total > opt_.memory_limit_bytes) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    return absl::ResourceExhaustedError(
        fmt::format("memory: {} needs {:.2f} GiB per rank, over the {:.2f} GiB it may use ({}); "
                    "the largest tensor is {} ({:.2f} GiB): lower batch_size * seq_len, model_dim, "
                    "hidden_dim, num_experts or capacity_factor{}, or use more ranks",
                    opt_.plan_name, total / kGiB, opt_.memory_limit_bytes / kGiB,
                    opt_.memory_limit_source, need.largest_name, need.largest / kGiB,
                    dropless_ ? " (dropless: the heaviest rank's routed rows)" : ""));
  }
  MOEPLAN_RETURN_IF_ERROR(Allocate(token_side, expert_side, nullptr));
  return need.total;
}

absl::Status MoeLayerOps::Allocate(bool token_side, bool expert_side, Estimate* estimate) {
  auto alloc = [&](DeviceBuffer* b, int64_t elems, size_t elem_size,
                   std::string_view what) -> absl::Status {
    const size_t bytes = static_cast<size_t>(elems) * elem_size;
    if (estimate != nullptr) {
      estimate->total += bytes;
      if (bytes > estimate->largest) {
        estimate->largest = bytes;
        estimate->largest_name = std::string(what);
      }
      return absl::OkStatus();
    }
    MOEPLAN_ASSIGN_OR_RETURN(*b, DeviceBuffer::Make(dev_, bytes));
    return absl::OkStatus();
  };
  for (size_t r = 0; r < kBufs; ++r) {
    if (root_[r] != r || need_[r] == 0) continue;
    if (expert_side_[r] ? !expert_side : !token_side) continue;
    MOEPLAN_RETURN_IF_ERROR(alloc(&buf_[r], need_[r], 1, Describe(static_cast<Buf>(r))));
  }
  if (expert_side) {
    const int64_t hidden = dropless_ ? recv_cap_ * Hs_ : hidden_elems_;
    const int64_t pre = dropless_ ? recv_cap_ * F_ : pre_elems_;
    MOEPLAN_RETURN_IF_ERROR(
        alloc(&a_, hidden, es_, "an expert hidden activation [E/ep x rows x H/esp]"));
    for (DeviceBuffer* b : {&z_, &dz_}) {
      MOEPLAN_RETURN_IF_ERROR(alloc(b, pre, es_,
                                    layer_.gated_linear_unit
                                        ? "an expert pre-activation [E/ep x rows x 2H/esp]"
                                        : "an expert hidden activation [E/ep x rows x H/esp]"));
    }
  }
  if (!token_side) return absl::OkStatus();
  if (dt_ != DType::kF32) {
    MOEPLAN_RETURN_IF_ERROR(alloc(&x32_, gated_ * M_, 4, "the fp32 gate input [S x M]"));
    MOEPLAN_RETURN_IF_ERROR(alloc(&dxg32_, gated_ * M_, 4, "the fp32 gate input gradient"));
  }
  for (DeviceBuffer* b : {&logits_, &probs_, &dlogits_}) {
    MOEPLAN_RETURN_IF_ERROR(alloc(b, gated_ * E_, 4, "the gate logits [S x E]"));
  }
  for (DeviceBuffer* b : {&expert_, &slot_, &weight_, &dweight_}) {
    MOEPLAN_RETURN_IF_ERROR(alloc(b, gated_ * K_, 4, "the routing table [S x k]"));
  }
  MOEPLAN_RETURN_IF_ERROR(alloc(&wg_, M_ * E_, 4, "the gate weight [M x E]"));
  if (opt_.skew_exponent > 0.0) {
    MOEPLAN_RETURN_IF_ERROR(alloc(&ones_, gated_, 4, "the gate bias's ones [S]"));
    MOEPLAN_RETURN_IF_ERROR(alloc(&skew_bias_, E_, 4, "the gate bias [E]"));
  }
  for (DeviceBuffer* b : {&w1_, &dw1_}) {
    MOEPLAN_RETURN_IF_ERROR(alloc(b, El_ * M_ * F_, es_,
                                  layer_.gated_linear_unit
                                      ? "an expert weight shard [E/ep x M x 2H/esp]"
                                      : "an expert weight shard [E/ep x M x H/esp]"));
  }
  for (DeviceBuffer* b : {&w2_, &dw2_}) {
    MOEPLAN_RETURN_IF_ERROR(
        alloc(b, El_ * Hs_ * M_, es_, "an expert weight shard [E/ep x H/esp x M]"));
  }
  if (dropless_) {
    for (DeviceBuffer* b : {&flat_expert_, &flat_slot_}) {
      MOEPLAN_RETURN_IF_ERROR(alloc(b, gated_ * K_, 4, "the compact routing table [S x k]"));
    }
  }
  if (estimate == nullptr) {
    route_ = RouteBuffers{probs_.as<float>(), expert_.as<int32_t>(), slot_.as<int32_t>(),
                          weight_.as<float>()};
    flat_ = RouteBuffers{probs_.as<float>(), flat_expert_.as<int32_t>(), flat_slot_.as<int32_t>(),
                         weight_.as<float>()};
  }
  return absl::OkStatus();
}

absl::Status MoeLayerOps::FillInputs() {
  const uint64_t seed = opt_.seed;
  const RankPlace& place = groups_->place();
  const float ws1 = 1.0f / std::sqrt(static_cast<float>(M_));
  const float ws2 = 1.0f / std::sqrt(static_cast<float>(H_));
  std::vector<float> host;
  std::vector<uint16_t> half;
  auto upload = [&](void* dst, DType t) { return UploadAs(*dev_, dst, host, t, &half); };

  const uint64_t g = static_cast<uint64_t>(place.mp_group);
  const uint64_t tok = static_cast<uint64_t>(S_ * M_);
  host.resize(tok);
  for (uint64_t i = 0; i < tok; ++i) host[i] = SeededValue(seed, kTensorX, g * tok + i, 1.0f);
  MOEPLAN_RETURN_IF_ERROR(upload(Ptr(Buf::kX), dt_));
  for (uint64_t i = 0; i < tok; ++i) host[i] = SeededValue(seed, kTensorDy, g * tok + i, 1.0f);
  MOEPLAN_RETURN_IF_ERROR(upload(Ptr(Buf::kDy), dt_));
  if (sp_input_) {  // the rank's rows of x and dy: its MP rank's slice of the group's
    const int64_t n = groups_->Of(planner::ExecGroup::kMp)->size();
    const uint64_t slice = tok / static_cast<uint64_t>(n);
    const uint64_t at = g * tok + static_cast<uint64_t>(place.mp_rank) * slice;
    for (const auto& [b, t] : {std::pair{Buf::kXs, kTensorX}, std::pair{Buf::kDys, kTensorDy}}) {
      if (need_[Root(b)] == 0) continue;
      host.resize(slice);
      for (uint64_t i = 0; i < slice; ++i) host[i] = SeededValue(seed, t, at + i, 1.0f);
      MOEPLAN_RETURN_IF_ERROR(upload(Ptr(b), dt_));
    }
  }

  host.resize(static_cast<size_t>(M_ * E_));
  for (size_t i = 0; i < host.size(); ++i) host[i] = SeededValue(seed, kTensorGate, i, ws1);
  MOEPLAN_RETURN_IF_ERROR(upload(wg_.data(), DType::kF32));
  if (opt_.skew_exponent > 0.0) {
    host = SkewBias(E_, opt_.skew_exponent, seed);
    MOEPLAN_RETURN_IF_ERROR(upload(skew_bias_.data(), DType::kF32));
    host.assign(static_cast<size_t>(gated_), 1.0f);
    MOEPLAN_RETURN_IF_ERROR(upload(ones_.data(), DType::kF32));
  }

  // Expert shards: each element the global tensor's (ForW1Shard, ForW2Shard).
  host.resize(static_cast<size_t>(El_ * M_ * F_));
  ForW1Shard([&](size_t i, uint64_t at) { host[i] = SeededValue(seed, kTensorW1, at, ws1); });
  MOEPLAN_RETURN_IF_ERROR(upload(w1_.data(), dt_));
  host.resize(static_cast<size_t>(El_ * Hs_ * M_));
  ForW2Shard([&](size_t i, uint64_t at) { host[i] = SeededValue(seed, kTensorW2, at, ws2); });
  return upload(w2_.data(), dt_);
}

size_t MoeLayerOps::AllocatedBytes() const {
  size_t n = 0;
  for (const DeviceBuffer& b : buf_) n += b.bytes();
  for (const DeviceBuffer* b :
       {&x32_,     &dxg32_,   &logits_, &probs_,     &expert_, &slot_,        &weight_,
        &dweight_, &dlogits_, &ones_,   &skew_bias_, &wg_,     &w1_,          &w2_,
        &dw1_,     &dw2_,     &z_,      &a_,         &dz_,     &flat_expert_, &flat_slot_}) {
    n += b->bytes();
  }
  return n;
}

}  // namespace internal
}  // namespace moeplan::executor
