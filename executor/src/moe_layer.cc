// The MoE layer's ops, as the plan states them (moe_layer.h). Semantics the
// buffers follow (docs/executor.md):
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

void MoeLayerOps::Need(Buf b, int64_t elems, bool f32) {
  if (b == Buf::kNone) return;
  const size_t r = Root(b);
  const int64_t bytes = elems * static_cast<int64_t>(f32 ? 4 : es_);
  need_[r] = std::max(need_[r], bytes);
}

absl::Status MoeLayerOps::SizeFromOp(const planner::Op& op, const OpExec& x) {
  auto size_of = [&](planner::ExecGroup g) -> int64_t {
    const Communicator* c = groups_->Of(g);
    return c == nullptr ? 1 : c->size();
  };
  // Elements the op needs of its in, mid and out buffers.
  auto need = [&](int64_t in, int64_t mid, int64_t out) {
    Need(x.in, in, x.f32);
    Need(x.mid, mid, x.f32);
    Need(x.out, out, x.f32);
  };
  auto expert_side = [&](Buf b) {
    if (b != Buf::kNone) expert_side_[Root(b)] = true;
  };
  const int64_t tok = x.tokens * M_, buf = OrderShape(x).BufferElements();
  const int64_t g = size_of(x.group), n = x.count;
  if (x.ragged && !RunsUneven(x.kind)) {
    return absl::InvalidArgumentError(
        Cat("plan: op ", op.Name(), ": a ", planner::ExecKindName(x.kind),
            " of uneven (dropless) blocks is planned but not executable"));
  }
  switch (x.kind) {
    case ExecKind::kNone:
    case ExecKind::kCounts:
      break;
    case ExecKind::kNop:
    case ExecKind::kDenseGemm:
    case ExecKind::kDenseMemory:
    case ExecKind::kSendRecv:
      return absl::InvalidArgumentError(Cat("plan: op ", op.Name(), ": a dense ",
                                            planner::ExecKindName(x.kind),
                                            " is not an op of an MoE layer"));
    case ExecKind::kGate:
      need(tok, 0, 0);
      break;
    case ExecKind::kGateBackward:
      need(tok, 0, tok);
      break;
    case ExecKind::kOrder:
      need(tok, 0, buf);
      break;
    case ExecKind::kIOrder:
      need(buf, 0, tok);
      break;
    case ExecKind::kIOrderBackward:
      need(tok, buf, buf);
      break;
    case ExecKind::kOrderBackward:
      need(buf, 0, tok);
      break;
    case ExecKind::kExpertForward:
    case ExecKind::kExpertBackwardData:
    case ExecKind::kExpertBackwardWeights: {
      if (x.ragged) {  // sized from the routed rows
        for (Buf b : {x.in, x.mid, x.out}) expert_side(b);
        break;
      }
      const ExpertShape e = ExpertsOf(x);
      need(e.TokenElements(), e.TokenElements(), e.TokenElements());
      hidden_elems_ = std::max(hidden_elems_, e.HiddenElements());
      break;
    }
    case ExecKind::kSlice:
      need(n * g, 0, n);
      break;
    case ExecKind::kAllToAll:
      if (x.ragged) {  // the token side is the order ops' compact buffer
        expert_side(x.to_experts ? x.out : x.in);
      } else {
        need(n * g, 0, n * g);
      }
      break;
    case ExecKind::kAllReduce:
      if (x.ragged) {
        expert_side(x.in);
      } else {
        need(n, 0, n);
      }
      break;
    case ExecKind::kAllGather:
      need(n, 0, n * g);
      break;
    case ExecKind::kReduceScatter:
      need(n * g, 0, n);
      break;
    case ExecKind::kSaaExchange:
      need(n * g, 0, n * g);
      break;
    case ExecKind::kSaaGather:
    case ExecKind::kSaaReduce: {
      // Chunk c of member m at c*chunk + m*stride; W chunks of the AlltoAll.
      const int64_t w = size_of(x.pairs);
      const int64_t strided = (w - 1) * n + (g - 1) * x.stride + n;
      if (x.kind == ExecKind::kSaaGather) {
        need(n * w, n * w, strided);
      } else {
        need(strided, n * w, n * w);
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status MoeLayerOps::Init(const planner::OpGraph& plan, int instance, int block) {
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
  W_ = p.ep;
  El_ = E_ / W_;
  Hs_ = H_ / p.esp;

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

  for (Buf b : {Buf::kX, Buf::kY, Buf::kDy, Buf::kDx}) Need(b, S_ * M_);
  Need(Buf::kGateGrad, M_ * E_, /*f32=*/true);
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
  const OpExec* slice_to_gate = nullptr;
  for (planner::OpId id = 0; id < plan.size(); ++id) {
    const planner::Op& op = plan.op(id);
    const OpExec& x = plan.exec(id);
    if (x.layer != instance) continue;
    dropless_ = dropless_ || x.ragged;
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
  if (dropless_) {
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
  }

  if (!dropless_) {
    MOEPLAN_RETURN_IF_ERROR(AllocateChecked(true, true, 0).status());
    MOEPLAN_RETURN_IF_ERROR(FillInputs());
    if (!route_once_) return absl::OkStatus();
    // The gate input of the backward's own instance (S1: the slice is its
    // first op) is routed from x.
    MOEPLAN_RETURN_IF_ERROR(GateForward(Ptr(slice_to_gate != nullptr ? Buf::kX : gate_in_)));
    return dev_->Synchronize();
  }
  if (route_once_) {
    return absl::InvalidArgumentError(
        "plan: a dropless MoE layer without its forward gate (a partitioned forward) is not "
        "executable");
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
    for (DeviceBuffer* b : {&z_, &a_, &dz_}) {
      MOEPLAN_RETURN_IF_ERROR(
          alloc(b, hidden, es_, "an expert hidden activation [E/ep x rows x H/esp]"));
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
  for (DeviceBuffer* b : {&w1_, &w2_, &dw1_, &dw2_}) {
    MOEPLAN_RETURN_IF_ERROR(
        alloc(b, El_ * M_ * Hs_, es_, "an expert weight shard [E/ep x M x H/esp]"));
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

  host.resize(static_cast<size_t>(M_ * E_));
  for (size_t i = 0; i < host.size(); ++i) host[i] = SeededValue(seed, kTensorGate, i, ws1);
  MOEPLAN_RETURN_IF_ERROR(upload(wg_.data(), DType::kF32));
  if (opt_.skew_exponent > 0.0) {
    host = SkewBias(E_, opt_.skew_exponent, seed);
    MOEPLAN_RETURN_IF_ERROR(upload(skew_bias_.data(), DType::kF32));
    host.assign(static_cast<size_t>(gated_), 1.0f);
    MOEPLAN_RETURN_IF_ERROR(upload(ones_.data(), DType::kF32));
  }

  // Expert shards: global expert e = ep_rank * El + l, global hidden column
  // h = esp_rank * Hs + j.
  host.resize(static_cast<size_t>(El_ * M_ * Hs_));
  const int64_t e0 = int64_t{place.ep_rank} * El_, h0 = int64_t{place.esp_rank} * Hs_;
  size_t i = 0;
  for (int64_t l = 0; l < El_; ++l) {
    for (int64_t m = 0; m < M_; ++m) {
      for (int64_t j = 0; j < Hs_; ++j) {
        host[i++] = SeededValue(seed, kTensorW1,
                                static_cast<uint64_t>(((e0 + l) * M_ + m) * H_ + h0 + j), ws1);
      }
    }
  }
  MOEPLAN_RETURN_IF_ERROR(upload(w1_.data(), dt_));
  i = 0;
  for (int64_t l = 0; l < El_; ++l) {
    for (int64_t j = 0; j < Hs_; ++j) {
      for (int64_t m = 0; m < M_; ++m) {
        host[i++] = SeededValue(seed, kTensorW2,
                                static_cast<uint64_t>(((e0 + l) * H_ + h0 + j) * M_ + m), ws2);
      }
    }
  }
  return upload(w2_.data(), dt_);
}

BufferShape MoeLayerOps::OrderShape(const OpExec& x) const {
  BufferShape s;
  s.tokens = x.tokens;
  s.model = M_;
  s.top_k = K_;
  s.dtype = dt_;
  // Dropless: the compact [k*S][M] buffer seen as k "experts" of S slots.
  s.experts = x.ragged ? K_ : E_;
  s.capacity = x.ragged ? x.tokens : x.capacity;
  s.parts = x.ragged ? 1 : x.parts;
  return s;
}

ExpertShape MoeLayerOps::ExpertsOf(const OpExec& x) const {
  ExpertShape e;
  e.groups = x.groups;
  e.local_experts = El_;
  e.rows = x.rows;
  e.model = M_;
  e.shard = Hs_;
  e.dtype = dt_;
  return e;
}

// fwd.gate: logits = x Wg in fp32, then softmax, top-k and capacity.
absl::Status MoeLayerOps::GateForward(const void* x) {
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
absl::Status MoeLayerOps::GateBackward(const void* x, void* dx) {
  MOEPLAN_RETURN_IF_ERROR(
      k_->RouteBackward(route_, dweight_.as<float>(), gated_, E_, K_, dlogits_.as<float>()));
  const void* x32 = dt_ == DType::kF32 ? x : x32_.data();
  MOEPLAN_RETURN_IF_ERROR(k_->Gemm(true, false, M_, E_, gated_, 1.0f, x32, M_, dlogits_.data(), E_,
                                   0.0f, Ptr(Buf::kGateGrad), E_, DType::kF32));
  if (dt_ == DType::kF32) {
    return k_->Gemm(false, true, gated_, M_, E_, 1.0f, dlogits_.data(), E_, wg_.data(), E_, 1.0f,
                    dx, M_, DType::kF32);
  }
  MOEPLAN_RETURN_IF_ERROR(k_->Gemm(false, true, gated_, M_, E_, 1.0f, dlogits_.data(), E_,
                                   wg_.data(), E_, 0.0f, dxg32_.data(), M_, DType::kF32));
  return k_->AddF32(dx, dt_, dxg32_.as<float>(), gated_ * M_);
}

absl::Status MoeLayerOps::Compute(const OpExec& x) {
  switch (x.kind) {
    case ExecKind::kGate:
      return GateForward(Ptr(x.in));
    case ExecKind::kGateBackward:
      return GateBackward(Ptr(x.in), Ptr(x.out));
    case ExecKind::kOrder:
      if (x.ragged) {
        MOEPLAN_RETURN_IF_ERROR(CountRoutes());
        const Communicator* ep = groups_->Of(planner::ExecGroup::kEp);
        if (ep->size() == 1) {  // no count exchange is planned for a group of one rank
          std::copy(count_.begin(), count_.end(), peer_count_.begin());
          MOEPLAN_RETURN_IF_ERROR(SizeExchange());
        }
      }
      return k_->Order(Ptr(x.in), OrderRoute(), OrderShape(x), Ptr(x.out));
    case ExecKind::kIOrder:
      return k_->IOrder(Ptr(x.in), OrderRoute(), OrderShape(x), Ptr(x.out));
    case ExecKind::kIOrderBackward:
      return k_->IOrderBackward(Ptr(x.in), Ptr(x.mid), OrderRoute(), OrderShape(x), Ptr(x.out),
                                dweight_.as<float>());
    case ExecKind::kOrderBackward:
      return k_->OrderBackward(Ptr(x.in), OrderRoute(), OrderShape(x), Ptr(x.out));
    case ExecKind::kExpertForward:
      if (x.ragged) return RaggedExpertForward(x);
      return k_->ExpertForward(ExpertsOf(x), Ptr(x.in), w1_.data(), w2_.data(), z_.data(),
                               a_.data(), Ptr(x.out));
    case ExecKind::kExpertBackwardData:
      if (x.ragged) return RaggedExpertBackwardData(x);
      return k_->ExpertBackwardData(ExpertsOf(x), Ptr(x.in), w1_.data(), w2_.data(), z_.data(),
                                    dz_.data(), Ptr(x.out));
    case ExecKind::kExpertBackwardWeights:
      if (x.ragged) return RaggedExpertBackwardWeights(x);
      return k_->ExpertBackwardWeights(ExpertsOf(x), Ptr(x.in), a_.data(), Ptr(x.mid), dz_.data(),
                                       x.scale, dw1_.data(), dw2_.data());
    case ExecKind::kSlice: {
      const int r = groups_->Of(x.group)->rank();
      return Copy(Ptr(x.out), At(x.in, int64_t{r} * x.count), x.count);
    }
    default:
      return absl::InternalError(
          Cat("plan: ", planner::ExecKindName(x.kind), " is not a compute op"));
  }
}

absl::StatusOr<Request> MoeLayerOps::Start(const planner::Op& op, const OpExec& x,
                                           Communicator* c) {
  const DType t = TypeOf(x);
  const size_t n = static_cast<size_t>(x.count);
  switch (x.kind) {
    case ExecKind::kAllToAll: {
      if (!x.ragged) return c->StartAlltoAll(Ptr(x.in), Ptr(x.out), n, t);
      // Dropless: towards the experts the counts as sent, back the reverse.
      const size_t* sn = (x.to_experts ? send_n_ : recv_n_).data();
      const size_t* so = (x.to_experts ? send_off_ : recv_off_).data();
      const size_t* rn = (x.to_experts ? recv_n_ : send_n_).data();
      const size_t* ro = (x.to_experts ? recv_off_ : send_off_).data();
      return c->StartAlltoAllv(Ptr(x.in), sn, so, Ptr(x.out), rn, ro, t);
    }
    case ExecKind::kAllGather:
      return c->StartAllGather(Ptr(x.in), Ptr(x.out), n, t);
    case ExecKind::kReduceScatter:
      return c->StartReduceScatter(Ptr(x.in), Ptr(x.out), n, t);
    case ExecKind::kAllReduce: {
      const size_t count = x.ragged ? static_cast<size_t>(recv_rows_ * M_) : n;
      return c->StartAllReduce(Ptr(x.in), Ptr(x.in), count, t);
    }
    case ExecKind::kSaaExchange: {
      const int w = c->size(), q = c->rank();
      const int to = (q + op.step) % w, from = (q - op.step % w + w) % w;
      if (x.copy_local) {  // the gather / scatter of one rank: the local chunk stays
        MOEPLAN_RETURN_IF_ERROR(Copy(At(x.out, int64_t{q} * x.count),
                                     At(x.in, int64_t{q} * x.count), x.count, c->lane()));
      }
      return c->StartSendRecv(At(x.in, int64_t{to} * x.count), n, to,
                              At(x.out, int64_t{from} * x.count), n, from, t);
    }
    case ExecKind::kSaaGather:
    case ExecKind::kSaaReduce: {
      const Communicator* pairs = groups_->Of(x.pairs);
      const int w = pairs->size(), q = pairs->rank();
      const size_t stride = static_cast<size_t>(x.stride);
      if (x.kind == ExecKind::kSaaGather) {
        // The chunk that arrived with step i (the local one first).
        const int ch = (q - op.step % w + w) % w;
        const char* src = At(ch == q ? x.in : x.mid, int64_t{ch} * x.count);
        return c->StartAllGather(src, At(x.out, int64_t{ch} * x.count), n, t, stride);
      }
      // The chunk for peer q+i (step 0: the local one, into the output).
      const int ch = (q + op.step) % w;
      char* dst = op.step == 0 ? At(x.out, int64_t{q} * x.count) : At(x.mid, int64_t{ch} * x.count);
      return c->StartReduceScatter(At(x.in, int64_t{ch} * x.count), dst, n, t, stride);
    }
    default:
      return absl::InternalError(
          Cat("plan: ", planner::ExecKindName(x.kind), " is not a collective"));
  }
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

absl::Status MoeLayerOps::Run(const planner::Op& op, const OpExec& x, Request* comm) {
  if (comm == nullptr) return Compute(x);
  Communicator* c = groups_->Of(x.group);
  if (x.kind == ExecKind::kCounts) {  // host values, blocking
    MOEPLAN_ASSIGN_OR_RETURN(comm->begin, dev_->Record(kComputeLane));
    MOEPLAN_RETURN_IF_ERROR(c->ExchangeCounts(count_, absl::MakeSpan(peer_count_)));
    MOEPLAN_ASSIGN_OR_RETURN(comm->end, dev_->Record(kComputeLane));
    return SizeExchange();
  }
  MOEPLAN_ASSIGN_OR_RETURN(*comm, Start(op, x, c));
  return c->Wait(comm);
}

// ---- dropless ----
absl::Status MoeLayerOps::CountRoutes() {
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
    const int64_t r = expert_off_[static_cast<size_t>(host_expert_[i])] + host_slot_[i];
    host_flat_expert_[i] = static_cast<int32_t>(r / gated_);
    host_flat_[i] = static_cast<int32_t>(r % gated_);
  }
  MOEPLAN_RETURN_IF_ERROR(dev_->Upload(flat_expert_.data(), host_flat_expert_.data(), n * 4));
  return dev_->Upload(flat_slot_.data(), host_flat_.data(), n * 4);
}

absl::Status MoeLayerOps::SizeExchange() {
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

// Block (w, l) is peer_count_[w*El+l] rows from block_off_, local expert l's
// weights; fn(rows, first row) for local expert l's non-empty blocks.
template <class Fn>
absl::Status MoeLayerOps::ForBlocksOf(int64_t l, Fn&& fn) {
  for (int64_t w = 0; w < W_; ++w) {
    const size_t b = static_cast<size_t>(w * El_ + l);
    if (peer_count_[b] > 0) MOEPLAN_RETURN_IF_ERROR(fn(peer_count_[b], block_off_[b]));
  }
  return absl::OkStatus();
}

absl::Status MoeLayerOps::RaggedExpertForward(const OpExec& x) {
  char* w1 = w1_.as<char>();
  char* w2 = w2_.as<char>();
  for (int64_t l = 0; l < El_; ++l) {
    MOEPLAN_RETURN_IF_ERROR(ForBlocksOf(l, [&](int64_t r, int64_t o) -> absl::Status {
      char* z = z_.as<char>() + static_cast<size_t>(o * Hs_) * es_;
      char* a = a_.as<char>() + static_cast<size_t>(o * Hs_) * es_;
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(false, false, r, Hs_, M_, 1.0f, At(x.in, o * M_), M_,
                                       w1 + static_cast<size_t>(l * M_ * Hs_) * es_, Hs_, 0.0f, z,
                                       Hs_, dt_));
      MOEPLAN_RETURN_IF_ERROR(k_->Activation(z, a, r * Hs_, dt_));
      return k_->Gemm(false, false, r, M_, Hs_, 1.0f, a, Hs_,
                      w2 + static_cast<size_t>(l * Hs_ * M_) * es_, M_, 0.0f, At(x.out, o * M_), M_,
                      dt_);
    }));
  }
  return absl::OkStatus();
}

absl::Status MoeLayerOps::RaggedExpertBackwardData(const OpExec& x) {
  char* w1 = w1_.as<char>();
  char* w2 = w2_.as<char>();
  for (int64_t l = 0; l < El_; ++l) {
    MOEPLAN_RETURN_IF_ERROR(ForBlocksOf(l, [&](int64_t r, int64_t o) -> absl::Status {
      char* dz = dz_.as<char>() + static_cast<size_t>(o * Hs_) * es_;
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(false, true, r, Hs_, M_, 1.0f, At(x.in, o * M_), M_,
                                       w2 + static_cast<size_t>(l * Hs_ * M_) * es_, M_, 0.0f, dz,
                                       Hs_, dt_));
      MOEPLAN_RETURN_IF_ERROR(k_->ActivationBackward(
          z_.as<char>() + static_cast<size_t>(o * Hs_) * es_, dz, r * Hs_, dt_));
      return k_->Gemm(false, true, r, M_, Hs_, 1.0f, dz, Hs_,
                      w1 + static_cast<size_t>(l * M_ * Hs_) * es_, Hs_, 0.0f, At(x.out, o * M_),
                      M_, dt_);
    }));
  }
  return absl::OkStatus();
}

// dW2[l] = scale * sum over peers of a^T dout, dW1[l] = scale * sum of x^T dz:
// the first block with rows overwrites, later ones add; no rows at all, zero.
absl::Status MoeLayerOps::RaggedExpertBackwardWeights(const OpExec& x) {
  for (int64_t l = 0; l < El_; ++l) {
    char* dw1 = dw1_.as<char>() + static_cast<size_t>(l * M_ * Hs_) * es_;
    char* dw2 = dw2_.as<char>() + static_cast<size_t>(l * Hs_ * M_) * es_;
    float beta = 0.0f;
    MOEPLAN_RETURN_IF_ERROR(ForBlocksOf(l, [&](int64_t r, int64_t o) -> absl::Status {
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(true, false, Hs_, M_, r, x.scale,
                                       a_.as<char>() + static_cast<size_t>(o * Hs_) * es_, Hs_,
                                       At(x.mid, o * M_), M_, beta, dw2, M_, dt_));
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(true, false, M_, Hs_, r, x.scale, At(x.in, o * M_), M_,
                                       dz_.as<char>() + static_cast<size_t>(o * Hs_) * es_, Hs_,
                                       beta, dw1, Hs_, dt_));
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

LayerTensors MoeLayerOps::Tensors() const {
  LayerTensors t;
  t.tokens = S_;
  t.model_dim = M_;
  t.experts = E_;
  t.local_experts = El_;
  t.hidden_shard = Hs_;
  t.x = Ptr(Buf::kX);
  t.y = Ptr(Buf::kY);
  t.dy = Ptr(Buf::kDy);
  t.dx = Ptr(Buf::kDx);
  t.gate = wg_.as<float>();
  t.dgate = reinterpret_cast<float*>(Ptr(Buf::kGateGrad));
  t.w1 = w1_.data();
  t.w2 = w2_.data();
  t.dw1 = dw1_.data();
  t.dw2 = dw2_.data();
  return t;
}

absl::StatusOr<LayerResults> MoeLayerOps::Results() {
  MOEPLAN_RETURN_IF_ERROR(dev_->Synchronize());
  LayerResults r;
  std::vector<uint16_t> half;
  auto fetch = [&](const void* src, int64_t n, DType t, std::vector<float>* out) {
    out->resize(static_cast<size_t>(n));
    return DownloadAs(*dev_, absl::MakeSpan(*out), src, t, &half);
  };
  MOEPLAN_RETURN_IF_ERROR(fetch(Ptr(Buf::kY), S_ * M_, dt_, &r.y));
  MOEPLAN_RETURN_IF_ERROR(fetch(Ptr(Buf::kDx), S_ * M_, dt_, &r.dx));
  MOEPLAN_RETURN_IF_ERROR(fetch(Ptr(Buf::kGateGrad), M_ * E_, DType::kF32, &r.dgate));
  MOEPLAN_RETURN_IF_ERROR(fetch(dw1_.data(), El_ * M_ * Hs_, dt_, &r.dw1));
  MOEPLAN_RETURN_IF_ERROR(fetch(dw2_.data(), El_ * M_ * Hs_, dt_, &r.dw2));
  r.route_offset = route_offset_;
  r.expert.resize(static_cast<size_t>(gated_ * K_));
  r.slot.resize(r.expert.size());
  MOEPLAN_RETURN_IF_ERROR(dev_->Download(r.expert.data(), expert_.data(), r.expert.size() * 4));
  MOEPLAN_RETURN_IF_ERROR(dev_->Download(r.slot.data(), slot_.data(), r.slot.size() * 4));
  return r;
}

absl::StatusOr<RouteCounts> MoeLayerOps::Routing() {
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

}  // namespace internal
}  // namespace moeplan::executor
