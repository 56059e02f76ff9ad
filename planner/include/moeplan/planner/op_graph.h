// The op graph of DESIGN §4: a DAG (Boost.Graph adjacency_list) of ops, each with
// a name, kind, held resources, cost and dependencies. Ops are added in issue
// order and may only depend on ops added before them, so vertex order is both the
// per-resource issue order and a topological order: the simulator needs one pass.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include <boost/graph/adjacency_list.hpp>

namespace moeplan::planner {

// Resources an op occupies (a bit mask; a fused op may hold several).
enum Resource : uint8_t { kCompute = 1, kIntra = 2, kInter = 4 };
inline constexpr int kNumResources = 3;
using ResourceMask = uint8_t;
std::string ResourceMaskName(ResourceMask mask);  // e.g. "intra+inter"
std::string_view ResourceName(int index);         // 0 compute, 1 intra, 2 inter

enum class OpKind : uint8_t { kCompute, kComm };
enum class Phase : uint8_t { kForward, kBackward };

// The cost-model term an op is accounted under (critical-path attribution).
enum class Term : uint8_t {
  kGate,
  kOrder,   // order, i-order
  kSplit,   // local MP splits
  kExpert,
  kAllToAll,
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kSendRecv,
};
inline constexpr int kNumTerms = 9;
std::string_view TermName(Term t);

struct Op {
  // Static name (a string literal); with step >= 0 the full name is "<base>.<step>".
  std::string_view base;
  int step = -1;
  OpKind kind = OpKind::kCompute;
  Phase phase = Phase::kForward;
  Term term = Term::kGate;
  ResourceMask resources = kCompute;
  double cost_us = 0.0;
  int64_t bytes = 0;             // comm: the collective's n; compute: bytes touched
  int64_t inter_node_bytes = 0;  // bytes this rank sends across nodes

  std::string Name() const;
};

using OpId = int;
inline constexpr OpId kNoOp = -1;

class OpGraph {
 public:
  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Op,
                                      boost::no_property, boost::no_property, boost::vecS>;

  // Appends `op` after every op added so far (issue order) with edges from each
  // dependency. Dependencies equal to kNoOp are ignored; others must be ids
  // returned earlier (checked by the simulator).
  OpId Add(const Op& op, std::initializer_list<OpId> deps);

  int size() const { return static_cast<int>(boost::num_vertices(graph_)); }
  const Op& op(OpId id) const { return graph_[static_cast<Graph::vertex_descriptor>(id)]; }
  const Graph& graph() const { return graph_; }
  void Clear() { graph_.clear(); }

 private:
  Graph graph_;
};

}  // namespace moeplan::planner
