#include "kernel_checks.h"

#include <limits>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::executor::internal {

absl::Status ArgCheck::Bad(std::string_view what) const {
  return absl::InvalidArgumentError(Cat(backend_, " kernels: ", fn_, ": ", what));
}

absl::Status ArgCheck::Type(DType t, bool supported) const {
  if (supported) return absl::OkStatus();
  return absl::UnimplementedError(
      Cat(backend_, " kernels: ", fn_, ": ", DTypeName(t), " is not supported; use f32"));
}

absl::Status ArgCheck::NonNegative(std::string_view name, int64_t v) const {
  if (v >= 0) return absl::OkStatus();
  return Bad(Cat(name, " (", v, ") must be >= 0"));
}

absl::Status ArgCheck::Pointer(std::string_view name, const void* p, int64_t count) const {
  if (p != nullptr || count == 0) return absl::OkStatus();
  return Bad(Cat(name, " is null but has ", count, " elements"));
}

absl::Status ArgCheck::Gating(int64_t tokens, int64_t experts, int64_t top_k) const {
  MOEPLAN_RETURN_IF_ERROR(NonNegative("tokens", tokens));
  MOEPLAN_RETURN_IF_ERROR(NonNegative("top_k", top_k));
  // A softmax over no experts is meaningless (and has no row max to subtract).
  if (experts < 1) return Bad(Cat("experts (", experts, ") must be >= 1"));
  if (top_k > experts) return Bad(Cat("top_k (", top_k, ") must be <= experts (", experts, ")"));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (tokens > kMax / experts) {
    return Bad(Cat("tokens (", tokens, ") x experts (", experts, ") must fit in int64"));
  }
  return absl::OkStatus();
}

absl::Status ArgCheck::Buffer(const BufferShape& s) const {
  MOEPLAN_RETURN_IF_ERROR(Gating(s.tokens, s.experts, s.top_k));
  MOEPLAN_RETURN_IF_ERROR(NonNegative("model", s.model));
  MOEPLAN_RETURN_IF_ERROR(NonNegative("capacity", s.capacity));
  if (s.parts < 1) return Bad(Cat("parts (", s.parts, ") must be >= 1"));
  if (s.capacity % s.parts != 0) {
    return Bad(Cat("capacity (", s.capacity, ") must be a multiple of parts (", s.parts, ")"));
  }
  return absl::OkStatus();
}

absl::Status ArgCheck::Routing(const RouteBuffers& r, int64_t choices, bool need_weight) const {
  MOEPLAN_RETURN_IF_ERROR(Pointer("expert", r.expert, choices));
  MOEPLAN_RETURN_IF_ERROR(Pointer("slot", r.slot, choices));
  if (need_weight) MOEPLAN_RETURN_IF_ERROR(Pointer("weight", r.weight, choices));
  return absl::OkStatus();
}

absl::Status ArgCheck::Expert(const ExpertShape& e) const {
  MOEPLAN_RETURN_IF_ERROR(NonNegative("groups", e.groups));
  MOEPLAN_RETURN_IF_ERROR(NonNegative("local_experts", e.local_experts));
  MOEPLAN_RETURN_IF_ERROR(NonNegative("rows", e.rows));
  MOEPLAN_RETURN_IF_ERROR(NonNegative("model", e.model));
  MOEPLAN_RETURN_IF_ERROR(NonNegative("shard", e.shard));
  return absl::OkStatus();
}

absl::Status ArgCheck::ExpertPointers(const ExpertShape& e,
                                      std::initializer_list<ExpertPointer> ptrs) const {
  auto elements = [&e](Tensor t) {
    switch (t) {
      case Tensor::kTokens:
        return e.TokenElements();
      case Tensor::kHidden:
        return e.HiddenElements();
      case Tensor::kPreActivation:
        return e.PreActivationElements();
      case Tensor::kW1:
        return e.W1Elements();
      case Tensor::kW2:
        return e.W2Elements();
    }
    return int64_t{0};
  };
  for (const ExpertPointer& ep : ptrs) {
    MOEPLAN_RETURN_IF_ERROR(Pointer(ep.name, ep.p, elements(ep.tensor)));
  }
  return absl::OkStatus();
}

}  // namespace moeplan::executor::internal
