// bfloat16 on the host: the upper 16 bits of an IEEE binary32, rounded to
// nearest even. One NaN rule for the whole project: a NaN stays a NaN with its
// sign and upper payload bits, forced quiet (rounding could otherwise carry a
// NaN into infinity). CUDA's __float2bfloat16_rn agrees on every non-NaN value.
#pragma once

#include <bit>
#include <cstdint>

namespace moeplan {

constexpr uint16_t FloatToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

constexpr float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

// The value `f` has once stored as bf16.
constexpr float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

}  // namespace moeplan
