// The variants of one plan (model_planner_internal.h, PlanVariants): every
// requested variant with every (schedule, algorithm) pair, each variant's
// fastest kept.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "model_planner_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::planner {
namespace {

// S2's AlltoAlls are the SAA's pairwise steps: no algorithm to choose, one
// stands for all (linear when tried, else the first).
bool S2Repeats(Schedule sc, AllToAllAlgo a, std::span<const AllToAllAlgo> algos) {
  if (sc != Schedule::kS2) return false;
  const bool linear = std::find(algos.begin(), algos.end(), AllToAllAlgo::kLinear) != algos.end();
  return a != (linear ? AllToAllAlgo::kLinear : algos.front());
}

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
        if (S2Repeats(sc, a, algos)) continue;
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
    MOEPLAN_RETURN_IF_ERROR(
        each(Variant::kNone, [&](size_t vi) { return Consider(vi, whole, false, 0); }));
    if (unsplit) {
      MOEPLAN_RETURN_IF_ERROR(
          each(Variant::kPartition, [&](size_t vi) { return Consider(vi, split, false, 0); }));
    }
    MOEPLAN_RETURN_IF_ERROR(each(Variant::kTutel, [&](size_t vi) -> absl::Status {
      for (int r : options_.tutel_degrees) {
        MOEPLAN_RETURN_IF_ERROR(Consider(vi, s_.TutelRanges(r), false, r));
      }
      return absl::OkStatus();
    }));
    if (!unsplit) {
      MOEPLAN_RETURN_IF_ERROR(
          each(Variant::kPartition, [&](size_t vi) { return Consider(vi, split, false, 0); }));
    }
    MOEPLAN_RETURN_IF_ERROR(
        each(Variant::kDw, [&](size_t vi) { return Consider(vi, whole, true, 0); }));
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

// The fastest variant only (docs/model.md "Planning only the fastest").
// Without ZeRO 3's prefetched gathers, every backward op descends from the
// loss and every forward op ends by it, so a graph's makespan is its
// forward's end plus a rest that depends on the backward graph and its issue
// order alone: one rest for the variants without dW placement (none,
// partition, tutel) and one for those with it (dw, lancet). Per pair this
// simulates one whole graph of each kind, only the forward of the other
// range sets, and adds. The sums equal whole simulations up to rounding, so
// every sum within kNear of the least is simulated whole, and the winner is
// the one PlanVariants ranks first: least time, then variant, pair and
// degree order. Under ZeRO 3 every graph is simulated whole.
class FastestSearch {
 public:
  FastestSearch(ModelPlanner::Impl& s, const ModelPlanOptions& options,
                std::span<const Variant> variants, bool checked)
      : s_(s), options_(options), variants_(variants), checked_(checked) {}

  absl::Status Plan(std::span<const Schedule> schedules, std::span<const AllToAllAlgo> algos,
                    VariantPlan* out) {
    const bool add = s_.st.zero_stage < 3;
    // Every pair with its lower bound, planned from the least bound up; a
    // pair whose bound exceeds an entry already simulated whole is skipped:
    // none of its variants can be the fastest.
    struct Bounded {
      Pair pair;
      int index;
      double bound;
    };
    std::vector<Bounded> pairs;
    for (Schedule sc : schedules) {
      for (AllToAllAlgo a : algos) {
        if (S2Repeats(sc, a, algos)) continue;
        const Pair p{sc, a};
        SetPair(p);
        // A lower bound on every variant of the pair (Impl::PairBound).
        MOEPLAN_ASSIGN_OR_RETURN(const double bound, s_.PairBound());
        pairs.push_back({p, static_cast<int>(pairs.size()), bound});
      }
    }
    std::stable_sort(pairs.begin(), pairs.end(),
                     [](const Bounded& x, const Bounded& y) { return x.bound < y.bound; });
    for (const Bounded& b : pairs) {
      if (b.bound > LeastSimulated() * (1.0 + kBoundMargin)) continue;
      MOEPLAN_RETURN_IF_ERROR(PlanPair(b.pair, b.index, add));
    }
    double least = kInf;
    for (const Entry& e : entries_) least = std::min(least, e.us);
    for (Entry& e : entries_) {
      if (!e.exact && e.us <= least * (1.0 + kNear)) {
        MOEPLAN_ASSIGN_OR_RETURN(e.us, Simulate(e));
        e.exact = true;
      }
    }
    // The least of all is simulated whole by now, and held.
    if (held_ < 0) return absl::InternalError("fastest variant: nothing planned");
    const Entry& best = entries_[static_cast<size_t>(held_)];
    // Simulated without bindings: again with them for its critical path.
    MOEPLAN_RETURN_IF_ERROR(s_.simulator.Schedule(held_graph_, &held_sim_));
    s_.simulator.Details(held_graph_, &held_sim_);
    out->variant = variants_[best.vi];
    out->schedule = best.pair.sched;
    out->algo = best.pair.algo;
    out->tutel_degree = best.degree;
    std::swap(out->graph, held_graph_);
    std::swap(out->sim, held_sim_);
    out->layers = std::move(held_layers_);
    out->partitions = std::move(held_built_.partitions);
    out->dw = std::move(held_built_.dw);
    return absl::OkStatus();
  }

 private:
  static constexpr double kNear = 1e-9;
  // A pair is skipped only when its bound exceeds a simulated time by more
  // than rounding could account for.
  static constexpr double kBoundMargin = 1e-9;
  struct Pair {
    Schedule sched;
    AllToAllAlgo algo;
  };
  // One variant on one pair (and Tutel degree): its time, simulated whole
  // (exact) or summed.
  struct Entry {
    size_t vi;
    int pair_index;
    Pair pair;
    int degree;  // Tutel's r; 0 otherwise
    int order;   // the degree's place in tutel_degrees
    double us;
    bool exact;
  };
  // Which ranges a variant's graph splits: the unsplit ones, the partition
  // DP's (partition, lancet) or Tutel's r.
  enum class Split : uint8_t { kWhole, kDp, kTutel };

  static bool Before(const Entry& x, const Entry& y) {
    if (x.vi != y.vi) return x.vi < y.vi;
    if (x.pair_index != y.pair_index) return x.pair_index < y.pair_index;
    return x.order < y.order;
  }
  static bool Dw(Variant v) { return v == Variant::kDw || v == Variant::kLancet; }
  static Split SplitOf(Variant v) {
    return v == Variant::kPartition || v == Variant::kLancet ? Split::kDp
           : v == Variant::kTutel                            ? Split::kTutel
                                                             : Split::kWhole;
  }

  void SetPair(Pair p) {
    s_.sched = p.sched;
    s_.algo = p.algo;
    s_.combo_salt = 1 + static_cast<uint64_t>(p.sched) * 4 + static_cast<uint64_t>(p.algo);
  }
  // The pair's partition DP runs once (dp_ranges_, by pair index).
  std::vector<Range> RangesOf(Variant v, int degree, int pair_index) {
    switch (SplitOf(v)) {
      case Split::kDp:
        if (dp_ranges_.size() <= static_cast<size_t>(pair_index)) {
          dp_ranges_.resize(static_cast<size_t>(pair_index) + 1);
        }
        if (dp_ranges_[static_cast<size_t>(pair_index)].empty()) {
          dp_ranges_[static_cast<size_t>(pair_index)] = s_.PartitionRanges();
        }
        return dp_ranges_[static_cast<size_t>(pair_index)];
      case Split::kTutel:
        return s_.TutelRanges(degree);
      case Split::kWhole:
        break;
    }
    return s_.WholeRanges();
  }
  // The least time of an entry simulated whole so far (kInf: none).
  double LeastSimulated() const {
    return held_ < 0 ? kInf : entries_[static_cast<size_t>(held_)].us;
  }
  // e's whole graph simulated, and held if it is the least so far (its
  // graph and times then move into the held ones: read forward_end_ after).
  absl::StatusOr<double> Simulate(const Entry& e) {
    MOEPLAN_RETURN_IF_ERROR(options_.deadline.Check("model plan"));
    SetPair(e.pair);
    ranges_ = RangesOf(variants_[e.vi], e.degree, e.pair_index);
    MOEPLAN_RETURN_IF_ERROR(s_.Evaluate(ranges_, Dw(variants_[e.vi]), nullptr, false));
    const double us = s_.final_sim.makespan_us;
    forward_end_ = s_.final_sim.forward_end_us;
    const Entry* held = held_ < 0 ? nullptr : &entries_[static_cast<size_t>(held_)];
    if (held == nullptr || us < held->us || (us == held->us && Before(e, *held))) {
      held_ = &e - entries_.data();
      held_layers_ = s_.Layers(ranges_);
      // Described while its graph is where Evaluate left it.
      if (s_.describe) s_.Describe(ranges_, &held_built_);
      // Swapped, not copied: final_graph and final_sim are scratch that the
      // next Evaluate overwrites.
      std::swap(held_graph_, s_.final_graph);
      std::swap(held_sim_, s_.final_sim);
    }
    return us;
  }

  absl::Status PlanPair(Pair p, int pair_index, bool add) {
    SetPair(p);
    const size_t first = entries_.size();
    for (size_t vi = 0; vi < variants_.size(); ++vi) {
      if (variants_[vi] != Variant::kTutel) {
        entries_.push_back({vi, pair_index, p, 0, 0, kInf, false});
        continue;
      }
      for (size_t d = 0; d < options_.tutel_degrees.size(); ++d) {
        entries_.push_back(
            {vi, pair_index, p, options_.tutel_degrees[d], static_cast<int>(d), kInf, false});
      }
    }
    const std::span<Entry> pair(entries_.begin() + static_cast<ptrdiff_t>(first), entries_.end());
    if (!add) {
      for (Entry& e : pair) {
        MOEPLAN_ASSIGN_OR_RETURN(e.us, Simulate(e));
        e.exact = true;
      }
      return absl::OkStatus();
    }
    // One whole graph per kind: none's (else the first without dW
    // placement) and lancet's (else dw's). Each gives its kind's rest and
    // its ranges' forward.
    double rest[2] = {kInf, kInf};
    fwd_.clear();
    for (bool dw : {false, true}) {
      Entry* whole = nullptr;
      for (Entry& e : pair) {
        if (Dw(variants_[e.vi]) != dw) continue;
        if (whole == nullptr || variants_[e.vi] == (dw ? Variant::kLancet : Variant::kNone)) {
          whole = &e;
        }
      }
      if (whole == nullptr) continue;
      MOEPLAN_ASSIGN_OR_RETURN(whole->us, Simulate(*whole));
      whole->exact = true;
      const double f = forward_end_;
      rest[dw] = whole->us - f;
      fwd_.push_back({KeyOf(*whole), f});
    }
    for (Entry& e : pair) {
      if (e.exact) continue;
      const uint64_t key = KeyOf(e);
      double f = kInf;
      for (const auto& [k, us] : fwd_) {
        if (k == key) f = us;
      }
      const double rest_us = rest[Dw(variants_[e.vi])];
      if (f == kInf && SplitOf(variants_[e.vi]) == Split::kTutel) {
        // Tutel's forward is bounded by its ops before it is simulated: an
        // entry that cannot reach the least simulated time is left at kInf.
        const double lb = s_.ForwardBusy(RangesOf(variants_[e.vi], e.degree, e.pair_index));
        if (lb + rest_us > LeastSimulated() * (1.0 + kBoundMargin)) continue;
      }
      if (f == kInf) {
        MOEPLAN_RETURN_IF_ERROR(options_.deadline.Check("model plan"));
        MOEPLAN_ASSIGN_OR_RETURN(f,
                                 s_.ForwardEnd(RangesOf(variants_[e.vi], e.degree, e.pair_index)));
        fwd_.push_back({key, f});
      }
      e.us = f + rest_us;
      if (checked_) MOEPLAN_RETURN_IF_ERROR(CheckSum(e));
    }
    return absl::OkStatus();
  }
  // kFastestOnlyChecked: e's sum against its whole graph simulated (the
  // held plan untouched).
  absl::Status CheckSum(const Entry& e) {
    MOEPLAN_RETURN_IF_ERROR(s_.Evaluate(RangesOf(variants_[e.vi], e.degree, e.pair_index),
                                        Dw(variants_[e.vi]), nullptr, false));
    const double whole = s_.final_sim.makespan_us;
    if (std::abs(e.us - whole) <= kNear * whole) return absl::OkStatus();
    return absl::InternalError(Cat("fastest variant: ", VariantName(variants_[e.vi]), " (",
                                   ScheduleName(e.pair.sched), ", ", AllToAllAlgoName(e.pair.algo),
                                   ", degree ", e.degree, ") sums to ", e.us,
                                   " us but simulates to ", whole, " us"));
  }
  // The forward an entry's ranges give: unsplit (Tutel's r = 1 is), the
  // partition DP's, or Tutel's r.
  uint64_t KeyOf(const Entry& e) const {
    const Split split = SplitOf(variants_[e.vi]);
    if (split == Split::kTutel && e.degree > 1) return 2 + static_cast<uint64_t>(e.degree);
    return split == Split::kDp ? 1 : 0;
  }

  ModelPlanner::Impl& s_;
  const ModelPlanOptions& options_;
  std::span<const Variant> variants_;
  std::vector<Entry> entries_;
  std::vector<std::pair<uint64_t, double>> fwd_;  // per pair: forward end by KeyOf
  double forward_end_ = 0.0;                      // Simulate's last graph's
  std::vector<Range> ranges_;
  std::vector<std::vector<Range>> dp_ranges_;

  const bool checked_;
  // The least entry simulated whole so far (its index; -1: none) and its plan.
  ptrdiff_t held_ = -1;
  // The Impl's, so that their storage outlives the plan (out->graph and
  // out->sim swap theirs in): copying into them allocates nothing.
  OpGraph& held_graph_ = s_.held_graph;
  SimResult& held_sim_ = s_.held_sim;
  std::vector<MoeLayerChoice> held_layers_;
  ModelPlanner::Impl::Built held_built_;
};

}  // namespace

absl::Status PlanFastestVariant(ModelPlanner::Impl& s, const ModelPlanOptions& options,
                                std::span<const Schedule> schedules,
                                std::span<const AllToAllAlgo> algos,
                                std::span<const Variant> variants, bool checked, VariantPlan* out) {
  return FastestSearch(s, options, variants, checked).Plan(schedules, algos, out);
}

absl::Status PlanVariants(ModelPlanner::Impl& s, const ModelPlanOptions& options,
                          std::span<const Schedule> schedules, std::span<const AllToAllAlgo> algos,
                          std::span<VariantPlan> vps) {
  return VariantSearch(s, options, vps).Plan(schedules, algos);
}

}  // namespace moeplan::planner
