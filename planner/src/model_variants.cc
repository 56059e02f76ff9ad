// The variants of one plan (model_planner_internal.h, PlanVariants): every
// requested variant with every (schedule, algorithm) pair, each variant's
// fastest kept.
#include <algorithm>
#include <span>
#include <vector>

#include "model_planner_internal.h"
#include "moeplan/base/status.h"

namespace moeplan::planner {
namespace {

using internal::kInf;
using internal::Range;

// What final_graph holds: the unsplit graph (every range k = 1), without or
// with dW placement, or anything else.
enum class Held : uint8_t { kOther, kWhole, kWholeDw };

bool Unsplit(const std::vector<Range>& ranges) {
  return std::all_of(ranges.begin(), ranges.end(), [](const Range& r) { return r.k == 1; });
}

// The plans pair by pair. Per variant the pairs keep their order (so each
// variant's fastest and its alternatives are what a variant-by-variant walk
// finds), and within a pair the variants are independent: they run in an
// order that lets equal graphs be simulated once. Ranges of k = 1 emit the
// same ops and edges however they are cut (EmitRange), so Tutel's r = 1 and a
// partition that splits nothing are the unsplit graph of the none variant
// (with dW placement, lancet's is the dw variant's): they reuse its result.
class VariantSearch {
 public:
  VariantSearch(ModelPlanner::Impl& s, const ModelPlanOptions& options, std::span<VariantPlan> vps)
      : s_(s), options_(options), vps_(vps), state_(vps.size()) {}

  absl::Status Plan(std::span<const Schedule> schedules, std::span<const AllToAllAlgo> algos) {
    for (Schedule sc : schedules) {
      for (AllToAllAlgo a : algos) {
        // S2's AlltoAlls are the SAA's pairwise steps: no algorithm to choose.
        if (sc == Schedule::kS2 && a == AllToAllAlgo::kHierarchical && algos.size() > 1) continue;
        s_.sched = sc;
        s_.algo = a;
        s_.combo_salt = 1 + static_cast<uint64_t>(sc) * 4 + static_cast<uint64_t>(a);
        for (State& st : state_) st.alt = VariantAlternative{sc, a, 0, kInf};
        MOEPLAN_RETURN_IF_ERROR(PlanPair());
        for (size_t vi = 0; vi < vps_.size(); ++vi) {
          vps_[vi].alternatives.push_back(state_[vi].alt);
        }
      }
    }
    for (VariantPlan& vp : vps_) {
      std::stable_sort(vp.alternatives.begin(), vp.alternatives.end(),
                       [](const VariantAlternative& x, const VariantAlternative& y) {
                         return x.iteration_us < y.iteration_us;
                       });
    }
    return absl::OkStatus();
  }

 private:
  struct State {
    VariantAlternative alt;
    double best = kInf;
  };

  // Every variant's graphs for the current pair: the unsplit ones first.
  absl::Status PlanPair() {
    held_ = Held::kOther;
    // Partition and lancet split the same ranges: one DP per pair.
    std::vector<Range> split;
    for (const VariantPlan& vp : vps_) {
      if (vp.variant == Variant::kPartition || vp.variant == Variant::kLancet) {
        split = s_.PartitionRanges();
        break;
      }
    }
    const bool unsplit = !split.empty() && Unsplit(split);
    const std::vector<Range> whole = s_.WholeRanges();
    auto each = [&](Variant v, auto&& fn) -> absl::Status {
      for (size_t vi = 0; vi < vps_.size(); ++vi) {
        if (vps_[vi].variant == v) MOEPLAN_RETURN_IF_ERROR(fn(vi));
      }
      return absl::OkStatus();
    };
    MOEPLAN_RETURN_IF_ERROR(each(Variant::kNone, [&](size_t vi) {
      return Consider(vi, whole, false, 0);
    }));
    if (unsplit) {
      MOEPLAN_RETURN_IF_ERROR(each(Variant::kPartition, [&](size_t vi) {
        return Consider(vi, split, false, 0);
      }));
    }
    MOEPLAN_RETURN_IF_ERROR(each(Variant::kTutel, [&](size_t vi) -> absl::Status {
      for (int r : options_.tutel_degrees) {
        MOEPLAN_RETURN_IF_ERROR(Consider(vi, s_.TutelRanges(r), false, r));
      }
      return absl::OkStatus();
    }));
    if (!unsplit) {
      MOEPLAN_RETURN_IF_ERROR(each(Variant::kPartition, [&](size_t vi) {
        return Consider(vi, split, false, 0);
      }));
    }
    MOEPLAN_RETURN_IF_ERROR(each(Variant::kDw, [&](size_t vi) {
      return Consider(vi, whole, true, 0);
    }));
    return each(Variant::kLancet, [&](size_t vi) { return Consider(vi, split, true, 0); });
  }

  // Variant vi's graph of `ranges` (dW placed when `dw`), simulated unless
  // final_graph holds it already, kept when it is the variant's fastest.
  absl::Status Consider(size_t vi, const std::vector<Range>& ranges, bool dw, int degree) {
    MOEPLAN_RETURN_IF_ERROR(options_.deadline.Check("model plan"));
    const Held want = !Unsplit(ranges) ? Held::kOther : dw ? Held::kWholeDw : Held::kWhole;
    if (want == Held::kOther || want != held_) {
      held_ = Held::kOther;
      MOEPLAN_RETURN_IF_ERROR(s_.Evaluate(ranges, dw, &built_));
      held_ = want;
      detailed_ = false;
    }
    const double us = s_.final_sim.makespan_us;
    State& st = state_[vi];
    if (us < st.alt.iteration_us) {
      st.alt.iteration_us = us;
      st.alt.tutel_degree = degree;
    }
    if (us < st.best) {
      if (!detailed_) s_.simulator.Details(s_.final_graph, &s_.final_sim);
      detailed_ = true;
      st.best = us;
      VariantPlan& vp = vps_[vi];
      vp.schedule = s_.sched;
      vp.algo = s_.algo;
      vp.tutel_degree = degree;
      vp.graph = s_.final_graph;
      vp.sim = s_.final_sim;
      vp.layers = s_.Layers(ranges);
      vp.partitions = built_.partitions;
      vp.dw = built_.dw;
    }
    return absl::OkStatus();
  }

  ModelPlanner::Impl& s_;
  const ModelPlanOptions& options_;
  std::span<VariantPlan> vps_;
  std::vector<State> state_;
  ModelPlanner::Impl::Built built_;
  Held held_ = Held::kOther;
  bool detailed_ = false;  // final_sim completed (Simulator::Details)
};

}  // namespace

absl::Status PlanVariants(ModelPlanner::Impl& s, const ModelPlanOptions& options,
                          std::span<const Schedule> schedules, std::span<const AllToAllAlgo> algos,
                          std::span<VariantPlan> vps) {
  return VariantSearch(s, options, vps).Plan(schedules, algos);
}

}  // namespace moeplan::planner
