// The graph algorithms of docs/model.md: reachability, Lancet's best-fit dW
// placement and the operator-partition DP.
#include <algorithm>
#include <cmath>
#include <limits>

#include "moeplan/planner/model_planner.h"

namespace moeplan::planner {

// ---- Reachability ----

void Reachability::Compute(const OpGraph& g, OpId first, std::span<const OpId> sources) {
  first_ = first;
  const int n = std::max(0, g.size() - first);
  int count = 0;
  if (sources.empty()) {
    bit_.resize(static_cast<size_t>(n));
    for (int v = 0; v < n; ++v) bit_[static_cast<size_t>(v)] = count++;
  } else {
    bit_.assign(static_cast<size_t>(n), -1);
    for (OpId s : sources) {
      const int u = s - first;
      if (u >= 0 && u < n && bit_[static_cast<size_t>(u)] < 0)
        bit_[static_cast<size_t>(u)] = count++;
    }
  }
  words_ = (count + 63) / 64;
  anc_.assign(static_cast<size_t>(n) * words_, 0);
  if (words_ == 0) return;
  for (int v = 0; v < n; ++v) {
    uint64_t* row = anc_.data() + static_cast<size_t>(v) * words_;
    for (OpId d : g.deps(first + v)) {
      const int u = d - first;
      if (u < 0) continue;  // before the window: not tracked
      const uint64_t* from = anc_.data() + static_cast<size_t>(u) * words_;
      for (int w = 0; w < words_; ++w) row[w] |= from[w];
      if (const int b = bit_[static_cast<size_t>(u)]; b >= 0)
        row[b / 64] |= uint64_t{1} << (b % 64);
    }
  }
}

bool Reachability::Path(OpId from, OpId to) const {
  const int u = from - first_, v = to - first_;
  const int n = static_cast<int>(bit_.size());
  if (u < 0 || v < 0 || u >= n || v >= n || u == v) return false;
  const int b = bit_[static_cast<size_t>(u)];
  if (b < 0) return false;
  return (anc_[static_cast<size_t>(v) * words_ + static_cast<size_t>(b / 64)] >> (b % 64)) & 1;
}

void Reachability::Reaching(std::span<const OpId> ops, OpId shift,
                            std::vector<uint64_t>* reached) const {
  reached->assign(static_cast<size_t>(words_), 0);
  const int n = static_cast<int>(bit_.size());
  for (OpId o : ops) {
    const int v = o - shift - first_;
    if (v < 0 || v >= n) continue;
    const uint64_t* row = anc_.data() + static_cast<size_t>(v) * words_;
    for (int w = 0; w < words_; ++w) (*reached)[static_cast<size_t>(w)] |= row[w];
  }
}

bool Reachability::Reaches(const std::vector<uint64_t>& reached, OpId source) const {
  const int u = source - first_;
  if (u < 0 || u >= static_cast<int>(bit_.size())) return false;
  const int b = bit_[static_cast<size_t>(u)];
  return b >= 0 && ((reached[static_cast<size_t>(b / 64)] >> (b % 64)) & 1);
}

// ---- Best-fit dW placement ----

std::vector<std::vector<int>> BestFitDw(std::span<const double> slot_us,
                                        std::span<const double> dw_us,
                                        absl::FunctionRef<bool(int, int)> eligible) {
  std::vector<std::vector<int>> picks(slot_us.size());
  std::vector<bool> used(dw_us.size(), false);
  std::vector<std::pair<double, int>> cand;  // (time, dw), sorted
  for (size_t s = 0; s < slot_us.size(); ++s) {
    cand.clear();
    for (size_t d = 0; d < dw_us.size(); ++d) {
      if (!used[d] && eligible(static_cast<int>(s), static_cast<int>(d))) {
        cand.emplace_back(dw_us[d], static_cast<int>(d));
      }
    }
    std::sort(cand.begin(), cand.end());
    double remaining = slot_us[s];
    while (remaining > 0.0 && !cand.empty()) {
      // The candidate closest to the remaining time: at the lower bound or just before.
      auto it = std::lower_bound(cand.begin(), cand.end(), std::pair{remaining, -1});
      if (it == cand.end() ||
          (it != cand.begin() && remaining - std::prev(it)->first <= it->first - remaining)) {
        --it;
      }
      picks[s].push_back(it->second);
      used[static_cast<size_t>(it->second)] = true;
      remaining -= it->first;
      cand.erase(it);
    }
  }
  return picks;
}

// ---- The partition DP ----

std::vector<PartitionChoice> PartitionDp(int n, int max_span, int max_k,
                                         absl::FunctionRef<double(int, int, int)> cost) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> t(static_cast<size_t>(n) + 1, kInf);
  std::vector<PartitionChoice> from(static_cast<size_t>(n) + 1);
  t[0] = 0.0;
  for (int j = 1; j <= n; ++j) {
    for (int i = std::max(0, j - std::max(1, max_span)); i < j; ++i) {
      if (t[static_cast<size_t>(i)] == kInf) continue;
      for (int k = 1; k <= max_k; ++k) {
        const double p = cost(i, j, k);
        if (p < 0.0) continue;
        const double total = t[static_cast<size_t>(i)] + p;
        if (total < t[static_cast<size_t>(j)]) {
          t[static_cast<size_t>(j)] = total;
          from[static_cast<size_t>(j)] = {i, j, k, p};
        }
      }
    }
  }
  std::vector<PartitionChoice> out;
  for (int j = n; j > 0; j = from[static_cast<size_t>(j)].begin) {
    out.push_back(from[static_cast<size_t>(j)]);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace moeplan::planner
