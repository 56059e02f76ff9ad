// Planning a variant that ran again, and telling how two plans differ
// (requests/README.md).
#include "moeplan/requests/replan.h"

#include <algorithm>
#include <string>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/proto/convert.h"

namespace moeplan::requests {

namespace p = ::moeplan::planner;

absl::StatusOr<v1::PlanModelRequest> PinnedModelRequest(const v1::ModelConfig& model,
                                                        const v1::VariantPlan& ran) {
  p::Variant variant;
  if (!p::ParseVariant(ran.name(), &variant)) {
    return absl::InvalidArgumentError(Cat(
        "variant: must be none, tutel, dw, partition or lancet (got ", Quoted(ran.name()), ")"));
  }
  v1::PlanModelRequest req;
  *req.mutable_model() = model;
  v1::ModelPlanOptions* o = req.mutable_options();
  o->add_variants(proto::VariantToProto(variant));
  o->add_schedules(ran.schedule());
  o->add_alltoall_algorithms(ran.alltoall());
  if (variant == p::Variant::kTutel && ran.tutel_degree() > 0) {
    o->add_tutel_degrees(ran.tutel_degree());
  }
  return req;
}

namespace {

std::string RangesText(const v1::VariantPlan& v) {
  std::string out;
  for (const v1::PartitionRange& r : v.partition_ranges()) {
    out += Cat(out.empty() ? "" : ", ", r.first_op(), "..", r.last_op(), " k=", r.k());
  }
  return out.empty() ? "none" : out;
}

std::string PlacementsText(const v1::VariantPlan& v) {
  std::string out;
  for (const v1::DwPlacement& d : v.dw_placements()) {
    out += Cat(out.empty() ? "" : ", ", d.dw_ops_size(), " after ", d.alltoall());
  }
  return out.empty() ? "none" : out;
}

// (AlltoAll, dW op) pairs: a placement's identity, whatever its order.
std::vector<std::string> DwPairs(const v1::VariantPlan& v) {
  std::vector<std::string> out;
  for (const v1::DwPlacement& d : v.dw_placements()) {
    for (const std::string& op : d.dw_ops()) out.push_back(Cat(d.alltoall(), ">", op));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string PlanDifference(const v1::VariantPlan& ran, const v1::VariantPlan& planned) {
  if (ran.schedule() != planned.schedule()) {
    return Cat("schedule ", proto::ScheduleLabel(planned.schedule()), " where ",
               proto::ScheduleLabel(ran.schedule()), " ran");
  }
  if (ran.tutel_degree() != planned.tutel_degree()) {
    return Cat("Tutel degree ", planned.tutel_degree(), " where ", ran.tutel_degree(), " ran");
  }
  if (RangesText(ran) != RangesText(planned)) {
    return Cat("partition ranges ", RangesText(planned), " where ", RangesText(ran), " ran");
  }
  if (DwPairs(ran) != DwPairs(planned)) {
    return Cat("dW placements ", PlacementsText(planned), " where ", PlacementsText(ran), " ran");
  }
  const int ran_ops = ran.ops_size() > 0 ? ran.ops_size() : ran.num_ops();
  const int planned_ops = planned.ops_size() > 0 ? planned.ops_size() : planned.num_ops();
  if (ran_ops != planned_ops) return Cat(planned_ops, " ops where ", ran_ops, " ran");
  if (ran.ops_size() == 0 || planned.ops_size() == 0) return "";
  for (int i = 0; i < ran.ops_size(); ++i) {
    if (ran.ops(i).name() != planned.ops(i).name()) {
      return Cat("op ", i, " is ", planned.ops(i).name(), " where ", ran.ops(i).name(), " ran");
    }
  }
  return "";
}

}  // namespace moeplan::requests
