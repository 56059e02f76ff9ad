#include "moeplan/planner/op_graph.h"

#include "moeplan/planner/strings.h"

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
  }
  return "unknown";
}

std::string Op::Name() const {
  if (step < 0) return std::string(base);
  return Cat(base, ".", step);
}

OpId OpGraph::Add(const Op& op, std::initializer_list<OpId> deps) {
  const auto v = boost::add_vertex(op, graph_);
  for (OpId d : deps) {
    if (d != kNoOp) boost::add_edge(static_cast<Graph::vertex_descriptor>(d), v, graph_);
  }
  return static_cast<OpId>(v);
}

}  // namespace moeplan::planner
