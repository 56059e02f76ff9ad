#include "moeplan/profiler/sweep.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "moeplan/base/format.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/schedules.h"

namespace moeplan::profiler {
namespace {

std::vector<int> Divisors(int v) {
  std::vector<int> d;
  for (int i = 1; i <= v; ++i) {
    if (v % i == 0) d.push_back(i);
  }
  return d;
}

std::string ShapeLabel(GroupShape s) {
  return fmt::format("{} ranks/{} node{}", s.ranks, s.nodes, s.nodes == 1 ? "" : "s");
}

constexpr int64_t kF32 = 4;

}  // namespace

std::vector<GroupShape> ProfiledShapes(const NodeLayout& layout) {
  std::vector<GroupShape> out;
  for (int n : Divisors(layout.nodes)) {
    for (int r : Divisors(layout.ranks_per_node)) {
      if (r * n >= 2) out.push_back({r * n, n});
    }
  }
  std::sort(out.begin(), out.end(), [](GroupShape a, GroupShape b) {
    return a.nodes != b.nodes ? a.nodes < b.nodes : a.ranks < b.ranks;
  });
  return out;
}

GroupSlot SlotOf(const NodeLayout& layout, GroupShape shape, int rank) {
  const int g = layout.ranks_per_node;
  const int per_node = shape.RanksPerNode();
  const int node = rank / g, local = rank % g;
  const int block = node / shape.nodes;  // which block of shape.nodes nodes
  const int slice = local / per_node;    // which slice of each node's ranks
  GroupSlot s;
  s.color = block * (g / per_node) + slice;
  s.key = (node % shape.nodes) * per_node + local % per_node;
  return s;
}

int GroupsOf(const NodeLayout& layout, GroupShape shape) { return layout.ranks() / shape.ranks; }

std::vector<SaaShape> SaaShapes(const NodeLayout& layout) {
  std::vector<SaaShape> out;
  const int p = layout.ranks();
  const planner::ClusterShape cluster{layout.nodes, layout.ranks_per_node};
  for (int n : Divisors(p)) {
    if (n < 2 || p / n < 2 || n > layout.ranks_per_node) continue;
    planner::ParallelLayout par;
    par.mp = n;
    par.esp = n;
    par.ep = p / n;
    const planner::Topology t = planner::MakeTopology(par, cluster);
    SaaShape s;
    s.gather_ranks = n;
    s.gather = t.esp;
    s.a2a = t.ep;
    s.a2a_ranks_per_node = t.ep_ranks_per_node;
    out.push_back(s);
  }
  return out;
}

Bandwidth BandwidthOf(Collective c, int ranks, int64_t bytes, double us) {
  const double r = ranks;
  double data = static_cast<double>(bytes), factor = 1.0;
  switch (c) {
    case Collective::kAllReduce:
      factor = 2.0 * (r - 1.0) / r;
      break;
    case Collective::kAllGather:
      data *= r;  // nccl-tests counts the gathered output
      factor = (r - 1.0) / r;
      break;
    case Collective::kReduceScatter:
      data *= r;  // and the scattered input
      factor = (r - 1.0) / r;
      break;
    case Collective::kAllToAll:
      factor = (r - 1.0) / r;
      break;
    case Collective::kSendRecv:
      break;
  }
  Bandwidth b;
  if (us <= 0.0) return b;
  b.algbw = data / us * 1e-3;  // bytes/us -> GB/s
  b.busbw = b.algbw * factor;
  return b;
}

std::string Point::Label() const {
  switch (kind) {
    case Kind::kCollective:
      return fmt::format("{}{} {} {}{}{}", std::string(planner::CollectiveName(collective)),
                         irregular ? "v" : "", ShapeLabel(shape),
                         FormatBytes(static_cast<double>(bytes)),
                         irregular ? fmt::format(" heaviest {:g}x", load) : "",
                         context_us > 0.0 ? " in context" : "");
    case Kind::kSaa:
      return fmt::format("saa{} a2a {} gather {} {}{}", dual ? "-dual" : "", ShapeLabel(saa.a2a),
                         ShapeLabel(saa.gather), FormatBytes(static_cast<double>(bytes)),
                         context_us > 0.0 ? " in context" : "");
    case Kind::kGemm:
      return fmt::format("gemm {}x{}x{}{}", m, n, k,
                         m == 1 && n == 1 && k == 1 ? ""
                                                    : (trans_a   ? " TN"
                                                       : trans_b ? " NT"
                                                                 : " NN"));
    case Kind::kMemory:
      return fmt::format("{} {} tokens x {}", kernel, tokens, n);
  }
  return "";
}

namespace {

// The options PlanSweep refuses, named by their flags.
absl::Status CheckSweepOptions(const NodeLayout& layout, const SweepOptions& o) {
  if (layout.nodes < 1 || layout.ranks_per_node < 1) {
    return absl::InvalidArgumentError("layout: nodes and ranks per node must be >= 1");
  }
  if (o.min_bytes < 4) return absl::InvalidArgumentError("--min-bytes: must be >= 4");
  if (o.max_bytes < o.min_bytes) {
    return absl::InvalidArgumentError(
        Cat("--max-bytes: must be >= --min-bytes (", o.max_bytes, " < ", o.min_bytes, ")"));
  }
  if (o.size_step < 2) return absl::InvalidArgumentError("--size-step: must be >= 2");
  for (int64_t s : o.gemm_sizes) {
    if (s < 1) return absl::InvalidArgumentError(Cat("--gemm-sizes: must be >= 1 (got ", s, ")"));
  }
  for (int64_t t : o.memory_tokens) {
    if (t < 1) {
      return absl::InvalidArgumentError(Cat("--memory-tokens: must be >= 1 (got ", t, ")"));
    }
  }
  for (double load : o.alltoallv_loads) {
    if (!(load > 1.0 && load <= 1024.0)) {
      return absl::InvalidArgumentError(
          Cat("--alltoallv-loads: must be > 1 and <= 1024 (got ", load, ")"));
    }
  }
  if (!(o.context_us >= 0.0 && o.context_us <= 1e7)) {
    return absl::InvalidArgumentError(
        Cat("--context-ms: must be >= 0 and <= 10000 (got ", o.context_us / 1e3, ")"));
  }
  return absl::OkStatus();
}

// PlanSweep's points, part by part, in the sweep's order; a point over
// o.max_point_bytes is left out, said in `skipped`.
class SweepBuilder {
 public:
  explicit SweepBuilder(const SweepOptions& o) : o_(o) {
    for (int64_t b = o.min_bytes; b <= o.max_bytes; b *= o.size_step) sizes_.push_back(b);
  }

  void AddCollectives(GroupShape shape) {
    for (Collective c : o_.collectives) {
      // SendRecv is the link-level probe: pairs only (an SAA step is one pair
      // exchange per rank, every rank at once).
      if (c == Collective::kSendRecv && shape.ranks != 2) continue;
      for (int64_t b : sizes_) {
        Point p;
        p.kind = Point::Kind::kCollective;
        p.collective = c;
        p.shape = shape;
        const int64_t r = shape.ranks;
        if (c == Collective::kAllToAll && b < r * kF32) continue;  // < one element per peer
        p.bytes = c == Collective::kAllToAll ? b / (r * kF32) * r * kF32 : b / kF32 * kF32;
        switch (c) {
          case Collective::kAllGather:
          case Collective::kReduceScatter:
            p.buffer_bytes = p.bytes * (r + 1);
            break;
          default:
            p.buffer_bytes = 2 * p.bytes;
        }
        AddComm(std::move(p));
      }
    }
  }

  // Irregular AlltoAll: every rank sends n, rank 0 of the group receives
  // L n; L = 1 (even) first, the base the uneven ones are compared with.
  void AddIrregular(GroupShape shape) {
    std::vector<double> loads;
    if (!o_.alltoallv_loads.empty()) loads.push_back(1.0);
    for (double load : o_.alltoallv_loads) {
      if (load <= shape.ranks) loads.push_back(load);
    }
    for (double load : loads) {
      for (int64_t b : sizes_) {
        const int64_t r = shape.ranks;
        if (b < r * kF32) continue;
        Point p;
        p.kind = Point::Kind::kCollective;
        p.collective = Collective::kAllToAll;
        p.shape = shape;
        p.irregular = true;
        p.load = load;
        p.bytes = b / (r * kF32) * r * kF32;
        p.buffer_bytes =
            p.bytes + static_cast<int64_t>(std::ceil(load * static_cast<double>(p.bytes)));
        Add(std::move(p));
      }
    }
  }

  void AddSaa(const NodeLayout& layout) {
    for (const SaaShape& s : SaaShapes(layout)) {
      for (bool dual : {false, true}) {
        for (int64_t b : sizes_) {
          const int64_t w = s.a2a.ranks;
          if (b < w * kF32) continue;
          Point p;
          p.kind = Point::Kind::kSaa;
          p.saa = s;
          p.dual = dual;
          p.bytes = b / (w * kF32) * w * kF32;
          // send + a2a_recv (+ staging) + the gathered output (N copies).
          p.buffer_bytes = p.bytes * (3 + s.gather_ranks);
          AddComm(std::move(p));
        }
      }
    }
  }

  // The launch probe, then the m x n x k grid in NN, NT and TN.
  void AddGemms() {
    Point probe;
    probe.kind = Point::Kind::kGemm;
    probe.m = probe.n = probe.k = 1;
    probe.buffer_bytes = 3 * kF32;
    Add(probe);
    for (int64_t m : o_.gemm_sizes) {
      for (int64_t n : o_.gemm_sizes) {
        for (int64_t k : o_.gemm_sizes) {
          Point p;
          p.kind = Point::Kind::kGemm;
          p.m = m;
          p.n = n;
          p.k = k;
          if (2.0 * m * n * k > o_.gemm_max_flop) {
            sw_.skipped.push_back(
                fmt::format("gemm {}x{}x{} (NN, NT, TN): {:.3g} GFLOP, above --gemm-max-gflop", m,
                            n, k, 2e-9 * m * n * k));
            continue;
          }
          p.buffer_bytes = (m * k + k * n + m * n) * kF32;
          for (const auto& [ta, tb] : {std::pair{false, false}, {false, true}, {true, false}}) {
            Point v = p;
            v.trans_a = ta;
            v.trans_b = tb;
            Add(std::move(v));
          }
        }
      }
    }
  }

  void AddMemory() {
    for (std::string_view kernel : kMemoryKernels) {
      for (int64_t t : o_.memory_tokens) {
        Point p;
        p.kind = Point::Kind::kMemory;
        p.kernel = std::string(kernel);
        p.tokens = t;
        p.n = o_.memory_model_dim;
        const int64_t tokens_bytes = t * o_.memory_model_dim * kF32;
        const bool activation = kernel == "gelu" || kernel == "gelu_bwd";
        p.buffer_bytes = activation
                             ? 2 * tokens_bytes
                             : tokens_bytes * (2 + kMemoryTopK) + t * kMemoryExperts * kF32 * 2;
        Add(std::move(p));
      }
    }
  }

  Sweep Take() { return std::move(sw_); }

 private:
  bool Add(Point p) {
    if (p.buffer_bytes > o_.max_point_bytes) {
      sw_.skipped.push_back(fmt::format("{}: needs {} per rank, more than the {} allowed",
                                        p.Label(), FormatBytes(static_cast<double>(p.buffer_bytes)),
                                        FormatBytes(static_cast<double>(o_.max_point_bytes))));
      return false;
    }
    sw_.points.push_back(std::move(p));
    return true;
  }

  // Communication points, isolated and (with o.context_us) right after it the
  // same point in context: adjacent, so drift of the machine hits both alike.
  void AddComm(Point p) {
    if (Add(p) && o_.context_us > 0.0) {
      p.context_us = o_.context_us;
      sw_.points.push_back(std::move(p));
    }
  }

  const SweepOptions& o_;
  std::vector<int64_t> sizes_;
  Sweep sw_;
};

}  // namespace

absl::StatusOr<Sweep> PlanSweep(const NodeLayout& layout, const SweepOptions& o) {
  MOEPLAN_RETURN_IF_ERROR(CheckSweepOptions(layout, o));
  SweepBuilder b(o);
  for (GroupShape shape : ProfiledShapes(layout)) {
    b.AddCollectives(shape);
    b.AddIrregular(shape);
  }
  if (o.saa) b.AddSaa(layout);
  if (!o.gemm_sizes.empty()) b.AddGemms();  // the launch probe goes with the GEMM grid
  b.AddMemory();
  return b.Take();
}

Sweep PlanCheckSweep(const NodeLayout& layout, int64_t collective_bytes) {
  Sweep sw;
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{256, 256, 256},
                                {1024, 1024, 256},
                                {1024, 1024, 1024}}) {
    Point p;
    p.kind = Point::Kind::kGemm;
    p.m = m;
    p.n = n;
    p.k = k;
    p.buffer_bytes = (m * k + k * n + m * n) * kF32;
    sw.points.push_back(p);
  }
  for (std::string_view kernel : {"copy", "order", "gelu", "gelu_bwd"}) {
    Point p;
    p.kind = Point::Kind::kMemory;
    p.kernel = std::string(kernel);
    p.tokens = 4096;
    p.n = 1024;
    p.buffer_bytes = p.tokens * p.n * kF32 * (2 + kMemoryTopK);
    sw.points.push_back(p);
  }
  for (GroupShape shape : ProfiledShapes(layout)) {
    Point p;
    p.kind = Point::Kind::kCollective;
    p.shape = shape;
    if (shape.ranks == 2) {
      p.collective = Collective::kSendRecv;
      for (int64_t b : {int64_t{64} << 10, int64_t{1} << 20, int64_t{4} << 20}) {
        p.bytes = b;
        p.buffer_bytes = 2 * b;
        sw.points.push_back(p);
      }
    }
    p.collective = Collective::kAllToAll;
    const int64_t unit = shape.ranks * kF32;
    for (int64_t b : {collective_bytes / 4, collective_bytes, collective_bytes * 4}) {
      p.bytes = std::max<int64_t>(b / unit, 1) * unit;
      p.buffer_bytes = 2 * p.bytes;
      sw.points.push_back(p);
    }
  }
  return sw;
}

}  // namespace moeplan::profiler
