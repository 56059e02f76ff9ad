// Seeded tensors: every element is a pure function of (seed, tensor, global
// index), so every schedule and layout sees the same global weights and inputs.
#include <cstdint>

#include "moeplan/executor/runner.h"

namespace moeplan::executor {
namespace {
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

float SeededValue(uint64_t seed, uint32_t tensor, uint64_t index, float scale) {
  const uint64_t h = SplitMix64(SplitMix64(seed ^ (uint64_t{tensor} << 56)) ^ index);
  // 24 random bits -> [0, 1) exactly representable, then [-scale, scale).
  const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  return (2.0f * u - 1.0f) * scale;
}

}  // namespace moeplan::executor
