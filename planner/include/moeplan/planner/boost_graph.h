// The op graph as a Boost.Graph, for graph algorithms and exports (tests
// cross-check the simulator's single pass with boost::topological_sort). Kept
// out of op_graph.h so that the planner's consumers do not compile Boost.Graph.
// Allocates: not for the hot path.
#pragma once

#include <boost/graph/adjacency_list.hpp>

#include "moeplan/planner/op_graph.h"

namespace moeplan::planner {

// Vertices are ops in issue order (vertex i = OpId i, carrying the Op); edges
// run dependency -> op.
using OpBoostGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Op,
                                           boost::no_property, boost::no_property, boost::vecS>;

inline OpBoostGraph ToBoostGraph(const OpGraph& graph) {
  OpBoostGraph g(static_cast<size_t>(graph.size()));
  for (OpId v = 0; v < graph.size(); ++v) {
    g[static_cast<OpBoostGraph::vertex_descriptor>(v)] = graph.op(v);
    for (OpId d : graph.deps(v)) boost::add_edge(static_cast<size_t>(d), static_cast<size_t>(v), g);
  }
  return g;
}

}  // namespace moeplan::planner
