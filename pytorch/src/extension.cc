// moeplan.torch._C: the bundled executor as a PyTorch extension (pytorch/README.md).
// A Layer is one MoE layer's plan (default, S1 or S2) on the executor's CPU
// kernels and MPI communicators; the Python side (moeplan/torch/__init__.py)
// wraps it in a torch.autograd.Function. Everything here is collective over
// MPI_COMM_WORLD where it says so, and every rank checks first that the
// others agree, so a shape that differs between ranks is an error on all of
// them rather than a hang.
#include <mpi.h>
#include <torch/extension.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/interpreter.h"
#include "moeplan/executor/mpi_job.h"
#include "moeplan/executor/runner.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/planner.h"
#include "moeplan/planner/types.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"
#include "moeplan/requests/answer.h"

namespace moeplan::torchext {
namespace {

namespace ex = moeplan::executor;
namespace py = pybind11;

// Becomes MemoryError (a translator registered in the module: raising needs
// the GIL, which a failing collective step does not hold).
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failed Status as the Python exception its code calls for (safe without
// the GIL: pybind11 converts it once the call returns).
[[noreturn]] void Raise(const absl::Status& s) {
  const std::string msg(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      throw py::value_error(msg);
    case absl::StatusCode::kNotFound:
      throw py::key_error(msg);
    case absl::StatusCode::kResourceExhausted:
      throw OutOfMemory(msg);
    default:
      throw std::runtime_error(msg);
  }
}
void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}
template <class T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *std::move(v);
}

// ---- MPI --------------------------------------------------------------------

bool MpiUp() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

// Initialises MPI (thread-multiple, so the CPU lanes are threads) once per
// process and finalises it at exit. Without mpirun, Open MPI starts a
// singleton: a world of one rank.
std::tuple<int, int> InitMpi() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) throw std::runtime_error("moeplan.torch: MPI was finalized already in this process");
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      throw std::runtime_error("moeplan.torch: MPI_Init_thread failed");
    }
    std::atexit([] {
      if (MpiUp()) MPI_Finalize();
    });
  }
  return {ex::WorldRank(), ex::WorldSize()};
}

// An MPI_MAX Allreduce of `v` over MPI_COMM_WORLD that waits at most
// `timeout_s` (0: as long as it takes) for the other ranks to join. A rank
// that never joins (it skipped a backward(), called the layers in another
// order, or stopped) would leave this one waiting forever, and a started
// collective cannot be withdrawn: past the deadline the job ends (AbortJob),
// with one line naming this rank and `what` it waited in.
void AllreduceMaxWithin(std::vector<int64_t>& v, double timeout_s, std::string_view what) {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Iallreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_INT64_T, MPI_MAX,
                 MPI_COMM_WORLD, &req);
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (timeout_s > 0 && waited.count() > timeout_s) {
      ex::AbortJob("moeplan.torch",
                   absl::DeadlineExceededError(Cat(
                       what, ": waited ", timeout_s,
                       " s for the other ranks to begin the same call; some rank is elsewhere (it "
                       "skipped a backward(), called the layers in another order, or stopped): "
                       "ending the job (MOEPLAN_TORCH_TIMEOUT_S sets the wait, 0 waits forever)")),
                   3);
    }
    // Spin briefly (the usual case: the peers are a moment behind), then poll.
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

// Every rank holds the same `values` (named by `names`); an error naming the
// first that differs, its range over the ranks and its rule (`rules[i]`; by
// default that every rank calls with the same shape) otherwise, on every rank.
// `timeout_s`: AllreduceMaxWithin's.
absl::Status AgreeOnValues(const std::vector<int64_t>& values,
                           const std::vector<std::string>& names, std::string_view what,
                           const std::vector<std::string>& rules = {}, double timeout_s = 0) {
  // One MPI_MAX over (v, -v): the largest and the smallest value of each.
  const size_t n = values.size();
  std::vector<int64_t> both(2 * n);
  for (size_t i = 0; i < n; ++i) {
    both[i] = values[i];
    both[n + i] = -values[i];
  }
  AllreduceMaxWithin(both, timeout_s, what);
  for (size_t i = 0; i < n; ++i) {
    if (both[i] != -both[n + i]) {
      return absl::InvalidArgumentError(
          Cat(what, ": ", names[i], " differs between ranks (from ", -both[n + i], " to ",
              both[i], "); ",
              i < rules.size() ? rules[i] : "every rank must call it with the same shape"));
    }
  }
  return absl::OkStatus();
}

// The same for Python callers: ValueError on every rank when they differ.
void Agree(const std::vector<int64_t>& values, const std::vector<std::string>& names,
           const std::string& what, const std::vector<std::string>& rules, double timeout_s) {
  if (values.size() != names.size()) throw py::value_error("agree: one name per value");
  if (!rules.empty() && rules.size() != names.size()) {
    throw py::value_error("agree: one rule per value, or none");
  }
  if (!MpiUp()) InitMpi();
  absl::Status s;
  {
    py::gil_scoped_release nogil;
    s = AgreeOnValues(values, names, what, rules, timeout_s);
  }
  Check(s);
}

// Ends the whole MPI job (an uncaught Python exception on one rank would
// otherwise leave the others waiting in a collective).
void Abort(int code) { ex::AbortJob(code); }

// Rank `root`'s bytes on every rank (collective).
py::bytes Broadcast(const std::string& data, int root) {
  if (!MpiUp()) InitMpi();
  std::string buf = data;
  {
    py::gil_scoped_release nogil;
    int64_t n = static_cast<int64_t>(buf.size());
    MPI_Bcast(&n, 1, MPI_INT64_T, root, MPI_COMM_WORLD);
    buf.resize(static_cast<size_t>(n));
    MPI_Bcast(buf.data(), static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD);
  }
  return py::bytes(buf);
}

// Whether `v` holds on every rank (collective).
bool AllTrue(bool v) {
  if (!MpiUp()) InitMpi();
  py::gil_scoped_release nogil;
  return ex::TrueOnAllRanks(v);
}

// ---- planning ----------------------------------------------------------------

absl::StatusOr<planner::LayerConfig> ParseLayer(const std::string& json) {
  v1::LayerConfig msg;
  MOEPLAN_RETURN_IF_ERROR(proto::ParseJson(json, &msg));
  return proto::LayerFromProto(msg);
}

// PlanLayerRequest answered on this process with a profile's name or file:
// the PlanLayerResponse as JSON (the server's answer, field for field).
std::string PlanLocally(const std::string& layer_json, const std::string& profile,
                        const std::vector<std::string>& schedules) {
  py::gil_scoped_release nogil;
  v1::PlanLayerRequest request;
  for (const std::string& name : schedules) {
    planner::Schedule s;
    if (!planner::ParseSchedule(name, &s)) {
      throw py::value_error(Cat("schedules: each must be default, s1 or s2 (got '", name, "')"));
    }
    request.add_schedules(proto::ScheduleToProto(s));
  }
  calibration::LoadedProfile loaded = Value(calibration::LoadProfile(profile));
  planner::CostModel cost = Value(planner::CostModel::Create(loaded.profile));
  planner::LayerPlanner planner(cost);
  Check(proto::ParseJson(layer_json, request.mutable_layer()));
  request.set_profile_name(loaded.message.name());
  v1::PlanLayerResponse response;
  Check(requests::AnswerPlanLayer(request, planner, loaded.profile, &response));
  return Value(proto::ToJson(response, proto::JsonStyle{.pretty = false}));
}

// ---- the layer -----------------------------------------------------------------

void CheckTensor(const torch::Tensor& t, std::string_view name, std::vector<int64_t> shape) {
  TORCH_CHECK(t.device().is_cpu(), "moeplan.torch: ", std::string(name),
              " must be a CPU tensor (this build runs the CPU kernels over MPI), got ",
              t.device().str());
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, "moeplan.torch: ", std::string(name),
              " must be float32, got ", c10::toString(t.scalar_type()));
  TORCH_CHECK(t.sizes() == c10::IntArrayRef(shape), "moeplan.torch: ", std::string(name),
              " must have shape ", c10::IntArrayRef(shape), ", got ", t.sizes());
}

py::dict PlaceDict(const ex::RankPlace& r) {
  return py::dict(py::arg("rank") = r.rank, py::arg("mp_group") = r.mp_group,
                  py::arg("mp_rank") = r.mp_rank, py::arg("ep_group") = r.ep_group,
                  py::arg("ep_rank") = r.ep_rank, py::arg("esp_group") = r.esp_group,
                  py::arg("esp_rank") = r.esp_rank);
}

void CopyIn(void* dst, const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  std::memcpy(dst, c.data_ptr<float>(), static_cast<size_t>(c.numel()) * sizeof(float));
}
torch::Tensor CopyOut(const void* src, std::vector<int64_t> shape) {
  torch::Tensor t = torch::empty(shape, torch::kFloat32);
  std::memcpy(t.data_ptr<float>(), src, static_cast<size_t>(t.numel()) * sizeof(float));
  return t;
}

class Layer {
 public:
  // Collective: every rank of MPI_COMM_WORLD builds the same layer.
  Layer(const std::string& layer_json, const std::string& schedule) {
    if (!MpiUp()) InitMpi();
    py::gil_scoped_release nogil;
    Check(ex::AgreeOnStatus(Parse(layer_json, schedule)));
    Build();
  }

  torch::Tensor Forward(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& w1,
                        const torch::Tensor& w2) {
    CheckTensor(x, "x", {t_.tokens, t_.model_dim});
    CheckTensor(gate, "gate_weight", {t_.model_dim, t_.experts});
    CheckTensor(w1, "w1", {t_.local_experts, t_.model_dim, t_.W1Columns()});
    CheckTensor(w2, "w2", {t_.local_experts, t_.hidden_shard, t_.model_dim});
    CopyIn(t_.x, x);
    CopyIn(t_.gate, gate);
    CopyIn(t_.w1, w1);
    CopyIn(t_.w2, w2);
    Run(planner::Phase::kForward);
    ++forwards_;
    return CopyOut(t_.y, {t_.tokens, t_.model_dim});
  }

  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> Backward(
      const torch::Tensor& dy) {
    CheckTensor(dy, "grad_output", {t_.tokens, t_.model_dim});
    TORCH_CHECK(forwards_ > 0, "moeplan.torch: backward before any forward");
    CopyIn(t_.dy, dy);
    Run(planner::Phase::kBackward);
    return {CopyOut(t_.dx, {t_.tokens, t_.model_dim}),
            CopyOut(t_.dgate, {t_.model_dim, t_.experts}),
            CopyOut(t_.dw1, {t_.local_experts, t_.model_dim, t_.W1Columns()}),
            CopyOut(t_.dw2, {t_.local_experts, t_.hidden_shard, t_.model_dim})};
  }

  // How many forwards ran: the autograd function's backward checks that the
  // buffers still hold its forward (and recomputes it otherwise).
  int64_t forwards() const { return forwards_; }

  // The last forward + backward's ops: (name, phase, start_us, end_us), the
  // backward's timed from the forward's end. over_ranks (collective): each
  // op's latest start and latest end over the ranks, as moeplan-exec reports.
  std::vector<std::tuple<std::string, std::string, double, double>> Timings(bool over_ranks) const {
    const std::vector<ex::OpTime>& times = runner_->timings();
    std::vector<double> v(2 * times.size());
    for (size_t i = 0; i < times.size(); ++i) {
      v[2 * i] = times[i].start_us;
      v[2 * i + 1] = times[i].end_us;
    }
    if (over_ranks) {
      py::gil_scoped_release nogil;
      MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX,
                    MPI_COMM_WORLD);
    }
    std::vector<std::tuple<std::string, std::string, double, double>> out;
    for (size_t i = 0; i < times.size(); ++i) {
      out.emplace_back(times[i].name,
                       times[i].phase == planner::Phase::kForward ? "forward" : "backward",
                       v[2 * i], v[2 * i + 1]);
    }
    return out;
  }

  // Where this rank sits in the layout, and whether its lanes are threads.
  py::dict Place() const {
    py::dict d = PlaceDict(runner_->place());
    d["threaded"] = runner_->threaded();
    return d;
  }

 private:
  // This rank's half: the layer and schedule parsed and checked (no MPI).
  absl::Status Parse(const std::string& layer_json, const std::string& schedule) {
    MOEPLAN_ASSIGN_OR_RETURN(layer_, ParseLayer(layer_json));
    if (!planner::ParseSchedule(schedule, &options_.schedule)) {
      return absl::InvalidArgumentError(
          Cat("schedule: must be default, s1 or s2 (got '", schedule, "')"));
    }
    if (layer_.dropless) {
      return absl::InvalidArgumentError(
          "dropless: moeplan.torch runs padded layers (capacity_factor); the executor sizes a "
          "dropless layer's expert side once from its first routing, which training changes");
    }
    options_.plan_name = Cat("the ", schedule, " schedule");
    return absl::OkStatus();
  }

  // The collective half; every rank takes every step, so an error on one is
  // an error on all, and none is left in a collective the others skipped.
  void Build() {
    const planner::LayerConfig& l = layer_;
    Check(AgreeOnValues(
        {l.batch_size * l.seq_len, l.model_dim, l.hidden_dim, l.num_experts, l.top_k,
         static_cast<int64_t>(options_.schedule), l.parallel.mp, l.parallel.ep, l.parallel.esp,
         static_cast<int64_t>(l.capacity_factor * 1e6), int64_t{l.gated_linear_unit}},
        {"tokens", "model_dim", "hidden_dim", "num_experts", "top_k", "schedule", "parallel.mp",
         "parallel.ep", "parallel.esp", "capacity_factor", "gated_linear_unit"},
        "moeplan.torch.MoE"));
    Check(ex::AgreeOnStatus(
        ex::PlanLayerRun(layer_, options_.schedule, ex::WorldSize(), 1, nullptr).status()));
    absl::StatusOr<ex::Backend> backend = ex::MakeBackend("mpi");  // duplicates the world
    Check(ex::AgreeOnStatus(backend.status()));
    backend_ = *std::move(backend);
    // The runner's groups are split collectively; ranks agree on it too.
    absl::StatusOr<std::unique_ptr<ex::MoeLayerRunner>> r = ex::MoeLayerRunner::Create(
        layer_, options_, backend_.device.get(), backend_.kernels.get(), backend_.world.get());
    Check(ex::AgreeOnStatus(r.status()));
    runner_ = *std::move(r);
    t_ = runner_->Tensors();
  }

  void Run(planner::Phase phase) {
    py::gil_scoped_release nogil;
    const absl::Status s = runner_->RunPhase(phase);
    if (!s.ok()) {
      // A rank failing inside a collective leaves its peers waiting in it:
      // nothing in this process can recover, so the job ends here, named.
      ex::AbortJob("moeplan.torch", s, 3);
    }
  }

  planner::LayerConfig layer_;
  ex::RunOptions options_;
  ex::Backend backend_;
  std::unique_ptr<ex::MoeLayerRunner> runner_;
  ex::LayerTensors t_;
  int64_t forwards_ = 0;
};

}  // namespace
}  // namespace moeplan::torchext

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using moeplan::torchext::Layer;
  namespace ext = moeplan::torchext;
  m.doc() = "moeplan's executor for PyTorch (use moeplan.torch.MoE)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ext::OutOfMemory& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    }
  });
  m.def("init_mpi", &ext::InitMpi,
        "Initialises MPI (once; finalised at exit) and returns (rank, size) of MPI_COMM_WORLD.");
  m.def("plan_layer", &ext::PlanLocally, py::arg("layer_json"), py::arg("profile"),
        py::arg("schedules") = std::vector<std::string>{},
        "Plans a layer (LayerConfig JSON) on a built-in profile or a profile file, under the "
        "given schedules (empty: the planner's own set); returns the PlanLayerResponse as JSON.");
  m.def("broadcast", &ext::Broadcast, py::arg("data"), py::arg("root") = 0,
        "Rank root's bytes on every rank of MPI_COMM_WORLD (collective).");
  m.def("agree", &ext::Agree, py::arg("values"), py::arg("names"), py::arg("what"),
        py::arg("rules") = std::vector<std::string>{}, py::arg("timeout_s") = 0.0,
        "Collective: ValueError on every rank unless every rank passed the same values (naming "
        "the first that differs and its rule); a rank that waits more than timeout_s (> 0) for "
        "the others to join ends the job.");
  m.def("abort", &ext::Abort, py::arg("code"), "MPI_Abort: ends every rank of the job.");
  m.def("all_true", &ext::AllTrue, py::arg("value"),
        "Whether value is true on every rank of MPI_COMM_WORLD (collective).");
  m.def(
      "place_of",
      [](int mp, int ep, int esp, int rank) {
        moeplan::planner::ParallelLayout p;
        p.mp = mp;
        p.ep = ep;
        p.esp = esp;
        return ext::PlaceDict(moeplan::executor::PlaceOf(p, rank));
      },
      py::arg("mp"), py::arg("ep"), py::arg("esp"), py::arg("rank"),
      "Where a rank sits in an mp/ep/esp layout (the executor's groups).");
  m.def("cuda_built", &moeplan::executor::CudaBuilt,
        "Whether the executor was built with its CUDA + NCCL backend.");
  py::class_<Layer>(m, "Layer")
      .def(py::init<const std::string&, const std::string&>(), py::arg("layer_json"),
           py::arg("schedule"))
      .def("forward", &Layer::Forward)
      .def("backward", &Layer::Backward)
      .def_property_readonly("forwards", &Layer::forwards)
      .def("timings", &Layer::Timings, py::arg("over_ranks") = false)
      .def("place", &Layer::Place);
}
