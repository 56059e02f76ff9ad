#include "moeplan/planner/op_graph.h"

#include <iterator>

#include "moeplan/base/strings.h"

namespace moeplan::planner {

std::string_view ResourceName(int index) {
  static constexpr std::string_view kNames[kNumResources] = {"compute", "intra", "inter"};
  return index >= 0 && index < kNumResources ? kNames[index] : "unknown";
}

std::string ResourceMaskName(ResourceMask mask) {
  std::string out;
  for (int r = 0; r < kNumResources; ++r) {
    if (mask & (1u << r)) {
      if (!out.empty()) out += '+';
      out += ResourceName(r);
    }
  }
  return out;
}

bool ParseResourceMask(std::string_view name, ResourceMask* mask) {
  ResourceMask m = 0;
  while (!name.empty()) {
    const size_t plus = name.find('+');
    const std::string_view part = name.substr(0, plus);
    int found = -1;
    for (int r = 0; r < kNumResources; ++r) {
      if (part == ResourceName(r)) found = r;
    }
    if (found < 0 || (m & (1u << found))) return false;
    m = static_cast<ResourceMask>(m | (1u << found));
    if (plus == std::string_view::npos) break;
    name.remove_prefix(plus + 1);
    if (name.empty()) return false;  // a trailing '+'
  }
  if (m == 0) return false;
  *mask = m;
  return true;
}

std::string_view TermName(Term t) {
  switch (t) {
    case Term::kGate:
      return "gate";
    case Term::kOrder:
      return "order";
    case Term::kSplit:
      return "split";
    case Term::kExpert:
      return "expert";
    case Term::kAllToAll:
      return "alltoall";
    case Term::kAllGather:
      return "allgather";
    case Term::kReduceScatter:
      return "reducescatter";
    case Term::kAllReduce:
      return "allreduce";
    case Term::kSendRecv:
      return "sendrecv";
    case Term::kDense:
      return "dense";
    case Term::kOptimizer:
      return "optimizer";
  }
  return "unknown";
}

std::string_view ExecKindName(ExecKind k) {
  static constexpr std::string_view kNames[] = {"none",
                                                "gate",
                                                "gate_backward",
                                                "order",
                                                "iorder",
                                                "iorder_backward",
                                                "order_backward",
                                                "expert_forward",
                                                "expert_backward_data",
                                                "expert_backward_weights",
                                                "slice",
                                                "nop",
                                                "dense_gemm",
                                                "dense_memory",
                                                "counts",
                                                "alltoall",
                                                "allgather",
                                                "reducescatter",
                                                "allreduce",
                                                "saa_exchange",
                                                "saa_gather",
                                                "saa_reduce",
                                                "sendrecv"};
  const size_t i = static_cast<size_t>(k);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

std::string_view ExecGroupName(ExecGroup g) {
  static constexpr std::string_view kNames[] = {"none", "mp",  "ep",      "esp",
                                                "dp",   "edp", "pp_even", "pp_odd"};
  static_assert(std::size(kNames) == kNumExecGroups);
  const size_t i = static_cast<size_t>(g);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

std::string_view BufName(Buf b) {
  static constexpr std::string_view kNames[] = {
      "none",  "x",     "y",    "dy",    "dx",   "xs",    "ys",       "dys",   "dxs",
      "disp",  "ddisp", "comb", "dcomb", "part", "dpart", "recv",     "drecv", "back",
      "dback", "stage", "ein",  "eout",  "dein", "deout", "gate_grad"};
  static_assert(std::size(kNames) == kNumBufs);
  const size_t i = static_cast<size_t>(b);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

std::string Op::Name() const {
  if (step < 0 && block < 0 && part < 0 && mb < 0 && !(flags & (kMoeScope | kStaged))) {
    return std::string(base);
  }
  std::string out;
  if (flags & kStaged) out += Cat("s", device, ".");
  if (chunk >= 0) out += Cat("c", chunk, ".");
  if (mb >= 0) out += Cat("mb", mb, ".");
  if (block >= 0) out += Cat("b", block, ".");
  if (flags & kMoeScope) out += "moe.";
  out += base;
  if (step >= 0) out += Cat(".", step);
  if (part >= 0) out += Cat(".p", part);
  return out;
}

void OpGraph::RecordExec(bool record) {
  if (record == record_exec_) return;
  record_exec_ = record;
  exec_.clear();
  if (record) exec_.resize(ops_.size());  // ops added meanwhile compute nothing said
}

void OpGraph::Reserve(int ops, int deps) {
  ops_.reserve(static_cast<size_t>(ops));
  if (record_exec_) exec_.reserve(static_cast<size_t>(ops));
  dep_begin_.reserve(static_cast<size_t>(ops) + 1);
  dep_ids_.reserve(static_cast<size_t>(deps));
}

bool OpGraph::HasDep(OpId from, OpId to) const {
  for (OpId d : deps(to)) {
    if (d == from) return true;
  }
  return false;
}

void OpGraph::Alias(const BufAlias& alias) {
  for (const BufAlias& a : aliases_) {
    if (a.block == alias.block && a.buf == alias.buf && a.same_as == alias.same_as) return;
  }
  aliases_.push_back(alias);
}

int16_t OpGraph::AddLayer(const ExecLayer& layer) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i] == layer) return static_cast<int16_t>(i + 1);
  }
  layers_.push_back(layer);
  return static_cast<int16_t>(layers_.size());
}

void OpGraph::CopyTables(const OpGraph& from) {
  aliases_ = from.aliases_;
  layers_ = from.layers_;
}

void OpGraph::Clear() {
  ops_.clear();
  exec_.clear();
  aliases_.clear();
  layers_.clear();
  dep_ids_.clear();
  dep_begin_.resize(1);
}

}  // namespace moeplan::planner
