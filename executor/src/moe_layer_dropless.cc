// A dropless MoE layer's uneven side (moe_layer.h, docs/executor.md): the
// routing counted into a compact buffer, the exchange's per-peer sizes, and
// the expert FFN on ragged (peer, local expert) blocks.
#include <algorithm>
#include <vector>

#include "moe_layer.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::executor::internal {

using planner::OpExec;

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

// z = x W1[l] (F_ columns: [gate | up] for SwiGLU), a = act(z), out = a W2[l].
absl::Status MoeLayerOps::RaggedExpertForward(const OpExec& x) {
  char* w1 = w1_.as<char>();
  char* w2 = w2_.as<char>();
  for (int64_t l = 0; l < El_; ++l) {
    MOEPLAN_RETURN_IF_ERROR(ForBlocksOf(l, [&](int64_t r, int64_t o) -> absl::Status {
      char* z = z_.as<char>() + static_cast<size_t>(o * F_) * es_;
      char* a = a_.as<char>() + static_cast<size_t>(o * Hs_) * es_;
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(false, false, r, F_, M_, 1.0f, At(x.in, o * M_), M_,
                                       w1 + static_cast<size_t>(l * M_ * F_) * es_, F_, 0.0f, z, F_,
                                       dt_));
      MOEPLAN_RETURN_IF_ERROR(layer_.gated_linear_unit ? k_->GatedActivation(z, a, r, Hs_, dt_)
                                                       : k_->Activation(z, a, r * Hs_, dt_));
      return k_->Gemm(false, false, r, M_, Hs_, 1.0f, a, Hs_,
                      w2 + static_cast<size_t>(l * Hs_ * M_) * es_, M_, 0.0f, At(x.out, o * M_), M_,
                      dt_);
    }));
  }
  return absl::OkStatus();
}

// da = dout W2[l]^T into dz (SwiGLU: its up half), the activation backward
// in place, dx = dz W1[l]^T.
absl::Status MoeLayerOps::RaggedExpertBackwardData(const OpExec& x) {
  char* w1 = w1_.as<char>();
  char* w2 = w2_.as<char>();
  const bool gated = layer_.gated_linear_unit;
  for (int64_t l = 0; l < El_; ++l) {
    MOEPLAN_RETURN_IF_ERROR(ForBlocksOf(l, [&](int64_t r, int64_t o) -> absl::Status {
      char* dz = dz_.as<char>() + static_cast<size_t>(o * F_) * es_;
      const char* z = z_.as<char>() + static_cast<size_t>(o * F_) * es_;
      char* da = gated ? dz + static_cast<size_t>(Hs_) * es_ : dz;
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(false, true, r, Hs_, M_, 1.0f, At(x.in, o * M_), M_,
                                       w2 + static_cast<size_t>(l * Hs_ * M_) * es_, M_, 0.0f, da,
                                       F_, dt_));
      MOEPLAN_RETURN_IF_ERROR(gated ? k_->GatedActivationBackward(z, dz, r, Hs_, dt_)
                                    : k_->ActivationBackward(z, dz, r * Hs_, dt_));
      return k_->Gemm(false, true, r, M_, F_, 1.0f, dz, F_,
                      w1 + static_cast<size_t>(l * M_ * F_) * es_, F_, 0.0f, At(x.out, o * M_), M_,
                      dt_);
    }));
  }
  return absl::OkStatus();
}

// dW2[l] = scale * sum over peers of a^T dout, dW1[l] = scale * sum of x^T dz:
// the first block with rows overwrites, later ones add; no rows at all, zero.
absl::Status MoeLayerOps::RaggedExpertBackwardWeights(const OpExec& x) {
  for (int64_t l = 0; l < El_; ++l) {
    char* dw1 = dw1_.as<char>() + static_cast<size_t>(l * M_ * F_) * es_;
    char* dw2 = dw2_.as<char>() + static_cast<size_t>(l * Hs_ * M_) * es_;
    float beta = 0.0f;
    MOEPLAN_RETURN_IF_ERROR(ForBlocksOf(l, [&](int64_t r, int64_t o) -> absl::Status {
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(true, false, Hs_, M_, r, x.scale,
                                       a_.as<char>() + static_cast<size_t>(o * Hs_) * es_, Hs_,
                                       At(x.mid, o * M_), M_, beta, dw2, M_, dt_));
      MOEPLAN_RETURN_IF_ERROR(k_->Gemm(true, false, M_, F_, r, x.scale, At(x.in, o * M_), M_,
                                       dz_.as<char>() + static_cast<size_t>(o * F_) * es_, F_, beta,
                                       dw1, F_, dt_));
      beta = 1.0f;
      return absl::OkStatus();
    }));
    if (beta == 0.0f) {
      MOEPLAN_RETURN_IF_ERROR(dev_->Zero(dw1, static_cast<size_t>(M_ * F_) * es_, kComputeLane));
      MOEPLAN_RETURN_IF_ERROR(dev_->Zero(dw2, static_cast<size_t>(Hs_ * M_) * es_, kComputeLane));
    }
  }
  return absl::OkStatus();
}

}  // namespace moeplan::executor::internal
