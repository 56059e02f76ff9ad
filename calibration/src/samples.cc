// Samples of moeplan-profile: reading JSON Lines, the rules a sample and a run
// must follow before anything is fitted, and names for them in messages.
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "fit_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"

namespace moeplan::calibration {
namespace internal {
namespace {

// "samples[3] (allgather 4 ranks / 1 node, 65536 bytes)": which sample, in
// terms the profiler's output can be searched for.
std::string SampleName(size_t i, const v1::ProfileSample& s) {
  return Cat("samples[", i, "] (", internal::PointLabel(s), ")");
}

}  // namespace

std::string PointLabel(const v1::ProfileSample& s) {
  std::string what;
  switch (s.op_case()) {
    case v1::ProfileSample::kCollective: {
      const v1::CollectiveSample& c = s.collective();
      what = Cat(proto::CollectiveLabel(c.collective()), internal::Irregular(c) ? "v" : "", " ",
                 ShapeName(c.shape().ranks(), c.shape().nodes()), ", ", c.bytes(), " bytes",
                 internal::Irregular(c) ? Cat(", heaviest ", c.load_ratio(), "x") : "",
                 c.context_us() > 0.0 ? " in context" : "");
      break;
    }
    case v1::ProfileSample::kSaa: {
      const v1::SaaSample& a = s.saa();
      what = Cat(a.dual() ? "saa dual" : "saa", " a2a ", a.a2a().ranks(), "x", a.a2a().nodes(),
                 " / gather ", a.gather().ranks(), "x", a.gather().nodes(), ", ", a.bytes(),
                 " bytes", a.context_us() > 0.0 ? " in context" : "");
      break;
    }
    case v1::ProfileSample::kGemm:
      what = Cat("gemm ", s.gemm().m(), "x", s.gemm().n(), "x", s.gemm().k());
      if (s.gemm().trans_a() || s.gemm().trans_b()) {
        what += Cat(" ", s.gemm().trans_a() ? "T" : "N", s.gemm().trans_b() ? "T" : "N");
      }
      break;
    case v1::ProfileSample::kMemory:
      what = Cat("memory ", s.memory().kernel(), ", ", s.memory().bytes(), " bytes");
      break;
    default:
      what = "no op";
  }
  return what;
}

namespace {

// Every sample must come from the same run: one layout, one backend, one
// element type; a fit across runs would mix incomparable times.
absl::Status CheckSameRun(const std::vector<v1::ProfileSample>& samples) {
  const v1::ProfileRun& r0 = samples.front().run();
  for (size_t i = 1; i < samples.size(); ++i) {
    const v1::ProfileRun& r = samples[i].run();
    auto differ = [&](std::string_view field, const auto& a, const auto& b) {
      return Bad(Cat("run.", field), Cat("samples mix runs: '", a, "' in samples[0] but '", b,
                                         "' in samples[", i, "]; calibrate one run at a time"));
    };
    if (r.backend() != r0.backend()) return differ("backend", r0.backend(), r.backend());
    if (r.dtype() != r0.dtype()) return differ("dtype", r0.dtype(), r.dtype());
    if (r.mpi_wait() != r0.mpi_wait()) return differ("mpi_wait", r0.mpi_wait(), r.mpi_wait());
    if (r.ranks() != r0.ranks()) return differ("ranks", r0.ranks(), r.ranks());
    if (r.nodes() != r0.nodes()) return differ("nodes", r0.nodes(), r.nodes());
    if (r.ranks_per_node() != r0.ranks_per_node()) {
      return differ("ranks_per_node", r0.ranks_per_node(), r.ranks_per_node());
    }
  }
  if (r0.nodes() < 1) return Bad("run.nodes", Cat("must be >= 1 (got ", r0.nodes(), ")"));
  if (r0.ranks_per_node() < 1) {
    return Bad("run.ranks_per_node", Cat("must be >= 1 (got ", r0.ranks_per_node(), ")"));
  }
  if (int64_t{r0.nodes()} * r0.ranks_per_node() != r0.ranks()) {
    return Bad("run.ranks", Cat("must be nodes * ranks_per_node (got ", r0.ranks(), ", ",
                                r0.nodes(), " * ", r0.ranks_per_node(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckShape(std::string_view who, std::string_view field, const v1::GroupShape& s,
                        int min_ranks) {
  if (s.ranks() < min_ranks || s.nodes() < 1 || s.ranks() % s.nodes() != 0) {
    return Bad(Cat(who, ".", field), Cat("needs ranks >= ", min_ranks,
                                         " spread evenly over nodes >= 1 (got ranks=", s.ranks(),
                                         ", nodes=", s.nodes(), ")"));
  }
  return absl::OkStatus();
}

// Per-sample rules: a time the fits can divide by, sizes a profile can hold,
// and correct results.
absl::Status CheckSample(size_t i, const v1::ProfileSample& s) {
  const std::string who = SampleName(i, s);
  if (s.op_case() == v1::ProfileSample::OP_NOT_SET) {
    return Bad(who, "has no op (collective, saa, gemm or memory)");
  }
  if (s.wrong_elements() > 0) {
    return Bad(Cat(who, ".wrong_elements"),
               Cat("must be 0 (got ", s.wrong_elements(),
                   "): the op returned wrong results, so its time is not a measurement"));
  }
  if (!(s.median_us() > 0.0) || !std::isfinite(s.median_us())) {
    return Bad(Cat(who, ".median_us"), Cat("must be finite and > 0 (got ", s.median_us(), ")"));
  }
  switch (s.op_case()) {
    case v1::ProfileSample::kCollective: {
      const v1::CollectiveSample& c = s.collective();
      if (c.collective() == v1::COLLECTIVE_UNSPECIFIED) {
        return Bad(Cat(who, ".collective.collective"), "must be set");
      }
      MOEPLAN_RETURN_IF_ERROR(CheckShape(who, "collective.shape", c.shape(), 2));
      if (c.bytes() <= 0) return Bad(Cat(who, ".collective.bytes"), "must be > 0");
      if (c.load_ratio() != 0.0) {
        if (!(c.load_ratio() >= 1.0 && c.load_ratio() <= c.shape().ranks())) {
          return Bad(Cat(who, ".collective.load_ratio"),
                     Cat("must be 0 (even) or in [1, ranks = ", c.shape().ranks(), "] (got ",
                         c.load_ratio(), ")"));
        }
        if (c.collective() != v1::COLLECTIVE_ALL_TO_ALL) {
          return Bad(Cat(who, ".collective.load_ratio"), "only an AlltoAll may be uneven");
        }
        if (c.context_us() > 0.0) {
          return Bad(Cat(who, ".collective.load_ratio"),
                     "uneven AlltoAlls are measured isolated (context_us must be 0)");
        }
      }
      break;
    }
    case v1::ProfileSample::kSaa: {
      const v1::SaaSample& a = s.saa();
      MOEPLAN_RETURN_IF_ERROR(CheckShape(who, "saa.a2a", a.a2a(), 1));
      MOEPLAN_RETURN_IF_ERROR(CheckShape(who, "saa.gather", a.gather(), 1));
      if (a.a2a_ranks_per_node() < 1)
        return Bad(Cat(who, ".saa.a2a_ranks_per_node"), "must be >= 1");
      if (a.bytes() <= 0) return Bad(Cat(who, ".saa.bytes"), "must be > 0");
      break;
    }
    case v1::ProfileSample::kGemm: {
      const v1::GemmSample& g = s.gemm();
      // The profile stores the grid axes as int32.
      constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
      const std::pair<std::string_view, int64_t> dims[] = {
          {"m", g.m()}, {"n", g.n()}, {"k", g.k()}};
      for (const auto& [field, v] : dims) {
        if (v < 1 || v > kMax) {
          return Bad(Cat(who, ".gemm.", field), Cat("must be in [1, ", kMax, "] (got ", v, ")"));
        }
      }
      break;
    }
    case v1::ProfileSample::kMemory:
      if (s.memory().bytes() <= 0) return Bad(Cat(who, ".memory.bytes"), "must be > 0");
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShapeName(int ranks, int nodes) {
  return Cat(ranks, ranks == 1 ? " rank / " : " ranks / ", nodes, nodes == 1 ? " node" : " nodes");
}

absl::Status CheckName(std::string_view name) {
  if (name.empty()) return Bad("name", "must not be empty (it names the profile and its file)");
  for (char ch : name) {
    const bool ok =
        (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!ok) return Bad("name", Cat("must match [a-z0-9._-]+ (got ", Quoted(name), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckSamples(const std::vector<v1::ProfileSample>& samples) {
  if (samples.empty()) return Bad("samples", "none given (run moeplan-profile to measure some)");
  MOEPLAN_RETURN_IF_ERROR(CheckSameRun(samples));
  for (size_t i = 0; i < samples.size(); ++i) MOEPLAN_RETURN_IF_ERROR(CheckSample(i, samples[i]));
  return absl::OkStatus();
}

std::string RunComment(const v1::ProfileRun& r, std::string_view extra) {
  std::vector<std::string> hosts(r.hosts().begin(), r.hosts().end());
  if (hosts.empty() && !r.host().empty()) hosts.push_back(r.host());
  std::string c = "Measured by moeplan-profile";
  for (size_t i = 0; i < hosts.size(); ++i) c += Cat(i == 0 ? " on " : ", ", hosts[i]);
  c += Cat(" (", r.nodes(), " x ", r.ranks_per_node(), " ranks");
  for (const std::string& part : {r.backend(), r.dtype(), r.versions()}) {
    if (!part.empty()) c += Cat("; ", part);
  }
  if (!r.moeplan_version().empty()) c += Cat("; moeplan ", r.moeplan_version());
  c += ")";
  if (!r.timestamp().empty()) c += Cat(" at ", r.timestamp());
  c += ".";
  if (!extra.empty()) c += Cat(" ", extra);
  return c;
}

}  // namespace internal

absl::StatusOr<std::vector<v1::ProfileSample>> ParseSamples(std::string_view text,
                                                            std::string_view source) {
  std::vector<v1::ProfileSample> out;
  int line_no = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    v1::ProfileSample s;
    if (absl::Status st = proto::ParseJson(line, &s); !st.ok()) {
      return absl::InvalidArgumentError(Cat(source, ":", line_no, ": ", View(st.message())));
    }
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<std::vector<v1::ProfileSample>> ReadSamples(const std::string& path) {
  MOEPLAN_ASSIGN_OR_RETURN(const std::string text, proto::ReadFile(path));
  return ParseSamples(text, path);
}

}  // namespace moeplan::calibration
