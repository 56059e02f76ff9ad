#include "moeplan/planner/cost_model.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "field_rules.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::planner {

std::string_view CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kAllGather:
      return "allgather";
    case Collective::kReduceScatter:
      return "reducescatter";
    case Collective::kAllToAll:
      return "alltoall";
    case Collective::kSendRecv:
      return "sendrecv";
  }
  return "unknown";
}

namespace {

using internal::Bad;

// Physical ranges: a latency of at most 10 s, a link of at least 1 KB/s; and
// a bound on the fits (5 collectives x every group shape of a large cluster).
constexpr size_t kMaxCollectiveFits = 4096;
constexpr double kMaxAlphaUs = 1e7;
constexpr double kMaxBetaUsPerByte = 1e3;

absl::Status CheckAlphaBeta(std::string_view field, const AlphaBeta& ab) {
  if (!(ab.alpha_us >= 0.0 && ab.alpha_us <= kMaxAlphaUs)) {
    return Bad(Cat(field, ".alpha_us"), "must be >= 0 and <= 1e7 (10 s)", Cat(ab.alpha_us));
  }
  if (!(ab.beta_us_per_byte > 0.0 && ab.beta_us_per_byte <= kMaxBetaUsPerByte)) {
    return Bad(Cat(field, ".beta_us_per_byte"), "must be > 0 and <= 1e3 (1 KB/s)",
               Cat(ab.beta_us_per_byte));
  }
  return absl::OkStatus();
}

absl::Status CheckAxis(std::string_view field, const std::vector<int64_t>& axis) {
  if (axis.empty()) return Bad(field, "must not be empty when gemm.efficiency is set", "[]");
  for (size_t i = 0; i < axis.size(); ++i) {
    if (axis[i] <= 0) {
      return Bad(Cat(field, "[", i, "]"), "must be > 0", Cat(axis[i]));
    }
    if (i > 0 && axis[i] <= axis[i - 1]) {
      return Bad(Cat(field, "[", i, "]"), "axis must be strictly increasing",
                 Cat(axis[i - 1], " then ", axis[i]));
    }
  }
  return absl::OkStatus();
}

// Index i and weight t in [0, 1] such that x lies between axis[i] and axis[i + 1];
// clamped to the ends.
inline void Bracket(const std::vector<double>& axis, double x, size_t* i, double* t) {
  const size_t n = axis.size();
  if (n == 1 || x <= axis.front()) {
    *i = 0;
    *t = 0.0;
    return;
  }
  if (x >= axis.back()) {
    *i = n - 2;
    *t = 1.0;
    return;
  }
  const size_t hi =
      static_cast<size_t>(std::upper_bound(axis.begin(), axis.end(), x) - axis.begin());
  *i = hi - 1;
  *t = (x - axis[hi - 1]) / (axis[hi] - axis[hi - 1]);
}

// Rules of one list of collective fits (`field`: its JSON path).
absl::Status CheckCollectiveFits(std::string_view list, const std::vector<CollectiveFit>& fits) {
  if (fits.size() > kMaxCollectiveFits) {
    return Bad(list, Cat("must have at most ", kMaxCollectiveFits, " fits"), Cat(fits.size()));
  }
  absl::flat_hash_map<uint64_t, size_t> fit_index;
  fit_index.reserve(fits.size());
  for (size_t i = 0; i < fits.size(); ++i) {
    const CollectiveFit& f = fits[i];
    const std::string field = Cat(list, "[", i, "]");
    if (f.shape.ranks < 2) {
      return Bad(Cat(field, ".shape.ranks"), "must be >= 2", Cat(f.shape.ranks));
    }
    if (f.shape.nodes < 1 || f.shape.ranks % f.shape.nodes != 0) {
      return Bad(Cat(field, ".shape.nodes"), "must be >= 1 and divide shape.ranks",
                 Cat("ranks=", f.shape.ranks, ", nodes=", f.shape.nodes));
    }
    MOEPLAN_RETURN_IF_ERROR(CheckAlphaBeta(Cat(field, ".cost"), f.cost));
    if (f.pieces.size() > static_cast<size_t>(kMaxFitPieces)) {
      return Bad(Cat(field, ".pieces"), Cat("must have at most ", kMaxFitPieces, " pieces"),
                 Cat(f.pieces.size()));
    }
    for (size_t k = 0; k < f.pieces.size(); ++k) {
      const std::string piece = Cat(field, ".pieces[", k, "]");
      const double from = f.pieces[k].from_bytes;
      if (k == 0 && from != 0.0) return Bad(Cat(piece, ".from_bytes"), "must be 0", Cat(from));
      if (k > 0 && !(from > f.pieces[k - 1].from_bytes)) {
        return Bad(Cat(piece, ".from_bytes"), "must be greater than the previous piece's",
                   Cat(from));
      }
      MOEPLAN_RETURN_IF_ERROR(CheckAlphaBeta(Cat(piece, ".cost"), f.pieces[k].cost));
    }
    // One pass: a hash of the fits seen (was a scan of all earlier fits per fit).
    const auto [it, fresh] = fit_index.try_emplace(CostModel::FitKey(f.collective, f.shape), i);
    if (!fresh) {
      return Bad(field, "duplicate (collective, shape) fit",
                 Cat("same as ", list, "[", it->second, "]"));
    }
  }
  return absl::OkStatus();
}

// Rules of profile.context (profile.proto's ContextModel).
absl::Status CheckContext(const ClusterProfile& p) {
  MOEPLAN_RETURN_IF_ERROR(CheckCollectiveFits("context.collectives", p.context.collectives));
  if (p.context.ops.size() > kMaxOpContexts) {
    return Bad("context.ops", Cat("must have at most ", kMaxOpContexts, " entries"),
               Cat(p.context.ops.size()));
  }
  absl::flat_hash_map<std::string, size_t> seen;
  for (size_t i = 0; i < p.context.ops.size(); ++i) {
    const OpContext& c = p.context.ops[i];
    const std::string field = Cat("context.ops[", i, "]");
    if (c.op.empty() || c.op.size() > 256) {
      return Bad(Cat(field, ".op"), "must be an op name of 1 to 256 characters",
                 Cat(c.op.size(), " characters"));
    }
    if (c.resources == 0 || c.resources > 7) {
      return Bad(Cat(field, ".resource"), "must be compute, intra, inter or a '+' join of them",
                 Cat(int{c.resources}));
    }
    if (!(c.offset_us >= 0.0 && c.offset_us <= kMaxAlphaUs)) {
      return Bad(Cat(field, ".offset_us"), "must be >= 0 and <= 1e7 (10 s)", Cat(c.offset_us));
    }
    if (!(c.scale >= kMinContextScale && c.scale <= kMaxContextScale)) {
      return Bad(Cat(field, ".scale"), "must be >= 0.01 and <= 100", Cat(c.scale));
    }
    const auto [it, fresh] = seen.try_emplace(Cat(c.op, "/", int{c.resources}), i);
    if (!fresh) {
      return Bad(field, "duplicate (op, resource) entry",
                 Cat("same as context.ops[", it->second, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// The name (it names a file), the source, the cluster's shape and memory.
absl::Status CheckIdentity(const ClusterProfile& p) {
  if (p.name.empty()) return Bad("name", "must not be empty", "\"\"");
  for (char ch : p.name) {
    const bool ok =
        (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!ok) return Bad("name", "must match [a-z0-9._-]+", Quoted(p.name));
  }
  if (p.name.size() > 64) return Bad("name", "must be at most 64 characters", Cat(p.name.size()));
  if (!((p.name[0] >= 'a' && p.name[0] <= 'z') || (p.name[0] >= '0' && p.name[0] <= '9'))) {
    return Bad("name", "must start with [a-z0-9] (it names a file)", Quoted(p.name));
  }
  if (p.source == ProfileSource::kUnspecified) {
    return Bad("source", "must be PROFILE_SOURCE_MEASURED or PROFILE_SOURCE_SPEC", "unset");
  }
  if (p.shape.nodes < 1) return Bad("nodes", "must be >= 1", Cat(p.shape.nodes));
  if (!std::isfinite(p.gpu_memory_gib) || p.gpu_memory_gib < 0.0 || p.gpu_memory_gib > 1e6) {
    return Bad("gpu_memory_gib", "must be finite, >= 0 (0: unknown) and <= 1e6",
               Cat(p.gpu_memory_gib));
  }
  if (p.shape.gpus_per_node < 1) {
    return Bad("gpus_per_node", "must be >= 1", Cat(p.shape.gpus_per_node));
  }
  if (int64_t{p.shape.nodes} * p.shape.gpus_per_node > (1 << 20)) {
    return Bad("nodes", "nodes*gpus_per_node must be <= 1048576",
               Cat(int64_t{p.shape.nodes} * p.shape.gpus_per_node));
  }
  return absl::OkStatus();
}

// alltoall_skew: one gamma in [0, 1] per distinct EP shape.
absl::Status CheckSkew(const ClusterProfile& p) {
  for (size_t i = 0; i < p.alltoall_skew.size(); ++i) {
    const AlltoAllSkew& s = p.alltoall_skew[i];
    const std::string field = Cat("alltoall_skew[", i, "]");
    if (s.shape.ranks < 2 || s.shape.nodes < 1 || s.shape.ranks % s.shape.nodes != 0) {
      return Bad(Cat(field, ".shape"), "ranks must be >= 2 and a multiple of nodes >= 1",
                 Cat(s.shape.ranks, " ranks / ", s.shape.nodes, " nodes"));
    }
    if (!(s.gamma >= 0.0 && s.gamma <= 1.0)) {
      return Bad(Cat(field, ".gamma"), "must be in [0, 1]", Cat(s.gamma));
    }
    for (size_t j = 0; j < i; ++j) {
      if (p.alltoall_skew[j].shape.ranks == s.shape.ranks &&
          p.alltoall_skew[j].shape.nodes == s.shape.nodes) {
        return Bad(Cat(field, ".shape"), "duplicate shape", Cat("same as alltoall_skew[", j, "]"));
      }
    }
  }
  return absl::OkStatus();
}

// The GEMM model: peak, launch overhead, and the efficiency grid when given.
absl::Status CheckGemm(const ClusterProfile& p) {
  if (!(p.gemm.peak_tflops > 0.0 && p.gemm.peak_tflops <= 1e6)) {
    return Bad("gemm.peak_tflops", "must be > 0 and <= 1e6", Cat(p.gemm.peak_tflops));
  }
  const double fp8 = p.gemm.fp8_peak_tflops;  // 0: unset
  if (fp8 != 0.0 && !(fp8 > 0.0 && fp8 <= 1e6)) {
    return Bad("gemm.fp8_peak_tflops", "must be > 0 and <= 1e6 when set", Cat(fp8));
  }
  if (fp8 != 0.0 && fp8 < p.gemm.peak_tflops) {
    return Bad("gemm.fp8_peak_tflops", "must be >= gemm.peak_tflops when set",
               Cat(fp8, " < ", p.gemm.peak_tflops));
  }
  if (!(p.gemm.launch_overhead_us >= 0.0 && p.gemm.launch_overhead_us <= kMaxAlphaUs)) {
    return Bad("gemm.launch_overhead_us", "must be >= 0 and <= 1e7 (10 s)",
               Cat(p.gemm.launch_overhead_us));
  }
  const GemmEfficiencyGrid& g = p.gemm.grid;
  const bool any_grid = !g.m.empty() || !g.n.empty() || !g.k.empty() || !g.efficiency.empty();
  if (any_grid) {
    MOEPLAN_RETURN_IF_ERROR(CheckAxis("gemm.m", g.m));
    MOEPLAN_RETURN_IF_ERROR(CheckAxis("gemm.n", g.n));
    MOEPLAN_RETURN_IF_ERROR(CheckAxis("gemm.k", g.k));
    const size_t want = g.m.size() * g.n.size() * g.k.size();
    if (g.efficiency.size() != want) {
      return Bad("gemm.efficiency", "must have |m|*|n|*|k| entries",
                 Cat(g.efficiency.size(), ", want ", want));
    }
    for (size_t i = 0; i < want; ++i) {
      const double e = g.efficiency[i];
      if (!(e > 0.0 && e <= 1.0)) {
        return Bad(Cat("gemm.efficiency[", i, "]"), "must be in (0, 1]", Cat(e));
      }
    }
  }
  return absl::OkStatus();
}

// The memory model and the kernels priced by their own lines.
absl::Status CheckMemoryKernels(const ClusterProfile& p) {
  if (!(p.memory.bandwidth_gbytes_per_s > 0.0) || !std::isfinite(p.memory.bandwidth_gbytes_per_s)) {
    return Bad("memory.bandwidth_gbytes_per_s", "must be finite and > 0",
               Cat(p.memory.bandwidth_gbytes_per_s));
  }
  if (!(p.memory.launch_overhead_us >= 0.0) || !std::isfinite(p.memory.launch_overhead_us)) {
    return Bad("memory.launch_overhead_us", "must be finite and >= 0",
               Cat(p.memory.launch_overhead_us));
  }
  for (const auto& [name, m] : {std::pair{"activation.forward", &p.activation.forward},
                                {"activation.backward", &p.activation.backward},
                                {"kernels.order", &p.kernels.order},
                                {"kernels.iorder", &p.kernels.iorder},
                                {"kernels.route", &p.kernels.route}}) {
    if (!(m->bandwidth_gbytes_per_s >= 0.0) || !std::isfinite(m->bandwidth_gbytes_per_s)) {
      return Bad(Cat(name, ".bandwidth_gbytes_per_s"),
                 "must be finite and >= 0 (0: the memory model)", Cat(m->bandwidth_gbytes_per_s));
    }
    if (!(m->launch_overhead_us >= 0.0) || !std::isfinite(m->launch_overhead_us)) {
      return Bad(Cat(name, ".launch_overhead_us"), "must be finite and >= 0",
                 Cat(m->launch_overhead_us));
    }
    if (m->bandwidth_gbytes_per_s == 0.0 && m->launch_overhead_us != 0.0) {
      return Bad(Cat(name, ".launch_overhead_us"),
                 "must be 0 when bandwidth_gbytes_per_s is 0 (the memory model applies)",
                 Cat(m->launch_overhead_us));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateProfile(const ClusterProfile& p) {
  MOEPLAN_RETURN_IF_ERROR(CheckIdentity(p));
  MOEPLAN_RETURN_IF_ERROR(CheckAlphaBeta("links.intra", p.intra));
  MOEPLAN_RETURN_IF_ERROR(CheckAlphaBeta("links.inter", p.inter));
  MOEPLAN_RETURN_IF_ERROR(CheckCollectiveFits("collectives", p.collectives));
  MOEPLAN_RETURN_IF_ERROR(CheckContext(p));
  MOEPLAN_RETURN_IF_ERROR(CheckSkew(p));
  MOEPLAN_RETURN_IF_ERROR(CheckGemm(p));
  return CheckMemoryKernels(p);
}

absl::StatusOr<CostModel> CostModel::Create(ClusterProfile profile) {
  MOEPLAN_RETURN_IF_ERROR(ValidateProfile(profile));
  return CostModel(std::move(profile));
}

CostModel::CostModel(ClusterProfile profile) : profile_(std::move(profile)) {
  static std::atomic<uint64_t> next_grid_id{1};
  grid_id_ = next_grid_id.fetch_add(1, std::memory_order_relaxed);
  // In-context fits last: they replace the isolated fit of their key.
  std::vector<const CollectiveFit*> all;
  for (const CollectiveFit& f : profile_.collectives) all.push_back(&f);
  for (const CollectiveFit& f : profile_.context.collectives) all.push_back(&f);
  for (const CollectiveFit* fp : all) {
    const CollectiveFit& f = *fp;
    Piecewise pw;
    if (f.pieces.empty()) {
      pw.count = 1;
      pw.cost[0] = f.cost;
    } else {
      pw.count = static_cast<int>(f.pieces.size());
      for (int i = 0; i < pw.count; ++i) {
        pw.from[i] = f.pieces[static_cast<size_t>(i)].from_bytes;
        pw.cost[i] = f.pieces[static_cast<size_t>(i)].cost;
      }
    }
    fits_.insert_or_assign(FitKey(f.collective, f.shape), pw);
  }
  for (const OpContext& c : profile_.context.ops) {
    op_context_[c.op][c.resources & 7u] = {true, c.offset_us, c.scale};
  }
  const GemmEfficiencyGrid& g = profile_.gemm.grid;
  const std::vector<int64_t>* axes[3] = {&g.m, &g.n, &g.k};
  for (int a = 0; a < 3; ++a) {
    for (int64_t v : *axes[a]) log_axes_[a].push_back(std::log2(static_cast<double>(v)));
  }
  flops_per_us_ = profile_.gemm.peak_tflops * 1e6;                   // 1 TFLOP/s = 1e6 flop/us
  mem_bytes_per_us_ = profile_.memory.bandwidth_gbytes_per_s * 1e3;  // 1 GB/s = 1e3 B/us
  const MemoryModel* act[kLines] = {&profile_.activation.forward, &profile_.activation.backward,
                                    &profile_.kernels.order, &profile_.kernels.iorder,
                                    &profile_.kernels.route};
  for (size_t i = 0; i < kLines; ++i) {
    const bool own = act[i]->bandwidth_gbytes_per_s > 0.0;
    act_[i] = {own ? act[i]->launch_overhead_us : profile_.memory.launch_overhead_us,
               own ? act[i]->bandwidth_gbytes_per_s * 1e3 : mem_bytes_per_us_};
  }
}

uint64_t CostModel::FitKey(Collective c, GroupShape shape) {
  return (uint64_t{static_cast<uint8_t>(c)} << 56) | (uint64_t(uint32_t(shape.ranks)) << 24) |
         uint64_t(uint32_t(shape.nodes));
}

bool CostModel::HasFit(Collective c, GroupShape shape) const {
  return fits_.contains(FitKey(c, shape));
}

double CostModel::SkewedAllToAllBytes(GroupShape shape, double bytes, double skew) const {
  double gamma = 1.0;
  for (const AlltoAllSkew& s : profile_.alltoall_skew) {  // a handful of shapes
    if (s.shape.ranks == shape.ranks && s.shape.nodes == shape.nodes) gamma = s.gamma;
  }
  return bytes * (1.0 + gamma * (skew - 1.0));
}

double CostModel::CollectiveUs(Collective c, GroupShape shape, double n) const {
  if (shape.ranks <= 1) return 0.0;
  if (!fits_.empty()) {
    if (auto it = fits_.find(FitKey(c, shape)); it != fits_.end()) return it->second.At(n);
  }
  const AlphaBeta& l = LinkFor(shape);
  const double s = shape.ranks;
  switch (c) {
    case Collective::kAllReduce:
      return 2.0 * (s - 1.0) * (l.alpha_us + n / s * l.beta_us_per_byte);
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return (s - 1.0) * (l.alpha_us + n * l.beta_us_per_byte);
    case Collective::kAllToAll:
      return (s - 1.0) * (l.alpha_us + n / s * l.beta_us_per_byte);
    case Collective::kSendRecv:
      return l.At(n);
  }
  return 0.0;
}

double CostModel::PeakTflops(int bytes_per_element) const {
  const GemmModel& g = profile_.gemm;
  return bytes_per_element == 1 && g.fp8_peak_tflops > 0.0 ? g.fp8_peak_tflops : g.peak_tflops;
}

CostModel CostModel::AtElementBytes(int bytes_per_element) const {
  CostModel copy = *this;
  copy.flops_per_us_ = PeakTflops(bytes_per_element) * 1e6;  // 1 TFLOP/s = 1e6 flop/us
  return copy;
}

// Planners ask for the same few shapes again and again (every block of a
// model, every plan of a search): a small direct-mapped memo per thread,
// keyed by the model's grid id and the shape, holds the interpolated value.
double CostModel::GemmEfficiency(int64_t m, int64_t n, int64_t k) const {
  if (profile_.gemm.grid.efficiency.empty()) return 1.0;
  struct Entry {
    uint64_t grid = 0;  // 0: empty (ids start at 1)
    int64_t m = 0, n = 0, k = 0;
    double efficiency = 0.0;
  };
  constexpr size_t kEntries = 1024;
  thread_local std::array<Entry, kEntries> memo;
  const uint64_t h = (static_cast<uint64_t>(m) * 0x9E3779B97F4A7C15ull) ^
                     (static_cast<uint64_t>(n) * 0xC2B2AE3D27D4EB4Full) ^
                     (static_cast<uint64_t>(k) * 0x165667B19E3779F9ull) ^ grid_id_;
  Entry& e = memo[(h ^ (h >> 29)) & (kEntries - 1)];
  if (e.grid != grid_id_ || e.m != m || e.n != n || e.k != k) {
    e = Entry{grid_id_, m, n, k, InterpolateGemmEfficiency(m, n, k)};
  }
  return e.efficiency;
}

double CostModel::InterpolateGemmEfficiency(int64_t m, int64_t n, int64_t k) const {
  const GemmEfficiencyGrid& g = profile_.gemm.grid;
  if (g.efficiency.empty()) return 1.0;
  size_t i[3];
  double t[3];
  const double x[3] = {std::log2(static_cast<double>(std::max<int64_t>(m, 1))),
                       std::log2(static_cast<double>(std::max<int64_t>(n, 1))),
                       std::log2(static_cast<double>(std::max<int64_t>(k, 1)))};
  for (int a = 0; a < 3; ++a) Bracket(log_axes_[a], x[a], &i[a], &t[a]);
  const size_t nn = g.n.size(), nk = g.k.size();
  double e = 0.0;
  for (int dm = 0; dm < 2; ++dm) {
    const double wm = dm ? t[0] : 1.0 - t[0];
    if (wm == 0.0) continue;
    for (int dn = 0; dn < 2; ++dn) {
      const double wn = dn ? t[1] : 1.0 - t[1];
      if (wn == 0.0) continue;
      for (int dk = 0; dk < 2; ++dk) {
        const double wk = dk ? t[2] : 1.0 - t[2];
        if (wk == 0.0) continue;
        e += wm * wn * wk * g.efficiency[((i[0] + dm) * nn + (i[1] + dn)) * nk + (i[2] + dk)];
      }
    }
  }
  return e;
}

double CostModel::GemmUs(int64_t m, int64_t n, int64_t k) const {
  if (m <= 0 || n <= 0 || k <= 0) return 0.0;
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  return profile_.gemm.launch_overhead_us + flops / (flops_per_us_ * GemmEfficiency(m, n, k));
}

double CostModel::BatchedGemmUs(int64_t batch, int64_t m, int64_t n, int64_t k) const {
  if (batch <= 0 || m <= 0 || n <= 0 || k <= 0) return 0.0;
  const double flops = 2.0 * static_cast<double>(batch) * static_cast<double>(m) *
                       static_cast<double>(n) * static_cast<double>(k);
  return profile_.gemm.launch_overhead_us + flops / (flops_per_us_ * GemmEfficiency(m, n, k));
}

double CostModel::ActivationUs(double bytes, bool backward) const {
  return LineUs(backward ? kActBackward : kActForward, bytes);
}

double CostModel::OrderUs(double bytes, bool inverse) const {
  return LineUs(inverse ? kIOrderLine : kOrderLine, bytes);
}

double CostModel::RouteUs(double bytes) const { return LineUs(kRouteLine, bytes); }

double CostModel::MemoryBoundUs(double bytes) const {
  if (bytes <= 0.0) return 0.0;
  return profile_.memory.launch_overhead_us + bytes / mem_bytes_per_us_;
}

}  // namespace moeplan::planner
