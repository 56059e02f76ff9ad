// Argument checks every Kernels backend runs before it touches memory, so the
// CPU and CUDA kernels reject a bad argument with the same message:
//   "<backend> kernels: <Fn>: <argument> (<value>) must be <rule>".
// Backend limits (an element type a backend lacks, cuBLAS's int dimensions,
// routing values only the host can read) are checked by the backend after these.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "absl/status/status.h"
#include "moeplan/executor/kernels.h"

namespace moeplan::executor::internal {

class ArgCheck {
 public:
  // `backend`: "cpu", "cuda"; `fn`: the Kernels method ("Gemm"). Both must
  // outlive the check (string literals); nothing is formatted unless it fails.
  constexpr ArgCheck(std::string_view backend, std::string_view fn) : backend_(backend), fn_(fn) {}

  // InvalidArgument "<backend> kernels: <fn>: <what>".
  absl::Status Bad(std::string_view what) const;
  // Unimplemented "<backend> kernels: <fn>: <dtype> is not supported; use ..."
  // unless `supported`.
  absl::Status Type(DType t, bool supported) const;
  absl::Status NonNegative(std::string_view name, int64_t v) const;
  // A pointer may be null only when nothing is read or written through it.
  absl::Status Pointer(std::string_view name, const void* p, int64_t count) const;
  // tokens >= 0, experts >= 1, 0 <= top_k <= experts, tokens * max(experts,
  // top_k) without overflow.
  absl::Status Gating(int64_t tokens, int64_t experts, int64_t top_k) const;
  // The gating fields, model >= 0, capacity >= 0, parts >= 1 dividing capacity
  // (not the dtype).
  absl::Status Buffer(const BufferShape& s) const;
  // The routing arrays of `choices` entries (weight only with `need_weight`).
  absl::Status Routing(const RouteBuffers& r, int64_t choices, bool need_weight) const;
  // Every dimension >= 0 (not the dtype).
  absl::Status Expert(const ExpertShape& e) const;

  // A pointer of an expert kernel with the element count of its tensor
  // (ExpertShape: tokens x, out, dout, dx; hidden a; pre-activation z, dz;
  // the weights w1, dw1 and w2, dw2).
  enum class Tensor { kTokens, kHidden, kPreActivation, kW1, kW2 };
  struct ExpertPointer {
    std::string_view name;
    const void* p;
    Tensor tensor;
  };
  absl::Status ExpertPointers(const ExpertShape& e,
                              std::initializer_list<ExpertPointer> ptrs) const;

 private:
  std::string_view backend_;
  std::string_view fn_;
};

}  // namespace moeplan::executor::internal
