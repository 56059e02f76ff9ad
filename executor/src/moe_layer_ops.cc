// The MoE layer's op semantics (moe_layer.h): what each ExecKind computes or
// communicates on the layer's buffers, and the layer's results for checks.
#include <algorithm>
#include <vector>

#include "moe_layer.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::executor::internal {

using planner::Buf;
using planner::ExecKind;
using planner::OpExec;

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
  e.gated = layer_.gated_linear_unit;
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

LayerTensors MoeLayerOps::Tensors() const {
  LayerTensors t;
  t.tokens = S_;
  t.model_dim = M_;
  t.experts = E_;
  t.local_experts = El_;
  t.hidden_shard = Hs_;
  t.gated = layer_.gated_linear_unit;
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
  MOEPLAN_RETURN_IF_ERROR(fetch(dw1_.data(), El_ * M_ * F_, dt_, &r.dw1));
  MOEPLAN_RETURN_IF_ERROR(fetch(dw2_.data(), El_ * Hs_ * M_, dt_, &r.dw2));
  r.route_offset = route_offset_;
  r.expert.resize(static_cast<size_t>(gated_ * K_));
  r.slot.resize(r.expert.size());
  MOEPLAN_RETURN_IF_ERROR(dev_->Download(r.expert.data(), expert_.data(), r.expert.size() * 4));
  MOEPLAN_RETURN_IF_ERROR(dev_->Download(r.slot.data(), slot_.data(), r.slot.size() * 4));
  return r;
}

absl::Status MoeLayerOps::AddGlobal(LayerResults* g) {
  MOEPLAN_RETURN_IF_ERROR(dev_->Synchronize());
  const RankPlace& place = groups_->place();
  const int64_t n = groups_->Of(planner::ExecGroup::kMp)->size();
  std::vector<uint16_t> half;
  std::vector<float> host;
  auto fetch = [&](const void* src, int64_t elems, DType t) {
    host.resize(static_cast<size_t>(elems));
    return DownloadAs(*dev_, absl::MakeSpan(host), src, t, &half);
  };
  // Tokens: the rank's rows of the MP group's output (or input gradient),
  // from the full buffer where the layer wrote it, else from its slice.
  auto add_rows = [&](Buf full, Buf slice, std::vector<float>* out) -> absl::Status {
    if (!sp_input_ && place.mp_rank != 0) return absl::OkStatus();
    const int64_t rows = sp_input_ ? S_ / n : S_, first = sp_input_ ? place.mp_rank * rows : 0;
    const bool from_full = written_[Root(full)] || !sp_input_;
    MOEPLAN_RETURN_IF_ERROR(fetch(from_full ? At(full, first * M_) : Ptr(slice), rows * M_, dt_));
    float* at = out->data() + (int64_t{place.mp_group} * S_ + first) * M_;
    for (size_t i = 0; i < host.size(); ++i) at[i] += host[i];
    return absl::OkStatus();
  };
  MOEPLAN_RETURN_IF_ERROR(add_rows(Buf::kY, Buf::kYs, &g->y));
  MOEPLAN_RETURN_IF_ERROR(add_rows(Buf::kDx, Buf::kDxs, &g->dx));
  if (place.mp_rank == 0) {
    MOEPLAN_RETURN_IF_ERROR(fetch(Ptr(Buf::kGateGrad), M_ * E_, DType::kF32));
    for (size_t i = 0; i < host.size(); ++i) g->dgate[i] += host[i];
  }
  // Expert shards where FillInputs took them from.
  MOEPLAN_RETURN_IF_ERROR(fetch(dw1_.data(), El_ * M_ * F_, dt_));
  ForW1Shard([&](size_t i, uint64_t at) { g->dw1[at] += host[i]; });
  MOEPLAN_RETURN_IF_ERROR(fetch(dw2_.data(), El_ * Hs_ * M_, dt_));
  ForW2Shard([&](size_t i, uint64_t at) { g->dw2[at] += host[i]; });
  return absl::OkStatus();
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

}  // namespace moeplan::executor::internal
