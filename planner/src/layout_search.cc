// The layout search (docs/layouts.md "Search"): every valid layout of P GPUs
// enumerated, memory-checked, bounded from below, then simulated in bound
// order until no remaining candidate can enter the top N.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "field_rules.h"
#include "layout_planner_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/layout_memory.h"
#include "moeplan/planner/limits.h"

namespace moeplan::planner {
namespace {

using internal::Bad;

std::vector<int> Divisors(int64_t n, int64_t max) {
  std::vector<int> d;
  for (int64_t i = 1; i <= std::min(n, max); ++i) {
    if (n % i == 0) d.push_back(static_cast<int>(i));
  }
  return d;
}

// Whether `layers` split into `chunks` model chunks is worth searching: equal
// chunks, or uneven ones of two layers or more each (with fewer, the busiest
// chunk holds twice the lightest's layers and an even split does better).
bool EvenOrTwoEach(int layers, int chunks) { return layers % chunks == 0 || layers >= 2 * chunks; }

// The (ep, esp) pairs family `f` allows on a stage of dp * tp ranks.
std::vector<std::pair<int, int>> ExpertGrids(Family f, int dp, int tp, bool has_parm) {
  std::vector<std::pair<int, int>> experts;
  switch (f) {
    case Family::kDpMoe:
      for (int ep : Divisors(dp, dp)) {
        // ep = dp is parm's esp = tp (which also tries S1 and S2): one name for it.
        if (ep == dp && has_parm) continue;
        experts.push_back({ep, tp});
      }
      break;
    case Family::kPpMoe:
      if (tp == 1) break;  // no TP group to spread the experts over
      for (int ep : Divisors(tp, tp)) experts.push_back({ep, tp / ep});
      break;
    case Family::kParm:
      // Each expert shard runs on its TP group's tokens: esp | tp.
      for (int esp : Divisors(tp, tp)) experts.push_back({tp * dp / esp, esp});
      break;
  }
  return experts;
}

// Every valid (dp, tp, pp, ep, esp, family) of `gpus` GPUs, one micro-batch.
std::vector<Layout> EnumerateLayouts(const ModelConfig& model, std::span<const Family> families,
                                     std::span<const int> cps, int gpus,
                                     const ClusterShape& cluster) {
  const int g = cluster.gpus_per_node;
  const int64_t global = model.GlobalBatch();
  const bool has_parm = std::count(families.begin(), families.end(), Family::kParm) > 0;
  std::vector<Layout> layouts;
  for (int tp : Divisors(g, g)) {
    // Stages of equal layers (pp | num_layers) and, where the GPUs allow,
    // uneven ones (pp | gpus / tp: a 61-layer model on 2^k GPUs).
    std::vector<int> pps = Divisors(model.num_layers, gpus / tp);
    for (int pp : Divisors(gpus / tp, model.num_layers)) {
      if (EvenOrTwoEach(model.num_layers, pp) &&
          std::find(pps.begin(), pps.end(), pp) == pps.end()) {
        pps.push_back(pp);
      }
    }
    std::sort(pps.begin(), pps.end());
    for (int pp : pps) {
      if (gpus % (tp * pp) != 0) continue;
      // The stage's data-parallel ranks, cp of them splitting each sequence.
      const int stage_dp = gpus / (tp * pp);
      for (int cp : cps) {
        if (stage_dp % cp != 0) continue;
        const int dp = stage_dp / cp;
        for (Family f : families) {
          // A dense model has no experts to place: one layout, ep = esp = 1.
          const std::vector<std::pair<int, int>> grids =
              !model.IsDense()        ? ExpertGrids(f, stage_dp, tp, has_parm)
              : f == families.front() ? std::vector<std::pair<int, int>>{{1, 1}}
                                      : std::vector<std::pair<int, int>>{};
          for (auto [ep, esp] : grids) {
            Layout l;
            l.dp = dp;
            l.tp = tp;
            l.pp = pp;
            l.ep = ep;
            l.esp = esp;
            l.cp = cp;
            l.family = model.IsDense() ? InferFamily(l) : f;
            l.microbatches = 1;
            if (global % dp != 0) continue;
            if (!ValidateLayout(model, l, global, cluster).ok()) continue;
            layouts.push_back(l);
          }
        }
      }
    }
  }
  return layouts;
}

// A candidate waiting to be simulated: its refined lower bound (the order
// candidates are tried in), and its place in the order of the unrefined
// bound, then enumeration (the order ties in iteration time rank in).
struct Pending {
  Layout layout;
  int64_t mbs;
  double bound = 0.0;    // refined (LayoutPlanner::Impl::Bound)
  double ubound = -1.0;  // unrefined, computed when a tie needs it (< 0: not yet)
  size_t index = 0;      // enumeration order
  size_t point = 0;      // its SearchPoint, when the search records them
};

// The N fastest candidates simulated so far, by iteration time, equal times
// in the order of the unrefined bound (then enumeration): the order the
// search has always simulated candidates in, one by one, inserting each
// after the equal ones. The top N of that order is the top N of all
// candidates, whatever order they are simulated in, so the search may try
// them by its refined bound and skip any that cannot enter: the ranking is
// the one simulating every candidate in the old order gives.
class TopN {
 public:
  TopN(LayoutPlanner::Impl& s, const ModelConfig& model, int top)
      : s_(s), model_(model), top_(top) {}

  bool Full() const { return static_cast<int>(ranked_.size()) >= top_; }
  double Last() const { return ranked_.back().iteration_us; }
  // Whether a candidate no faster than `bound` is certainly left out.
  absl::StatusOr<bool> Excludes(double bound, Pending& c) {
    if (!Full() || bound < Last()) return false;
    if (bound > Last()) return true;
    MOEPLAN_ASSIGN_OR_RETURN(const bool before, Before(c, *from_.back()));
    return !before;
  }
  absl::Status Insert(LayoutCandidate cand, Pending& c) {
    size_t at = ranked_.size();
    while (at > 0 && cand.iteration_us <= ranked_[at - 1].iteration_us) {
      if (cand.iteration_us == ranked_[at - 1].iteration_us) {
        MOEPLAN_ASSIGN_OR_RETURN(const bool before, Before(c, *from_[at - 1]));
        if (!before) break;
      }
      --at;
    }
    ranked_.insert(ranked_.begin() + static_cast<ptrdiff_t>(at), std::move(cand));
    from_.insert(from_.begin() + static_cast<ptrdiff_t>(at), &c);
    if (static_cast<int>(ranked_.size()) > top_) {
      ranked_.pop_back();
      from_.pop_back();
    }
    return absl::OkStatus();
  }
  std::vector<LayoutCandidate> Take() { return std::move(ranked_); }

 private:
  // Whether `a` comes before `b` in the unrefined bound's order.
  absl::StatusOr<bool> Before(Pending& a, Pending& b) {
    for (Pending* c : {&a, &b}) {
      if (c->ubound < 0.0) {
        MOEPLAN_ASSIGN_OR_RETURN(c->ubound, s_.Bound(model_, c->layout, c->mbs));
      }
    }
    return a.ubound < b.ubound || (a.ubound == b.ubound && a.index < b.index);
  }

  LayoutPlanner::Impl& s_;
  const ModelConfig& model_;
  const int top_;
  std::vector<LayoutCandidate> ranked_;
  std::vector<Pending*> from_;
};

// What the candidates of one search range over.
struct Axes {
  std::vector<PipelineSchedule> pipelines;
  std::vector<int> zeros;
  std::vector<bool> sequence_parallel;
  std::vector<int> expert_tensor_parallel;  // folded grids tried
  ClusterShape cluster;
  std::vector<bool> a2a_overlap;
  std::vector<Dispatcher> dispatchers;
  std::vector<bool> balanced;  // pipeline splits: even (false), FLOP-balanced (true)
};

// The folded expert grids of a tied dpmoe layout `l` with sequence
// parallelism: each etp of the axes (!= tp) with every ep dividing
// moe.num_experts whose ep * etp divides the stage's tp * cp * dp ranks.
void AddFoldedGrids(const ModelConfig& model, const Layout& l, const Axes& axes,
                    std::vector<Layout>* out) {
  const int64_t stage = int64_t{l.tp} * l.GradientRanks();
  for (int etp : axes.expert_tensor_parallel) {
    if (etp == l.tp || stage % etp != 0) continue;
    for (int ep : Divisors(model.moe.num_experts, stage / etp)) {
      if ((stage / etp) % ep != 0) continue;
      Layout f = l;
      f.ep = ep;
      f.esp = etp;
      if (ValidateLayout(model, f, model.GlobalBatch(), axes.cluster).ok()) out->push_back(f);
    }
  }
}

// Each layout with each sequence-parallel value that applies to it (tp >= 2,
// seq_length divisible by tp * cp, not ppmoe), in order; after the first
// tied dpmoe layout of a stage shape with it, that shape's folded grids.
std::vector<Layout> WithSequenceParallel(const ModelConfig& model, std::span<const Layout> layouts,
                                         const Axes& axes) {
  std::vector<Layout> out;
  const Layout* shape = nullptr;  // the last stage shape given folded grids
  for (const Layout& l : layouts) {
    for (bool sp : axes.sequence_parallel) {
      if (sp && (l.tp < 2 || model.seq_length % (int64_t{l.tp} * l.cp) != 0 ||
                 (!model.IsDense() && l.family == Family::kPpMoe))) {
        continue;
      }
      out.push_back(l);
      out.back().sequence_parallel = sp;
      const bool tied_dpmoe = !model.IsDense() && l.family == Family::kDpMoe && l.esp == l.tp;
      if (sp && tied_dpmoe && !axes.expert_tensor_parallel.empty() &&
          (shape == nullptr || shape->tp != l.tp || shape->pp != l.pp || shape->dp != l.dp ||
           shape->cp != l.cp)) {
        shape = &l;
        const Layout tied = out.back();  // out grows below
        AddFoldedGrids(model, tied, axes, &out);
      }
    }
  }
  return out;
}

// Whether any stage of `l` fits memory, with or without full recomputation
// (l->recompute is left at the first that fits).
// Whether `l` fits GPU memory as it is or with full recomputation (which it
// then sets). `bytes`, when given, gets the busiest stage's memory of the way
// that fits, or of the recomputing way when neither does (every stage is then
// costed; without `bytes` the first stage over the limit ends a way).
bool FitsSomeWay(const ModelConfig& model, int64_t mbs, const MemoryOptions& mem, Layout* l,
                 double* bytes = nullptr) {
  for (bool rc : {false, true}) {
    l->recompute = rc;
    bool ok = true;
    double most = 0.0;
    for (int stage = 0; stage < l->pp && (ok || bytes != nullptr); ++stage) {
      const MemoryBreakdown m =
          StageMemory(model, *l, mbs, stage,
                      InFlightMicrobatches(l->pipeline, l->pp, l->Chunks(), l->microbatches, stage,
                                           l->a2a_overlap),
                      mem);
      ok = ok && m.fits();
      most = std::max(most, m.total);
    }
    if (bytes != nullptr) *bytes = most;
    if (ok) return true;
  }
  return false;
}

// Whether `base` can run pipeline `ps` with v chunks, m micro-batches and
// the A2A overlap `ov` (the rules of ValidateLayout the axes can break).
bool Schedulable(const ModelConfig& model, const Layout& base, PipelineSchedule ps, int v, int m,
                 bool ov) {
  if (ps == PipelineSchedule::kInterleaved &&
      (base.pp < 2 || m % base.pp != 0 || !EvenOrTwoEach(model.num_layers, base.pp * v))) {
    return false;
  }
  if (ps == PipelineSchedule::kDualPipe && (base.pp % 2 != 0 || m % 2 != 0 || m < 2 * base.pp)) {
    return false;
  }
  // Overlap needs EP AlltoAlls to hide, and one stage, interleaving or DualPipe.
  return !ov || (!model.IsDense() && base.ep >= 2 &&
                 (base.pp == 1 || ps == PipelineSchedule::kInterleaved ||
                  ps == PipelineSchedule::kDualPipe));
}

// Each layout with each dispatcher of the axes that applies to it (DeepEP's:
// a MoE model, ep >= 2, not ppmoe), in order.
std::vector<Layout> WithDispatchers(const ModelConfig& model, std::vector<Layout> layouts,
                                    const Axes& axes) {
  if (axes.dispatchers.size() == 1 && axes.dispatchers[0] == Dispatcher::kAllToAll) return layouts;
  std::vector<Layout> out;
  for (const Layout& l : layouts) {
    for (Dispatcher d : axes.dispatchers) {
      if (!DispatcherApplies(model, l, d)) continue;
      out.push_back(l);
      out.back().dispatcher = d;
    }
  }
  return out;
}

// The FLOP-balanced split of `model` over `chunks` chunks, made once per
// chunk count; empty where there is none or it is the even split.
class BalancedSplits {
 public:
  explicit BalancedSplits(const ModelConfig& model) : model_(model) {}
  const std::vector<PipelineStageLayers>& Of(int chunks) {
    auto [it, added] = splits_.try_emplace(chunks);
    if (!added) return it->second;
    std::vector<PipelineStageLayers> s = BalancedPipelineLayout(model_, chunks);
    const int64_t L = model_.num_layers;
    bool even = true;
    for (int i = 0; i < static_cast<int>(s.size()); ++i) {
      even = even && s[static_cast<size_t>(i)].first_block == i * L / chunks &&
             s[static_cast<size_t>(i)].end_block == (i + 1) * L / chunks;
    }
    if (!even) it->second = std::move(s);
    return it->second;
  }

 private:
  const ModelConfig& model_;
  absl::flat_hash_map<int, std::vector<PipelineStageLayers>> splits_;
};

// Every (layout, dispatcher, zero, pipeline, v, m, overlap, split) candidate that fits memory.
// With `points`, every candidate is recorded there too (SearchOptions::record_points).
absl::Status EnumerateCandidates(const ModelConfig& model, std::span<const Layout> layouts,
                                 const SearchOptions& options, const Axes& axes,
                                 const MemoryOptions& mem, const Deadline& deadline,
                                 SearchStats* st, std::vector<Pending>* pending,
                                 std::vector<SearchPoint>* points) {
  const int64_t global = model.GlobalBatch();
  BalancedSplits balanced(model);
  // One candidate: counted, then kept if it fits the step limit and memory.
  auto add = [&](Layout& l, int64_t mbs) -> absl::Status {
    // Enumeration alone can take seconds on the largest searches.
    if (st->enumerated % 1024 == 0) MOEPLAN_RETURN_IF_ERROR(deadline.Check("search"));
    if (++st->enumerated > kMaxSearchCandidates) {
      return absl::ResourceExhaustedError(
          Cat("search: more than ", kMaxSearchCandidates,
              " candidate layouts to enumerate; narrow search.gpus, search.families, "
              "search.pipelines, search.zero_stages or search.max_microbatches"));
    }
    using Kind = SearchPoint::Kind;
    double bytes = 0.0;
    if (PipelineSteps(l) > kMaxPipelineSteps) {
      ++st->over_limit;
      if (points) points->push_back({l, Kind::kSkipped, 0.0, 0.0});
    } else if (!FitsSomeWay(model, mbs, mem, &l, points ? &bytes : nullptr)) {
      ++st->pruned_memory;
      if (points) points->push_back({l, Kind::kOverMemory, bytes, 0.0});
    } else {
      pending->push_back({l, mbs, 0.0, -1.0, pending->size(), points ? points->size() : 0});
      if (points) points->push_back({l, Kind::kBound, bytes, 0.0});
    }
    return absl::OkStatus();
  };
  for (const Layout& base :
       WithDispatchers(model, WithSequenceParallel(model, layouts, axes), axes)) {
    const int64_t per_replica = global / base.dp;
    for (int m : Divisors(per_replica, options.max_microbatches)) {
      for (int z : axes.zeros) {
        for (PipelineSchedule ps : axes.pipelines) {
          if (base.pp == 1 && ps != PipelineSchedule::k1F1B) continue;
          std::vector<int> vs = {1};
          if (ps == PipelineSchedule::kInterleaved) vs = options.virtual_stages;
          for (int v : vs) {
            // The pipeline's model chunks (DualPipe: its pp segments).
            const int chunks = ps == PipelineSchedule::kDualPipe ? base.pp : base.pp * v;
            for (bool ov : axes.a2a_overlap) {
              if (!Schedulable(model, base, ps, v, m, ov)) continue;
              for (bool split : axes.balanced) {
                Layout l = base;
                l.microbatches = m;
                l.zero_stage = z;
                l.pipeline = ps;
                l.virtual_stages = v;
                l.a2a_overlap = ov;
                l.overlap_param_gather = options.overlap_param_gather && (z == 1 || z == 2);
                l.tp_comm_overlap = options.tp_comm_overlap && l.sequence_parallel;
                if (split) {
                  if (base.pp < 2 || !base.stage_layers.empty()) continue;
                  l.stage_layers = balanced.Of(chunks);
                  if (l.stage_layers.empty()) continue;
                }
                MOEPLAN_RETURN_IF_ERROR(add(l, per_replica / m));
              }
            }
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

// Bounding every candidate simulates its pipeline once: refused up front
// when that adds up to more than kMaxSearchSteps.
absl::Status CheckSearchSteps(std::span<const Pending> pending) {
  int64_t steps = 0, most = 0;
  for (const Pending& c : pending) {
    steps += PipelineSteps(c.layout);
    most = std::max(most, PipelineSteps(c.layout));
  }
  if (steps <= kMaxSearchSteps) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      Cat("search: bounding the ", pending.size(), " candidates that fit memory would simulate ",
          steps, " pipeline steps (up to ", most, " each), over the limit of ", kMaxSearchSteps,
          "; lower search.max_microbatches or search.gpus, or narrow search.pipelines, "
          "search.families or search.zero_stages"));
}

// Candidates are simulated in the order of their lower bounds (refined:
// LayoutPlanner::Impl::Bound), no candidate being faster than its bound,
// until the N-th best found is faster than the next bound. With the top N
// full, a candidate is first bounded again with its planned chunks' times,
// planning them one at a time (NoFasterThan), and skipped once that bound
// shows it cannot enter.
// With `points`, each candidate's point gets its bound, then its simulated
// time (the candidates skipped as over the plan memory bound: kSkipped).
absl::Status Rank(LayoutPlanner::Impl& s, const ModelConfig& model, const SearchOptions& options,
                  const ModelPlanOptions& plan, const MemoryOptions& mem,
                  std::vector<Pending>& pending, std::vector<LayoutCandidate>* out,
                  std::vector<SearchPoint>* points) {
  // Candidates whose stage plans would hold more than max_plan_bytes are
  // skipped before anything is built for them; if none is left, the search
  // says why rather than "no layout fits".
  size_t kept = 0;
  absl::Status first_over;
  for (Pending& c : pending) {
    MOEPLAN_RETURN_IF_ERROR(plan.deadline.Check("search"));
    if (absl::Status over = s.CheckChunks(model, c.layout, c.mbs); !over.ok()) {
      if (over.code() != absl::StatusCode::kResourceExhausted) return over;
      ++s.stats->over_memory;
      if (first_over.ok()) first_over = over;
      if (points) (*points)[c.point].kind = SearchPoint::Kind::kSkipped;
      continue;
    }
    MOEPLAN_ASSIGN_OR_RETURN(c.bound, s.Bound(model, c.layout, c.mbs, /*refined=*/true));
    if (points) (*points)[c.point].iteration_us = c.bound;
    pending[kept++] = c;
  }
  pending.resize(kept);
  if (pending.empty() && !first_over.ok()) {
    return absl::ResourceExhaustedError(
        Cat("search: every one of the ", s.stats->over_memory,
            " candidates that fit GPU memory would plan a stage over the memory bound; lower "
            "--gpus or --max-microbatches, or raise max_plan_bytes (first: ",
            View(first_over.message()), ")"));
  }
  std::stable_sort(pending.begin(), pending.end(),
                   [](const Pending& a, const Pending& b) { return a.bound < b.bound; });
  TopN ranked(s, model, options.top);
  for (size_t i = 0; i < pending.size(); ++i) {
    Pending& c = pending[i];
    if (!options.exhaustive && ranked.Full() && c.bound > ranked.Last()) {
      s.stats->pruned_bound += static_cast<int64_t>(pending.size() - i);
      break;
    }
    MOEPLAN_RETURN_IF_ERROR(plan.deadline.Check("search"));
    if (!options.exhaustive && ranked.Full()) {
      MOEPLAN_ASSIGN_OR_RETURN(const double bound,
                               s.NoFasterThan(model, c.layout, c.mbs, ranked.Last()));
      if (points) {
        double& us = (*points)[c.point].iteration_us;
        us = std::max(us, bound);  // the tighter bound, with its chunks planned
      }
      MOEPLAN_ASSIGN_OR_RETURN(const bool excluded, ranked.Excludes(bound, c));
      if (excluded) {
        ++s.stats->pruned_bound;
        continue;
      }
    }
    LayoutCandidate cand;
    MOEPLAN_RETURN_IF_ERROR(s.Run(model, c.layout, c.mbs, mem, &cand));
    if (points) {
      SearchPoint& p = (*points)[c.point];
      p.kind = SearchPoint::Kind::kSimulated;
      p.iteration_us = cand.iteration_us;
      p.memory_bytes = cand.memory.total;
    }
    if (!cand.feasible) continue;
    MOEPLAN_RETURN_IF_ERROR(ranked.Insert(std::move(cand), c));
  }
  *out = ranked.Take();
  return absl::OkStatus();
}

}  // namespace

absl::Status LayoutPlanner::Search(const ModelConfig& model, const SearchOptions& options,
                                   const ModelPlanOptions& plan, const MemoryOptions& memory,
                                   LayoutSearchResult* out) {
  Impl& s = *impl_;
  MOEPLAN_RETURN_IF_ERROR(ValidateModelPlanOptions(plan));
  MOEPLAN_RETURN_IF_ERROR(ValidateMemoryOptions(memory));
  MOEPLAN_RETURN_IF_ERROR(ValidateSearchOptions(options));
  const ClusterShape& shape = s.cost.profile().shape;
  const int g = shape.gpus_per_node;
  const int gpus = options.gpus > 0 ? options.gpus : shape.TotalGpus();
  if (gpus % g != 0 && g % gpus != 0) {
    return Bad("search.gpus", Cat("must divide gpus_per_node (", g, ") or be a multiple of it"),
               Cat(gpus));
  }
  const ClusterShape cluster{std::max(1, gpus / g), g};
  const MemoryOptions mem = s.ResolveMemory(memory);
  s.Begin(model, plan);
  *out = LayoutSearchResult{};
  out->gpus = gpus;
  out->global_batch = model.GlobalBatch();
  s.stats = &out->stats;

  std::vector<Family> families = options.families;
  if (families.empty()) families.assign(std::begin(kAllFamilies), std::end(kAllFamilies));
  Axes axes{options.pipelines,
            options.zero_stages,
            options.sequence_parallel,
            options.expert_tensor_parallel,
            cluster,
            options.a2a_overlap,
            options.dispatchers,
            options.balanced_pipeline};
  if (axes.balanced.empty()) axes.balanced = {false};
  if (axes.sequence_parallel.empty()) axes.sequence_parallel = {false};
  if (axes.a2a_overlap.empty()) axes.a2a_overlap = {false};
  if (axes.dispatchers.empty()) axes.dispatchers = {Dispatcher::kAllToAll};
  // Layouts with and without overlapped pairs share their chunks' plans.
  s.keep_phases =
      std::find(axes.a2a_overlap.begin(), axes.a2a_overlap.end(), true) != axes.a2a_overlap.end() ||
      std::find(options.pipelines.begin(), options.pipelines.end(), PipelineSchedule::kDualPipe) !=
          options.pipelines.end();
  if (axes.pipelines.empty()) {
    axes.pipelines.assign(std::begin(kDefaultSearchPipelines), std::end(kDefaultSearchPipelines));
  }
  if (axes.zeros.empty()) axes.zeros = {0, 1, 2, 3};
  std::vector<int> cps = options.context_parallel;
  if (cps.empty()) cps = {1};
  const std::vector<Layout> layouts = EnumerateLayouts(model, families, cps, gpus, cluster);
  std::vector<Pending> pending;
  std::vector<SearchPoint>* points = options.record_points ? &out->points : nullptr;
  MOEPLAN_RETURN_IF_ERROR(EnumerateCandidates(model, layouts, options, axes, mem, plan.deadline,
                                              &out->stats, &pending, points));
  MOEPLAN_RETURN_IF_ERROR(CheckSearchSteps(pending));
  MOEPLAN_RETURN_IF_ERROR(Rank(s, model, options, plan, mem, pending, &out->candidates, points));
  s.stats = nullptr;
  // The best record_pipelines candidates timed again from their cached
  // chunks (the same times), traced, their spans bounded first.
  const std::span<LayoutCandidate> traced(
      out->candidates.data(),
      std::min(out->candidates.size(), static_cast<size_t>(options.record_pipelines)));
  int64_t spans = 0;
  for (const LayoutCandidate& c : traced) spans += PipelineSpans(c.layout);
  MOEPLAN_RETURN_IF_ERROR(
      CheckTimelineSpans(spans, traced.size(),
                         "ask for fewer pipelines (search.timeline_top), fewer micro-batches "
                         "(search.max_microbatches) or without it"));
  for (LayoutCandidate& c : traced) {
    MOEPLAN_RETURN_IF_ERROR(s.Run(model, c.layout, c.micro_batch_size, mem, &c, /*trace=*/true));
  }
  const double tokens = static_cast<double>(model.GlobalBatch()) * model.seq_length;
  for (SearchPoint& p : out->points) {
    if (p.iteration_us > 0.0) p.tokens_per_s_per_gpu = tokens / (p.iteration_us * 1e-6) / gpus;
  }
  return absl::OkStatus();
}

}  // namespace moeplan::planner
