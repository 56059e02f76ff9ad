// What the codec's translation units share (private to moeplan::proto): the
// planner <-> wire enum tables and a plan's op timings and critical terms.
#pragma once

#include <cstddef>

#include "moeplan/planner/model.h"
#include "moeplan/planner/model_planner.h"
#include "moeplan/planner/op_graph.h"
#include "moeplan/planner/simulator.h"
#include "moeplan/planner/types.h"
#include "moeplan/v1/model.pb.h"
#include "moeplan/v1/plan.pb.h"
#include "moeplan/v1/profile.pb.h"

namespace moeplan::proto::internal {

namespace p = ::moeplan::planner;

// The planner <-> wire enum pairs, one table per enum: both directions read
// it, so a new value is added in one place.
template <class P, class W>
struct EnumPair {
  P planner;
  W wire;
};
inline constexpr EnumPair<p::Collective, v1::Collective> kCollectives[] = {
    {p::Collective::kAllReduce, v1::COLLECTIVE_ALL_REDUCE},
    {p::Collective::kAllGather, v1::COLLECTIVE_ALL_GATHER},
    {p::Collective::kReduceScatter, v1::COLLECTIVE_REDUCE_SCATTER},
    {p::Collective::kAllToAll, v1::COLLECTIVE_ALL_TO_ALL},
    {p::Collective::kSendRecv, v1::COLLECTIVE_SEND_RECV},
};
inline constexpr EnumPair<p::Schedule, v1::Schedule> kSchedules[] = {
    {p::Schedule::kDefault, v1::SCHEDULE_DEFAULT},
    {p::Schedule::kS1, v1::SCHEDULE_S1},
    {p::Schedule::kS2, v1::SCHEDULE_S2},
};

inline constexpr EnumPair<p::Gate, v1::Gate> kGates[] = {
    {p::Gate::kTopK, v1::GATE_TOP_K},
    {p::Gate::kSwitch, v1::GATE_SWITCH},
    {p::Gate::kBatchPrioritized, v1::GATE_BATCH_PRIORITIZED},
};
inline constexpr EnumPair<p::Variant, v1::OverlapVariant> kVariants[] = {
    {p::Variant::kNone, v1::OVERLAP_VARIANT_NONE},
    {p::Variant::kTutel, v1::OVERLAP_VARIANT_TUTEL},
    {p::Variant::kDw, v1::OVERLAP_VARIANT_DW},
    {p::Variant::kPartition, v1::OVERLAP_VARIANT_PARTITION},
    {p::Variant::kLancet, v1::OVERLAP_VARIANT_LANCET},
};
inline constexpr EnumPair<p::AllToAllAlgo, v1::AllToAllAlgorithm> kAlgos[] = {
    {p::AllToAllAlgo::kLinear, v1::ALLTOALL_ALGORITHM_LINEAR},
    {p::AllToAllAlgo::kHierarchical, v1::ALLTOALL_ALGORITHM_HIERARCHICAL},
    {p::AllToAllAlgo::kDeepEp, v1::ALLTOALL_ALGORITHM_DEEPEP},
    {p::AllToAllAlgo::kAllGather, v1::ALLTOALL_ALGORITHM_ALLGATHER},
};

template <class P, class W, size_t N>
W ToWire(const EnumPair<P, W> (&table)[N], P value, W unspecified) {
  for (const auto& e : table) {
    if (e.planner == value) return e.wire;
  }
  return unspecified;
}
template <class P, class W, size_t N>
const P* FromWire(const EnumPair<P, W> (&table)[N], W value) {
  for (const auto& e : table) {
    if (e.wire == value) return &e.planner;
  }
  return nullptr;
}

// Every op of `graph` with its simulated times (a response's timeline).
void AddOpTimings(const p::OpGraph& graph, const p::SimResult& sim,
                  google::protobuf::RepeatedPtrField<v1::OpTiming>* out);
// The critical path's time per term.
void AddCriticalTerms(const p::SimResult& sim,
                      google::protobuf::RepeatedPtrField<v1::TermTime>* out);

}  // namespace moeplan::proto::internal
