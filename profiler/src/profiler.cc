#include "moeplan/profiler/profiler.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "moeplan/base/stats.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/base/watchdog.h"
#include "moeplan/executor/kernels.h"
#include "moeplan/executor/saa.h"
#include "moeplan/proto/convert.h"

namespace moeplan::profiler {

namespace ex = executor;
using ex::DType;

namespace {

// Known inputs, as nccl-tests uses: small integers, so every sum of a few
// hundred of them is exact in fp32 and a wrong element is a real error.
float Value(int world_rank, int64_t i) {
  return static_cast<float>((int64_t{world_rank} * 131 + i * 7) % 61 + 1);
}

std::vector<float> Values(int world_rank, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[static_cast<size_t>(i)] = Value(world_rank, i);
  return v;
}

void SetShape(GroupShape s, v1::GroupShape* out) {
  out->set_ranks(s.ranks);
  out->set_nodes(s.nodes);
}

// Counts elements of `got` that differ from `want(i)`.
int64_t Mismatches(const std::vector<float>& got, const std::function<float(int64_t)>& want) {
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want(static_cast<int64_t>(i))) ++wrong;
  }
  return wrong;
}

}  // namespace

// A communicator over one sibling group of a shape, and the world ranks of
// its members by group rank.
struct Profiler::Group {
  GroupShape shape;
  int gather_ranks = 0;  // SAA groups: N; 0 for shape groups
  bool gather = false;   // SAA: the gather group (else the AlltoAll group)
  std::unique_ptr<ex::Communicator> comm;
  std::vector<int> members;
};

Profiler::~Profiler() = default;

Profiler::Profiler(ex::Backend* backend, ex::Communicator* world, NodeLayout layout,
                   MeasureOptions options)
    : backend_(backend), world_(world), layout_(layout), options_(options) {}

absl::StatusOr<std::unique_ptr<Profiler>> Profiler::Create(ex::Backend* backend,
                                                           ex::Communicator* world,
                                                           NodeLayout layout,
                                                           MeasureOptions options) {
  if (world->size() != layout.ranks()) {
    return absl::InvalidArgumentError(Cat("world has ", world->size(), " ranks, the layout ",
                                          layout.nodes, " x ", layout.ranks_per_node));
  }
  if (options.iters < 1) return absl::InvalidArgumentError("--iters: must be >= 1");
  if (options.warmup < 1) {
    return absl::InvalidArgumentError("--warmup: must be >= 1 (the first one is checked)");
  }
  if (options.min_iters < 1 || options.min_iters > options.iters) options.min_iters = options.iters;
  if (!backend->kernels->Supports(options.kernel_dtype)) {
    return absl::InvalidArgumentError(
        Cat("--dtype: the ", View(std::string(backend->kernels->name())),
            " kernels do not compute in ", View(std::string(ex::DTypeName(options.kernel_dtype)))));
  }
  return std::unique_ptr<Profiler>(new Profiler(backend, world, layout, options));
}

absl::StatusOr<Profiler::Group*> Profiler::GroupFor(GroupShape shape) {
  for (auto& g : groups_) {
    if (g->gather_ranks == 0 && g->shape == shape) return g.get();
  }
  auto g = std::make_unique<Group>();
  g->shape = shape;
  const GroupSlot mine = SlotOf(layout_, shape, world_->rank());
  g->members.assign(static_cast<size_t>(shape.ranks), -1);
  for (int r = 0; r < layout_.ranks(); ++r) {
    const GroupSlot s = SlotOf(layout_, shape, r);
    if (s.color == mine.color) g->members[static_cast<size_t>(s.key)] = r;
  }
  MOEPLAN_ASSIGN_OR_RETURN(g->comm, world_->Split(mine.color, mine.key));
  groups_.push_back(std::move(g));
  return groups_.back().get();
}

// S2's groups: gather groups of N consecutive ranks, AlltoAll groups strided by N.
absl::StatusOr<Profiler::Group*> Profiler::SaaGroup(int n, bool gather) {
  for (auto& g : groups_) {
    if (g->gather_ranks == n && g->gather == gather) return g.get();
  }
  auto g = std::make_unique<Group>();
  g->gather_ranks = n;
  g->gather = gather;
  const int rank = world_->rank(), p = layout_.ranks();
  const int color = gather ? rank / n : rank % n;
  const int key = gather ? rank % n : rank / n;
  for (int i = 0; i < (gather ? n : p / n); ++i) {
    g->members.push_back(gather ? color * n + i : i * n + color);
  }
  MOEPLAN_ASSIGN_OR_RETURN(g->comm, world_->Split(color, key));
  groups_.push_back(std::move(g));
  return groups_.back().get();
}

namespace {

// Runs `op` on every rank in step: `warmup` untimed repetitions (the first is
// checked by `check`, which returns this rank's count of wrong elements), then
// timed ones, each the max over ranks after a barrier. Fills the sample's
// timing and correctness fields.
struct Repeater {
  ex::Device* device;
  const MeasureOptions& options;

  // Kernels (not collectives) repeat back to back until a repetition lasts
  // options.kernel_min_rep_us, so ranks sharing cores are measured sharing
  // them (a short kernel after a barrier would get a core to itself).
  bool kernel = false;

  // In context (docs/cost-model.md "In context"): a compute phase runs on every
  // rank between the barrier and the op, as the layer's compute runs before
  // its collectives, and a repetition is timed as moeplan-exec times an op:
  // the latest end minus the latest start over ranks, each stamped from the
  // barrier's exit.
  const std::function<absl::Status()>* context = nullptr;

  struct Stamps {
    double start_us = 0.0, end_us = 0.0;
  };

  absl::StatusOr<Stamps> Once(const std::function<absl::Status()>& op, int inner) const {
    MOEPLAN_RETURN_IF_ERROR(device->Synchronize());
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    if (context != nullptr) {
      MOEPLAN_RETURN_IF_ERROR((*context)());
      MOEPLAN_RETURN_IF_ERROR(device->Synchronize());
    }
    const double t1 = MPI_Wtime();
    for (int i = 0; i < inner; ++i) MOEPLAN_RETURN_IF_ERROR(op());
    MOEPLAN_RETURN_IF_ERROR(device->Synchronize());
    const double t2 = MPI_Wtime();
    return Stamps{(t1 - t0) * 1e6, (t1 - t0) * 1e6 + (t2 - t1) * 1e6 / inner};
  }

  absl::Status Run(const std::function<absl::Status()>& op,
                   const std::function<absl::StatusOr<int64_t>()>& check,
                   v1::ProfileSample* s) const {
    // What a stalled peer leaves this rank waiting in (docs: --watchdog-s).
    Watchdog::Step(Cat("timing ", s->ShortDebugString()));
    double warm = 0.0;
    int64_t wrong = 0;
    for (int i = 0; i < options.warmup; ++i) {
      MOEPLAN_ASSIGN_OR_RETURN(const Stamps st, Once(op, 1));
      warm = st.end_us - st.start_us;
      if (i == 0 && check) {
        MOEPLAN_ASSIGN_OR_RETURN(wrong, check());
      }
    }
    double warm_max = 0.0;
    MPI_Allreduce(&warm, &warm_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int64_t wrong_total = 0;
    MPI_Allreduce(&wrong, &wrong_total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    // Same on every rank (warm_max is global), so the ranks stay in step.
    const double one = std::max(warm_max, 1e-3);
    const int inner =
        kernel ? static_cast<int>(std::clamp(std::ceil(options.kernel_min_rep_us / one), 1.0, 1e6))
               : 1;
    const double fit = options.point_budget_s * 1e6 / (one * inner);
    const int iters =
        std::clamp(static_cast<int>(std::min(fit, 1e9)), options.min_iters, options.iters);
    // Per repetition: [start, end] of this rank, reduced to the latest of each.
    const size_t n = static_cast<size_t>(iters);
    std::vector<double> local(2 * n), latest(2 * n), global(n);
    for (size_t i = 0; i < n; ++i) {
      MOEPLAN_ASSIGN_OR_RETURN(const Stamps st, Once(op, inner));
      local[i] = st.start_us;
      local[n + i] = context != nullptr ? st.end_us : st.end_us - st.start_us;
    }
    MPI_Allreduce(local.data(), latest.data(), 2 * iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    // Isolated: the max over ranks of each rank's time; in context: latest
    // end minus latest start.
    for (size_t i = 0; i < n; ++i) {
      global[i] = context != nullptr ? latest[n + i] - latest[i] : latest[n + i];
    }
    s->set_iters(iters);
    s->set_warmup(options.warmup);
    s->set_median_us(Median(global));
    s->set_min_us(*std::min_element(global.begin(), global.end()));
    s->set_max_us(*std::max_element(global.begin(), global.end()));
    s->set_checked(static_cast<bool>(check));
    s->set_wrong_elements(wrong_total);
    return absl::OkStatus();
  }
};

// Device buffers of a point, filled from / read into host vectors.
struct Buffers {
  ex::Device* dev;
  std::vector<ex::DeviceBuffer> owned;

  absl::StatusOr<void*> Make(size_t bytes) {
    MOEPLAN_ASSIGN_OR_RETURN(ex::DeviceBuffer b,
                             ex::DeviceBuffer::Make(dev, std::max<size_t>(bytes, 4)));
    owned.push_back(std::move(b));
    return owned.back().data();
  }
  absl::StatusOr<void*> From(const std::vector<float>& host) {
    MOEPLAN_ASSIGN_OR_RETURN(void* p, Make(host.size() * 4));
    MOEPLAN_RETURN_IF_ERROR(dev->Upload(p, host.data(), host.size() * 4));
    return p;
  }
  // `host` stored as type t (bf16: rounded to nearest even; the values here
  // are exact).
  absl::StatusOr<void*> FromAs(const std::vector<float>& host, DType t) {
    MOEPLAN_ASSIGN_OR_RETURN(void* p, Make(host.size() * ex::SizeOf(t)));
    MOEPLAN_RETURN_IF_ERROR(ex::UploadAs(*dev, p, host, t));
    return p;
  }
  absl::StatusOr<std::vector<float>> Read(const void* p, int64_t count) {
    std::vector<float> host(static_cast<size_t>(count));
    MOEPLAN_RETURN_IF_ERROR(dev->Download(host.data(), p, host.size() * 4));
    return host;
  }
};

}  // namespace

// The compute phase of in-context points: GEMMs of kContextGemm^3 (f32 on
// CPUs, the kernel dtype elsewhere), as many as take `us` on the slowest rank
// while every rank runs them (counted once per length, the same on every rank,
// so the ranks do equal work and finish as unevenly as a layer's do).
absl::StatusOr<const std::function<absl::Status()>*> Profiler::ContextPhase(double us) {
  if (us <= 0.0) return nullptr;
  const int64_t d = kContextGemm;
  const DType t = options_.kernel_dtype;
  ex::Device* dev = backend_->device.get();
  if (context_.a.data() == nullptr) {
    const size_t bytes = static_cast<size_t>(d * d) * ex::SizeOf(t);
    for (ex::DeviceBuffer* b : {&context_.a, &context_.b, &context_.c}) {
      MOEPLAN_ASSIGN_OR_RETURN(*b, ex::DeviceBuffer::Make(dev, bytes));
    }
    MOEPLAN_RETURN_IF_ERROR(ex::UploadAs(*dev, context_.a.data(),
                                         std::vector<float>(static_cast<size_t>(d * d), 0.5f), t));
    MOEPLAN_RETURN_IF_ERROR(ex::UploadAs(*dev, context_.b.data(),
                                         std::vector<float>(static_cast<size_t>(d * d), 0.25f), t));
  }
  ex::Kernels* k = backend_->kernels.get();
  auto gemm = [this, k, d, t] {
    return k->Gemm(false, false, d, d, d, 1.0f, context_.a.data(), d, context_.b.data(), d, 0.0f,
                   context_.c.data(), d, t);
  };
  if (context_.gemm_us <= 0.0) {
    // Every rank at once, as in the phase itself; the slowest rank's time.
    constexpr int kProbe = 8;
    MOEPLAN_RETURN_IF_ERROR(gemm());
    MOEPLAN_RETURN_IF_ERROR(dev->Synchronize());
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < kProbe; ++i) MOEPLAN_RETURN_IF_ERROR(gemm());
    MOEPLAN_RETURN_IF_ERROR(dev->Synchronize());
    double one = (MPI_Wtime() - t0) * 1e6 / kProbe;
    MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    context_.gemm_us = std::max(one, 1e-3);
  }
  const int reps = static_cast<int>(std::clamp(std::ceil(us / context_.gemm_us), 1.0, 1e7));
  context_.phase = [gemm, reps] {
    for (int i = 0; i < reps; ++i) MOEPLAN_RETURN_IF_ERROR(gemm());
    return absl::OkStatus();
  };
  return &context_.phase;
}

absl::StatusOr<v1::ProfileSample> Profiler::Measure(const Point& p) {
  switch (p.kind) {
    case Point::Kind::kCollective:
      return Collective(p);
    case Point::Kind::kSaa:
      return Saa(p);
    case Point::Kind::kGemm:
      return Gemm(p);
    case Point::Kind::kMemory:
      return Memory(p);
  }
  return absl::InternalError("unknown point kind");
}

// Collectives run in fp32 on every backend: their cost is in bytes, and fp32
// keeps the correctness check exact.
absl::StatusOr<v1::ProfileSample> Profiler::Collective(const Point& p) {
  MOEPLAN_ASSIGN_OR_RETURN(Group * g, GroupFor(p.shape));
  ex::Communicator& c = *g->comm;
  const int s = c.size(), q = c.rank(), me = world_->rank();
  const int64_t count = p.bytes / 4;  // elements of n
  Buffers buf{backend_->device.get(), {}};
  std::function<absl::Status()> op;
  std::function<float(int64_t)> want;
  int64_t out_count = 0;
  std::vector<size_t> uneven;  // an uneven AlltoAll's counts and offsets, read by `op`
  void *send = nullptr, *recv = nullptr;
  const auto& m = g->members;
  switch (p.collective) {
    case Collective::kAllReduce: {
      // In place, as the executor reduces its activations and gradients (the
      // values keep growing over repetitions; only the first is checked).
      MOEPLAN_ASSIGN_OR_RETURN(recv, buf.From(Values(me, count)));
      send = recv;
      op = [&] { return c.AllReduce(recv, recv, static_cast<size_t>(count), DType::kF32); };
      out_count = count;
      want = [&](int64_t i) {
        float sum = 0.0f;
        for (int r : m) sum += Value(r, i);
        return sum;
      };
      break;
    }
    case Collective::kAllGather: {
      MOEPLAN_ASSIGN_OR_RETURN(send, buf.From(Values(me, count)));
      MOEPLAN_ASSIGN_OR_RETURN(recv, buf.Make(static_cast<size_t>(count * s) * 4));
      op = [&] { return c.AllGather(send, recv, static_cast<size_t>(count), DType::kF32); };
      out_count = count * s;
      want = [&](int64_t i) { return Value(m[static_cast<size_t>(i / count)], i % count); };
      break;
    }
    case Collective::kReduceScatter: {
      MOEPLAN_ASSIGN_OR_RETURN(send, buf.From(Values(me, count * s)));
      MOEPLAN_ASSIGN_OR_RETURN(recv, buf.Make(static_cast<size_t>(count) * 4));
      op = [&] { return c.ReduceScatter(send, recv, static_cast<size_t>(count), DType::kF32); };
      out_count = count;
      want = [&](int64_t i) {
        float sum = 0.0f;
        for (int r : m) sum += Value(r, q * count + i);
        return sum;
      };
      break;
    }
    case Collective::kAllToAll: {
      const int64_t per_peer = count / s;
      if (p.irregular) {
        // Uneven (AlltoAllv): every rank sends its per_peer * s elements, to
        // group rank 0 load * per_peer of them, the rest evenly to the others;
        // rank 0 then receives load times the mean.
        const int64_t total = per_peer * s;
        const int64_t hot =
            std::min<int64_t>(total, std::llround(p.load * static_cast<double>(per_peer)));
        const int64_t other = s > 1 ? (total - hot) / (s - 1) : 0;
        const size_t n = static_cast<size_t>(s);
        uneven.assign(4 * n, 0);
        size_t* sn = uneven.data();
        size_t* so = sn + n;
        size_t* rn = so + n;
        size_t* ro = rn + n;
        const int64_t mine = q == 0 ? hot : other;  // what each peer sends this rank
        for (size_t t = 0; t < n; ++t) {
          sn[t] = static_cast<size_t>(t == 0 ? hot : other);
          so[t] = t == 0 ? 0 : static_cast<size_t>(hot + static_cast<int64_t>(t - 1) * other);
          rn[t] = static_cast<size_t>(mine);
          ro[t] = t * static_cast<size_t>(mine);
        }
        MOEPLAN_ASSIGN_OR_RETURN(send, buf.From(Values(me, total)));
        MOEPLAN_ASSIGN_OR_RETURN(recv, buf.Make(static_cast<size_t>(mine * s) * 4));
        op = [&, sn, so, rn, ro]() -> absl::Status {
          MOEPLAN_ASSIGN_OR_RETURN(ex::Request r,
                                   c.StartAlltoAllv(send, sn, so, recv, rn, ro, DType::kF32));
          return c.Wait(&r);
        };
        out_count = mine * s;
        const int64_t from = q == 0 ? 0 : hot + (q - 1) * other;  // my block in a sender's buffer
        want = [&, mine, from](int64_t i) {
          return Value(m[static_cast<size_t>(i / mine)], from + i % mine);
        };
        break;
      }
      MOEPLAN_ASSIGN_OR_RETURN(send, buf.From(Values(me, per_peer * s)));
      MOEPLAN_ASSIGN_OR_RETURN(recv, buf.Make(static_cast<size_t>(per_peer * s) * 4));
      op = [&, per_peer] {
        return c.AlltoAll(send, recv, static_cast<size_t>(per_peer), DType::kF32);
      };
      out_count = per_peer * s;
      want = [&, per_peer](int64_t i) {
        return Value(m[static_cast<size_t>(i / per_peer)], q * per_peer + i % per_peer);
      };
      break;
    }
    case Collective::kSendRecv: {
      // Both members of the pair send and receive at once, as an SAA step does.
      const int peer = 1 - q;
      MOEPLAN_ASSIGN_OR_RETURN(send, buf.From(Values(me, count)));
      MOEPLAN_ASSIGN_OR_RETURN(recv, buf.Make(static_cast<size_t>(count) * 4));
      op = [&, peer] {
        return c.SendRecv(send, static_cast<size_t>(count), peer, recv, static_cast<size_t>(count),
                          peer, DType::kF32);
      };
      out_count = count;
      want = [&, peer](int64_t i) { return Value(m[static_cast<size_t>(peer)], i); };
      break;
    }
  }
  auto check = [&]() -> absl::StatusOr<int64_t> {
    MOEPLAN_ASSIGN_OR_RETURN(std::vector<float> got, buf.Read(recv, out_count));
    return Mismatches(got, want);
  };
  v1::ProfileSample sample;
  Repeater rep{backend_->device.get(), options_};
  MOEPLAN_ASSIGN_OR_RETURN(rep.context, ContextPhase(p.context_us));
  MOEPLAN_RETURN_IF_ERROR(rep.Run(op, check, &sample));
  v1::CollectiveSample* cs = sample.mutable_collective();
  cs->set_context_us(p.context_us);
  cs->set_collective(proto::CollectiveToProto(p.collective));
  SetShape(p.shape, cs->mutable_shape());
  cs->set_groups(GroupsOf(layout_, p.shape));
  cs->set_bytes(p.bytes);
  if (p.irregular) cs->set_load_ratio(p.load);
  const Bandwidth bw = BandwidthOf(p.collective, s, p.bytes, sample.median_us());
  cs->set_algbw_gbytes_per_s(bw.algbw);
  cs->set_busbw_gbytes_per_s(bw.busbw);
  return sample;
}

// SAA as S2 runs it; the reference is the two collectives one after the other
// on the same buffers (timed too, as sequential_median_us).
absl::StatusOr<v1::ProfileSample> Profiler::Saa(const Point& p) {
  const int n = p.saa.gather_ranks;
  MOEPLAN_ASSIGN_OR_RETURN(Group * gg, SaaGroup(n, /*gather=*/true));
  MOEPLAN_ASSIGN_OR_RETURN(Group * ag, SaaGroup(n, /*gather=*/false));
  ex::Communicator& group = *gg->comm;
  ex::Communicator& a2a = *ag->comm;
  const int w = a2a.size(), q = a2a.rank(), me = world_->rank(), mine = group.rank();
  const int64_t chunk = p.bytes / 4 / w;
  const int64_t stride = chunk * w;
  Buffers buf{backend_->device.get(), {}};
  ex::SaaArgs args;
  args.device = backend_->device.get();
  args.a2a = &a2a;
  args.group = &group;
  args.chunk = chunk;
  args.stride = stride;
  args.a2a_name = "saa.alltoall";
  args.group_name = p.dual ? "saa.reducescatter" : "saa.allgather";
  std::function<absl::Status()> fused, sequential;
  std::function<absl::StatusOr<int64_t>()> check;
  if (!p.dual) {
    MOEPLAN_ASSIGN_OR_RETURN(void* send, buf.From(Values(me, stride)));
    MOEPLAN_ASSIGN_OR_RETURN(void* mid, buf.Make(static_cast<size_t>(stride) * 4));
    MOEPLAN_ASSIGN_OR_RETURN(void* out, buf.Make(static_cast<size_t>(stride * n) * 4));
    fused = [=] { return ex::SaaGather(args, send, mid, out); };
    sequential = [&, send, mid, out] {
      MOEPLAN_RETURN_IF_ERROR(a2a.AlltoAll(send, mid, static_cast<size_t>(chunk), DType::kF32));
      return group.AllGather(mid, out, static_cast<size_t>(stride), DType::kF32);
    };
    // Member j's copy of chunk c came from world rank c*n + j, its elements
    // q*chunk.. (S2's layout: gather groups consecutive, AlltoAll strided).
    check = [&, out]() -> absl::StatusOr<int64_t> {
      MOEPLAN_ASSIGN_OR_RETURN(std::vector<float> got, buf.Read(out, stride * n));
      return Mismatches(got, [&](int64_t i) {
        const int64_t j = i / stride, c = (i % stride) / chunk, e = i % chunk;
        return Value(static_cast<int>(c * n + j), q * chunk + e);
      });
    };
  } else {
    MOEPLAN_ASSIGN_OR_RETURN(void* in, buf.From(Values(me, stride * n)));
    MOEPLAN_ASSIGN_OR_RETURN(void* staging, buf.Make(static_cast<size_t>(stride) * 4));
    MOEPLAN_ASSIGN_OR_RETURN(void* out, buf.Make(static_cast<size_t>(stride) * 4));
    fused = [=] { return ex::SaaScatter(args, in, staging, out); };
    sequential = [&, in, staging, out] {
      MOEPLAN_RETURN_IF_ERROR(
          group.ReduceScatter(in, staging, static_cast<size_t>(stride), DType::kF32));
      return a2a.AlltoAll(staging, out, static_cast<size_t>(chunk), DType::kF32);
    };
    // Chunk c came from a2a peer c (world c*n + mine): the sum over its gather
    // group (world c*n + j) of their inputs' chunk q of block `mine`.
    check = [&, out]() -> absl::StatusOr<int64_t> {
      MOEPLAN_ASSIGN_OR_RETURN(std::vector<float> got, buf.Read(out, stride));
      return Mismatches(got, [&](int64_t i) {
        const int64_t c = i / chunk, e = i % chunk;
        float sum = 0.0f;
        for (int j = 0; j < n; ++j) {
          sum += Value(static_cast<int>(c * n + j), mine * stride + q * chunk + e);
        }
        return sum;
      });
    };
  }
  Repeater rep{backend_->device.get(), options_};
  MOEPLAN_ASSIGN_OR_RETURN(rep.context, ContextPhase(p.context_us));
  v1::ProfileSample seq;
  MOEPLAN_RETURN_IF_ERROR(rep.Run(sequential, nullptr, &seq));
  v1::ProfileSample sample;
  MOEPLAN_RETURN_IF_ERROR(rep.Run(fused, check, &sample));
  v1::SaaSample* ss = sample.mutable_saa();
  ss->set_context_us(p.context_us);
  SetShape(p.saa.a2a, ss->mutable_a2a());
  SetShape(p.saa.gather, ss->mutable_gather());
  ss->set_a2a_ranks_per_node(p.saa.a2a_ranks_per_node);
  ss->set_bytes(p.bytes);
  ss->set_dual(p.dual);
  ss->set_sequential_median_us(seq.median_us());
  return sample;
}

// C = A B with A, B all ones: every element of C is k (exact in fp32; bf16
// rounds k to 8 significant bits).
absl::StatusOr<v1::ProfileSample> Profiler::Gemm(const Point& p) {
  const DType t = options_.kernel_dtype;
  const size_t es = ex::SizeOf(t);
  ex::Device* dev = backend_->device.get();
  Buffers buf{dev, {}};
  auto ones = [&](int64_t count) {
    return buf.FromAs(std::vector<float>(static_cast<size_t>(count), 1.0f), t);
  };
  MOEPLAN_ASSIGN_OR_RETURN(void* a, ones(p.m * p.k));
  MOEPLAN_ASSIGN_OR_RETURN(void* b, ones(p.k * p.n));
  MOEPLAN_ASSIGN_OR_RETURN(void* c, buf.Make(static_cast<size_t>(p.m * p.n) * es));
  MOEPLAN_ASSIGN_OR_RETURN(void* c32, buf.Make(static_cast<size_t>(p.m * p.n) * 4));
  ex::Kernels& k = *backend_->kernels;
  // Row-major storage: A is m x k (k x m when transposed), B k x n (n x k).
  const int64_t lda = p.trans_a ? p.m : p.k, ldb = p.trans_b ? p.k : p.n;
  auto op = [&] {
    return k.Gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, 1.0f, a, lda, b, ldb, 0.0f, c, p.n, t);
  };
  auto check = [&]() -> absl::StatusOr<int64_t> {
    MOEPLAN_RETURN_IF_ERROR(k.ToF32(c, t, static_cast<float*>(c32), p.m * p.n));
    MOEPLAN_ASSIGN_OR_RETURN(std::vector<float> got, buf.Read(c32, p.m * p.n));
    const double want = static_cast<double>(p.k);
    const double tol = t == DType::kF32 ? 0.0 : want / 128.0;
    int64_t wrong = 0;
    for (float g : got) {
      if (std::abs(g - want) > tol) ++wrong;
    }
    return wrong;
  };
  v1::ProfileSample sample;
  const Repeater rep{dev, options_, /*kernel=*/true};
  MOEPLAN_RETURN_IF_ERROR(rep.Run(op, check, &sample));
  v1::GemmSample* gs = sample.mutable_gemm();
  gs->set_m(p.m);
  gs->set_n(p.n);
  gs->set_k(p.k);
  gs->set_trans_a(p.trans_a);
  gs->set_trans_b(p.trans_b);
  gs->set_tflops(2.0 * p.m * p.n * p.k / std::max(sample.median_us(), 1e-9) * 1e-6);
  MOEPLAN_ASSIGN_OR_RETURN(const double probe, ProbeGflops());
  gs->set_probe_gflops(probe);
  return sample;
}

absl::StatusOr<double> Profiler::ProbeGflops() {
  if (!probe_.has_value()) {
    MOEPLAN_ASSIGN_OR_RETURN(
        probe_, executor::SpeedProbe::Create(backend_->device.get(), backend_->kernels.get(),
                                             options_.kernel_dtype));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  absl::StatusOr<double> g = probe_->Gflops();
  // Every rank takes part in the sum, a failed one with 0, so none is left
  // waiting; the caller aborts on the error.
  double local = g.ok() ? *g : 0.0, sum = 0.0;
  MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MOEPLAN_RETURN_IF_ERROR(g.status());
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return sum / size;
}

// The executor's memory-bound kernels on S = p.tokens tokens of M = p.n, with
// `bytes` as the planner counts them (read + written): copy 2 S M b; order and
// i-order S M b + E T M b; routing 3 S E b (the gate's softmax and top-k).
absl::StatusOr<v1::ProfileSample> Profiler::Memory(const Point& p) {
  const DType t = options_.kernel_dtype;
  const int64_t b = static_cast<int64_t>(ex::SizeOf(t));
  const int64_t s = p.tokens, m = p.n, e = kMemoryExperts, top = kMemoryTopK;
  const int64_t cap = (top * s + e - 1) / e;
  ex::Device* dev = backend_->device.get();
  ex::Kernels& k = *backend_->kernels;
  Buffers buf{dev, {}};
  auto run = [&](const std::function<absl::Status()>& op,
                 int64_t bytes) -> absl::StatusOr<v1::ProfileSample> {
    v1::ProfileSample sample;
    const Repeater rep{dev, options_, /*kernel=*/true};
    MOEPLAN_RETURN_IF_ERROR(rep.Run(op, nullptr, &sample));
    v1::MemorySample* ms = sample.mutable_memory();
    ms->set_kernel(p.kernel);
    ms->set_bytes(bytes);
    ms->set_gbytes_per_s(static_cast<double>(bytes) / std::max(sample.median_us(), 1e-9) * 1e-3);
    return sample;
  };
  if (p.kernel == "gelu" || p.kernel == "gelu_bwd") {
    // The expert's activation on S x M elements: forward reads z and writes a,
    // backward reads z and da and writes dz (in place over da). z sits where
    // gelu' is 1 in float for the backward, so repeating it in place keeps dz
    // normal (a decaying dz would reach denormals and time those instead).
    const int64_t n = s * m;
    const bool bwd = p.kernel == "gelu_bwd";
    std::vector<float> z(static_cast<size_t>(n));
    for (size_t i = 0; i < z.size(); ++i) {
      z[i] = bwd ? 5.0f + static_cast<float>(i % 64) * 0.0625f
                 : -3.0f + static_cast<float>(i % 97) * (6.0f / 96.0f);
    }
    MOEPLAN_ASSIGN_OR_RETURN(void* zd, buf.FromAs(z, t));
    MOEPLAN_ASSIGN_OR_RETURN(void* out, buf.FromAs(std::vector<float>(z.size(), 1.0f), t));
    if (bwd) return run([&] { return k.ActivationBackward(zd, out, n, t); }, 3 * n * b);
    return run([&] { return k.Activation(zd, out, n, t); }, 2 * n * b);
  }
  // Deterministic logits spread over the experts (routing is data-dependent).
  std::vector<float> logits(static_cast<size_t>(s * e));
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f;
  MOEPLAN_ASSIGN_OR_RETURN(void* lg, buf.From(logits));
  ex::RouteBuffers r;
  MOEPLAN_ASSIGN_OR_RETURN(void* probs, buf.Make(static_cast<size_t>(s * e) * 4));
  MOEPLAN_ASSIGN_OR_RETURN(void* expert, buf.Make(static_cast<size_t>(s * top) * 4));
  MOEPLAN_ASSIGN_OR_RETURN(void* slot, buf.Make(static_cast<size_t>(s * top) * 4));
  MOEPLAN_ASSIGN_OR_RETURN(void* weight, buf.Make(static_cast<size_t>(s * top) * 4));
  r.probs = static_cast<float*>(probs);
  r.expert = static_cast<int32_t*>(expert);
  r.slot = static_cast<int32_t*>(slot);
  r.weight = static_cast<float*>(weight);
  auto route = [&] { return k.Route(static_cast<const float*>(lg), s, e, top, cap, r); };
  MOEPLAN_RETURN_IF_ERROR(route());
  ex::BufferShape shape;
  shape.tokens = s;
  shape.model = m;
  shape.experts = e;
  shape.top_k = top;
  shape.capacity = cap;
  shape.dtype = t;
  MOEPLAN_ASSIGN_OR_RETURN(void* x, buf.Make(static_cast<size_t>(s * m * b)));
  MOEPLAN_ASSIGN_OR_RETURN(void* y, buf.Make(static_cast<size_t>(s * m * b)));
  MOEPLAN_ASSIGN_OR_RETURN(void* dispatch,
                           buf.Make(static_cast<size_t>(shape.BufferElements() * b)));
  std::function<absl::Status()> op;
  int64_t bytes = 0;
  if (p.kernel == "copy") {
    op = [&] { return dev->Copy(y, x, static_cast<size_t>(s * m * b), ex::kComputeLane); };
    bytes = 2 * s * m * b;
  } else if (p.kernel == "order") {
    op = [&] { return k.Order(x, r, shape, dispatch); };
    bytes = s * m * b + e * cap * m * b;
  } else if (p.kernel == "iorder") {
    op = [&] { return k.IOrder(dispatch, r, shape, y); };
    bytes = s * m * b + e * cap * m * b;
  } else if (p.kernel == "route") {
    op = route;
    bytes = 3 * s * e * b;
  } else {
    return absl::InvalidArgumentError(Cat("memory kernel: unknown ", p.kernel));
  }
  return run(op, bytes);
}

}  // namespace moeplan::profiler
