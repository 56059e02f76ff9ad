#include "exec_common.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/base/watchdog.h"
#include "moeplan/client/planner_client.h"
#include "moeplan/executor/mpi_job.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"

namespace moeplan::exec {

absl::StatusOr<planner::Layout> LayoutOfFlag(std::string_view flag, std::string_view spec) {
  auto named = [&](const absl::Status& st) {
    std::string_view m = View(st.message());
    if (m.substr(0, 10) == "--layout: ") m.remove_prefix(10);  // LayoutFromSpec's own prefix
    return absl::Status(st.code(), Cat(flag, ": ", m));
  };
  absl::StatusOr<v1::Layout> msg = proto::LayoutFromSpec(spec);
  if (!msg.ok()) return named(msg.status());
  absl::StatusOr<planner::Layout> layout = proto::LayoutFromProto(*msg);
  if (!layout.ok()) return named(layout.status());
  return layout;
}

int HostCores() { return executor::UsableCores(); }

absl::Status CheckRunFlags(const Args& a) {
  if (a.iters < 1) {
    return absl::InvalidArgumentError(Cat("--iters: must be >= 1 (got ", a.iters, ")"));
  }
  if (a.warmup < 0) {
    return absl::InvalidArgumentError(Cat("--warmup: must be >= 0 (got ", a.warmup, ")"));
  }
  if (a.backend != "mpi" && a.backend != "nccl") {
    return absl::InvalidArgumentError(Cat("--backend: must be mpi or nccl (got ", a.backend, ")"));
  }
  return absl::OkStatus();
}

absl::Status ResolveDType(const Args& a, int bytes_per_element, const std::string& file,
                          executor::DType* out) {
  if (a.dtype == "auto") {
    // The CPU kernels compute in fp32; on GPUs the config's element size decides.
    if (a.backend == "mpi" || bytes_per_element == 4) {
      *out = executor::DType::kF32;
    } else if (bytes_per_element == 2) {
      *out = executor::DType::kBF16;
    } else {
      return absl::InvalidArgumentError(
          Cat(file, ": bytes_per_element: the executor runs 4 (f32) or 2 (bf16) (got ",
              bytes_per_element, ")"));
    }
  } else if (!executor::ParseDType(a.dtype, out)) {
    return absl::InvalidArgumentError(
        Cat("--dtype: must be auto, f32 or bf16 (got ", a.dtype, ")"));
  }
  if (a.backend == "mpi" && *out != executor::DType::kF32) {
    return absl::InvalidArgumentError("--dtype: the mpi backend computes in f32 only");
  }
  return absl::OkStatus();
}

absl::StatusOr<PredictionModel> LoadPredictionModel(const Args& a) {
  absl::StatusOr<calibration::LoadedProfile> profile = calibration::LoadProfile(a.profile);
  absl::StatusOr<planner::CostModel> cost =
      profile.ok() ? planner::CostModel::Create(profile->profile)
                   : absl::StatusOr<planner::CostModel>(profile.status());
  if (!cost.ok()) {
    return absl::Status(cost.status().code(), Cat("--profile: ", View(cost.status().message())));
  }
  return PredictionModel{*std::move(profile), *std::move(cost)};
}

absl::Status Agree(const absl::Status& local) {
  Watchdog::Step("agreeing with the other ranks (MPI_Allreduce)");
  return executor::AgreeOnStatus(local, kProgram);
}

void Abort(const absl::Status& s) { executor::AbortJob(kProgram, s); }

void SetMemoryLimit(const Args& a, executor::Device& device, executor::RunOptions* opt) {
  if (a.max_memory_gib > 0) {
    opt->memory_limit_bytes = static_cast<size_t>(a.max_memory_gib * 1024.0 * 1024.0 * 1024.0);
    opt->memory_limit_source = Cat("--max-memory-gib ", a.max_memory_gib);
  } else if (absl::StatusOr<size_t> free = device.FreeBytes(); free.ok()) {
    if (device.is_gpu()) {
      opt->memory_limit_bytes = *free;
      opt->memory_limit_source = Cat("free memory of ", device.name());
    } else {
      const int local = executor::RanksOnThisHost();
      opt->memory_limit_bytes = *free / static_cast<size_t>(local);
      opt->memory_limit_source = Cat("this host's available memory shared by its ", local,
                                     " rank(s); --max-memory-gib sets it");
    }
  }
}

double Probe(executor::SpeedProbe& probe) {
  // Every rank probes at once, as moeplan-profile's ranks do: ranks that
  // share a core (or a GPU, a memory bus) then share it during the probe as
  // they did during the profile's, and a rank whose stage finished early does
  // not read the core alone.
  MPI_Barrier(MPI_COMM_WORLD);
  absl::StatusOr<double> g = probe.Gflops();
  if (!g.ok()) Abort(g.status());
  return *g;
}

void GatherIteration(int it, const std::vector<executor::OpTime>& ops, double forward_us,
                     double total_us, double probe_gflops, std::vector<double>* scratch,
                     std::vector<IterationTimes>* iterations) {
  const size_t n = ops.size();
  std::vector<double>& buf = *scratch;
  buf.assign(4 * n + 4, 0.0);
  double* local = buf.data();
  double* global = buf.data() + 2 * n + 2;
  for (size_t i = 0; i < n; ++i) {
    local[i] = ops[i].start_us;
    local[n + i] = ops[i].end_us;
  }
  local[2 * n] = forward_us;
  local[2 * n + 1] = total_us;
  Watchdog::Step(Cat("gathering iteration ", it, "'s op times (MPI_Reduce)"));
  MPI_Reduce(local, global, static_cast<int>(2 * n + 2), MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  double probe_sum = 0.0;
  MPI_Reduce(&probe_gflops, &probe_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  if (executor::WorldRank() != 0) return;
  IterationTimes t;
  t.start_us.assign(global, global + n);
  t.end_us.assign(global + n, global + 2 * n);
  t.forward_us = global[2 * n];
  t.total_us = global[2 * n + 1];
  t.probe_gflops = probe_sum / executor::WorldSize();
  iterations->push_back(std::move(t));
}

bool PrintReport(const google::protobuf::Message& report, bool json, const std::string& table) {
  std::string text;
  if (json) {
    absl::StatusOr<std::string> j = proto::ToJson(report);
    if (!j.ok()) {
      std::fprintf(stderr, "moeplan-exec: %s\n", std::string(View(j.status().message())).c_str());
      return false;
    }
    text = *j + "\n";
  } else {
    text = table;
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return true;
}

void SetMeasuredOps(const google::protobuf::RepeatedPtrField<v1::OpTiming>& ops,
                    v1::ReportMeasurementRequest* req) {
  for (const v1::OpTiming& op : ops) {
    v1::MeasuredOp* m = req->add_ops();
    m->set_name(op.name());
    m->set_duration_us(std::max(0.0, op.end_us() - op.start_us()));
    m->set_start_us(std::max(0.0, op.start_us()));
    m->set_has_start(true);
  }
}

absl::Status ReportTo(const Args& a, const v1::ClusterProfile& profile,
                      std::vector<v1::ReportMeasurementRequest> reports, std::string_view noun) {
  client::ClientOptions options;
  options.address = a.report_to;
  options.tls_ca_file = a.tls_ca;
  options.token_file = a.token_file;
  MOEPLAN_ASSIGN_OR_RETURN(std::unique_ptr<client::PlannerClient> c,
                           client::PlannerClient::Connect(options));
  uint64_t stored = 0;
  for (size_t i = 0; i < reports.size(); ++i) {
    v1::ReportMeasurementRequest& req = reports[i];
    req.set_profile_name(profile.name());
    req.set_profile_version(profile.version());
    absl::StatusOr<v1::ReportMeasurementResponse> r = c->ReportMeasurement(req);
    if (!r.ok()) {
      return absl::Status(r.status().code(), Cat(noun, " ", i + 1, " of ", reports.size(), ": ",
                                                 View(r.status().message())));
    }
    stored = r->stored();
    if (r->has_replay() && r->replay().replayed_us() > 0.0) {
      std::fprintf(
          stderr,
          "moeplan-exec: %s %zu: measured %.1f us; its op durations composed on the "
          "server's plan %.1f us (composition %+.1f%%), predicted %.1f us (cost %+.1f%%)\n",
          std::string(noun).c_str(), i + 1, req.total_us(), r->replay().replayed_us(),
          r->replay().composition_error_pct(), r->predicted_us(), r->cost_error_pct());
    }
  }
  std::fprintf(stderr, "moeplan-exec: reported %zu %s(s) to %s (profile %s v%u: %llu stored)\n",
               reports.size(), std::string(noun).c_str(), a.report_to.c_str(),
               profile.name().c_str(), profile.version(), static_cast<unsigned long long>(stored));
  return absl::OkStatus();
}

}  // namespace moeplan::exec
