// MpiCommunicator: the collectives on host buffers with Open MPI's non-blocking
// operations. Errors come back as codes (MPI_ERRORS_RETURN on every
// communicator) and become Status with the call and its sizes.
#include <mpi.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/executor/backends.h"

namespace moeplan::executor {
namespace {

absl::Status MpiError(int code, std::string_view call) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return absl::InternalError(Cat("mpi: ", call, ": ", std::string_view(text, len)));
}

#define MOEPLAN_MPI(call, what)                                           \
  do {                                                                    \
    if (int _rc = (call); _rc != MPI_SUCCESS) return MpiError(_rc, what); \
  } while (0)

// MpiWait::kSleep: MPI_Testall until done, sleeping between tests once a few
// quick ones failed (1, 2, 4, ... us up to kMpiSleepMaxUs). The thread's timer
// slack is set to 1 us once, or Linux would round each sleep up to 50 us.
int TestAllWithBackoff(int n, MPI_Request* reqs) {
  static thread_local bool slack_set = false;
  if (!slack_set) {
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    slack_set = true;
  }
  constexpr int kQuickTests = 8;
  long sleep_ns = 1000;
  for (int tests = 0;; ++tests) {
    int done = 0;
    if (const int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE); rc != MPI_SUCCESS) {
      return rc;
    }
    if (done) return MPI_SUCCESS;
    if (tests < kQuickTests) continue;
    const timespec ts{0, sleep_ns};
    nanosleep(&ts, nullptr);
    sleep_ns = std::min<long>(2 * sleep_ns, kMpiSleepMaxUs * 1000L);
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, Device* dev, MpiWait wait) : comm_(comm), dev_(dev), wait_(wait) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    for (Slot& s : slots_) {
      if (s.busy) MPI_Waitall(s.nreq, s.reqs, MPI_STATUSES_IGNORE);
    }
    for (StridedType& t : types_) MPI_Type_free(&t.type);
    MPI_Comm_free(&comm_);
  }

  std::string_view backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  LaneId lane() const override { return kComputeLane; }
  bool ThreadSafe() const override {
    int provided = MPI_THREAD_SINGLE;
    return MPI_Query_thread(&provided) == MPI_SUCCESS && provided == MPI_THREAD_MULTIPLE;
  }

  absl::StatusOr<Request> StartAllGather(const void* send, void* recv, size_t count, DType t,
                                         size_t recv_stride) override {
    MOEPLAN_ASSIGN_OR_RETURN(MPI_Datatype type, Type(t, false, "AllGather"));
    MOEPLAN_ASSIGN_OR_RETURN(int count_i, Count(count, "AllGather"));
    Request r = Begin();
    Slot& s = slots_[static_cast<size_t>(r.slot)];
    if (recv_stride == 0 || recv_stride == count) {
      MOEPLAN_MPI(MPI_Iallgather(send, count_i, type, recv, count_i, type, comm_, &s.reqs[0]),
                  Cat("MPI_Iallgather(count=", count, ")"));
    } else {
      // Each rank's block lands recv_stride elements after the previous one: a
      // contiguous type resized to that extent (cached: no type per call).
      MOEPLAN_ASSIGN_OR_RETURN(MPI_Datatype strided, Strided(type, count, recv_stride, t));
      MOEPLAN_MPI(MPI_Iallgather(send, count_i, type, recv, 1, strided, comm_, &s.reqs[0]),
                  Cat("MPI_Iallgather(count=", count, ", stride=", recv_stride, ")"));
    }
    s.nreq = 1;
    return r;
  }

  absl::StatusOr<Request> StartReduceScatter(const void* send, void* recv, size_t recv_count,
                                             DType t, size_t send_stride) override {
    MOEPLAN_ASSIGN_OR_RETURN(MPI_Datatype type, Type(t, true, "ReduceScatter"));
    MOEPLAN_ASSIGN_OR_RETURN(int count_i, Count(recv_count, "ReduceScatter"));
    Request r = Begin();
    Slot& s = slots_[static_cast<size_t>(r.slot)];
    const void* input = send;
    if (send_stride != 0 && send_stride != recv_count) {
      // MPI reduces contiguous blocks only: pack the strided blocks (the
      // staging buffer keeps its capacity across calls).
      const size_t block = recv_count * SizeOf(t);
      s.staging.resize(block * static_cast<size_t>(size_));
      for (int p = 0; p < size_; ++p) {
        std::memcpy(
            s.staging.data() + block * static_cast<size_t>(p),
            static_cast<const char*>(send) + send_stride * SizeOf(t) * static_cast<size_t>(p),
            block);
      }
      input = s.staging.data();
    }
    MOEPLAN_MPI(MPI_Ireduce_scatter_block(input, recv, count_i, type, MPI_SUM, comm_, &s.reqs[0]),
                Cat("MPI_Ireduce_scatter_block(count=", recv_count, ")"));
    s.nreq = 1;
    return r;
  }

  absl::StatusOr<Request> StartAllReduce(const void* send, void* recv, size_t count,
                                         DType t) override {
    MOEPLAN_ASSIGN_OR_RETURN(MPI_Datatype type, Type(t, true, "AllReduce"));
    MOEPLAN_ASSIGN_OR_RETURN(int count_i, Count(count, "AllReduce"));
    Request r = Begin();
    Slot& s = slots_[static_cast<size_t>(r.slot)];
    if (send == recv) {
      // Never MPI_IN_PLACE: Open MPI 4.1's MPI_Iallreduce (libnbc) schedules
      // an in-place reduction differently (by its timing, a tree rather than a
      // ring); over 4 ranks on 2 hosts at 1 Gbit/s a 10.7 MB in-place
      // AllReduce took 229 ms against 101 ms from a separate buffer. Copying the input into the
      // slot's staging buffer (capacity kept across calls) costs a memcpy.
      const size_t bytes = count * SizeOf(t);
      s.staging.resize(bytes);
      std::memcpy(s.staging.data(), recv, bytes);
      send = s.staging.data();
    }
    MOEPLAN_MPI(MPI_Iallreduce(send, recv, count_i, type, MPI_SUM, comm_, &s.reqs[0]),
                Cat("MPI_Iallreduce(count=", count, ")"));
    s.nreq = 1;
    return r;
  }

  // An even exchange through MPI_Ialltoallv with equal counts: on Open MPI
  // 4.1 between two hosts over TCP, MPI_Ialltoall moved 1 MiB to 16 MiB
  // 1.9x slower than MPI_Ialltoallv with the same counts (8.2 ms against
  // 4.4 ms per MiB at 1 Gbit/s; 2 ranks, one per host); on shared memory
  // the two are equal (docs/executor.md "Backends").
  absl::StatusOr<Request> StartAlltoAll(const void* send, void* recv, size_t count_per_peer,
                                        DType t) override {
    MOEPLAN_ASSIGN_OR_RETURN(MPI_Datatype type, Type(t, false, "AlltoAll"));
    MOEPLAN_ASSIGN_OR_RETURN(int count_i, Count(count_per_peer, "AlltoAll"));
    // The last peer's offset is an int too.
    MOEPLAN_RETURN_IF_ERROR(
        Count(count_per_peer * static_cast<size_t>(size_), "AlltoAll (all peers)").status());
    Request r = Begin();
    Slot& s = slots_[static_cast<size_t>(r.slot)];
    const size_t n = static_cast<size_t>(size_);
    s.ints.resize(2 * n);
    int* counts = s.ints.data();
    int* offsets = counts + n;
    for (size_t p = 0; p < n; ++p) {
      counts[p] = count_i;
      offsets[p] = static_cast<int>(p) * count_i;
    }
    if (const int rc = MPI_Ialltoallv(send, counts, offsets, type, recv, counts, offsets, type,
                                      comm_, &s.reqs[0]);
        rc != MPI_SUCCESS) {
      s.busy = false;
      return MpiError(rc, Cat("MPI_Ialltoallv(even, count_per_peer=", count_per_peer, ")"));
    }
    s.nreq = 1;
    return r;
  }

  absl::StatusOr<Request> StartAlltoAllv(const void* send, const size_t* send_counts,
                                         const size_t* send_offsets, void* recv,
                                         const size_t* recv_counts, const size_t* recv_offsets,
                                         DType t) override {
    MOEPLAN_ASSIGN_OR_RETURN(MPI_Datatype type, Type(t, false, "AlltoAllv"));
    Request r = Begin();
    Slot& s = slots_[static_cast<size_t>(r.slot)];
    // MPI takes int counts and displacements, read until completion: kept in
    // the slot (its vectors keep their capacity, so a warm slot allocates nothing).
    const size_t n = static_cast<size_t>(size_);
    s.ints.resize(4 * n);
    int* sc = s.ints.data();
    int* sd = sc + n;
    int* rc = sd + n;
    int* rd = rc + n;
    for (size_t p = 0; p < n; ++p) {
      absl::StatusOr<int> v[4] = {Count(send_counts[p], "AlltoAllv send count"),
                                  Count(send_offsets[p], "AlltoAllv send offset"),
                                  Count(recv_counts[p], "AlltoAllv receive count"),
                                  Count(recv_offsets[p], "AlltoAllv receive offset")};
      for (const absl::StatusOr<int>& x : v) {
        if (!x.ok()) {
          s.busy = false;
          return x.status();
        }
      }
      sc[p] = *v[0];
      sd[p] = *v[1];
      rc[p] = *v[2];
      rd[p] = *v[3];
    }
    if (const int rc_mpi =
            MPI_Ialltoallv(send, sc, sd, type, recv, rc, rd, type, comm_, &s.reqs[0]);
        rc_mpi != MPI_SUCCESS) {
      s.busy = false;
      return MpiError(rc_mpi, Cat("MPI_Ialltoallv(send to rank 0: ", send_counts[0], ")"));
    }
    s.nreq = 1;
    return r;
  }

  absl::Status ExchangeCounts(absl::Span<const int64_t> send, absl::Span<int64_t> recv) override {
    if (send.size() != recv.size() || send.size() % static_cast<size_t>(size_) != 0) {
      return absl::InvalidArgumentError(
          Cat("mpi: ExchangeCounts: send and recv must hold the same multiple of the group size ",
              size_, " (got ", send.size(), " and ", recv.size(), ")"));
    }
    MOEPLAN_ASSIGN_OR_RETURN(int per_peer,
                             Count(send.size() / static_cast<size_t>(size_), "ExchangeCounts"));
    MPI_Request req = MPI_REQUEST_NULL;
    MOEPLAN_MPI(MPI_Ialltoall(send.data(), per_peer, MPI_INT64_T, recv.data(), per_peer,
                              MPI_INT64_T, comm_, &req),
                Cat("MPI_Ialltoall(counts, per_peer=", per_peer, ")"));
    MOEPLAN_MPI(WaitAll(1, &req), "MPI_Waitall(counts)");
    return absl::OkStatus();
  }

  absl::StatusOr<Request> StartSendRecv(const void* send, size_t send_count, int dst, void* recv,
                                        size_t recv_count, int src, DType t) override {
    MOEPLAN_ASSIGN_OR_RETURN(MPI_Datatype type, Type(t, false, "SendRecv"));
    MOEPLAN_ASSIGN_OR_RETURN(int send_i, Count(send_count, "SendRecv"));
    MOEPLAN_ASSIGN_OR_RETURN(int recv_i, Count(recv_count, "SendRecv"));
    if (dst >= size_ || src >= size_ || dst < -1 || src < -1) {
      return absl::InvalidArgumentError(Cat("mpi: SendRecv: peers must be -1 or in [0, ", size_,
                                            ") (got dst=", dst, ", src=", src, ")"));
    }
    Request r = Begin();
    Slot& s = slots_[static_cast<size_t>(r.slot)];
    s.nreq = 0;
    if (src >= 0) {
      MOEPLAN_MPI(MPI_Irecv(recv, recv_i, type, src, kTag, comm_, &s.reqs[s.nreq++]),
                  Cat("MPI_Irecv(count=", recv_count, ", src=", src, ")"));
    }
    if (dst >= 0) {
      MOEPLAN_MPI(MPI_Isend(send, send_i, type, dst, kTag, comm_, &s.reqs[s.nreq++]),
                  Cat("MPI_Isend(count=", send_count, ", dst=", dst, ")"));
    }
    return r;
  }

  absl::Status Wait(Request* r) override {
    if (r->slot < 0 || r->slot >= static_cast<int>(slots_.size()) ||
        !slots_[static_cast<size_t>(r->slot)].busy) {
      return absl::FailedPreconditionError("mpi: Wait on a request that is not in flight");
    }
    Slot& s = slots_[static_cast<size_t>(r->slot)];
    const int rc = WaitAll(s.nreq, s.reqs);
    s.busy = false;
    s.nreq = 0;
    r->slot = -1;
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Waitall");
    r->end = Stamp{MPI_Wtime() * 1e6, -1};
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    MOEPLAN_MPI(MPI_Comm_split(comm_, color, key, &sub), Cat("MPI_Comm_split(color=", color, ")"));
    MOEPLAN_MPI(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    return std::unique_ptr<Communicator>(new MpiCommunicator(sub, dev_, wait_));
  }

  absl::Status Barrier() override {
    MOEPLAN_MPI(MPI_Barrier(comm_), "MPI_Barrier");
    return absl::OkStatus();
  }

 private:
  static constexpr int kTag = 7301;

  int WaitAll(int n, MPI_Request* reqs) const {
    return wait_ == MpiWait::kSleep ? TestAllWithBackoff(n, reqs)
                                    : MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
  }

  struct Slot {
    bool busy = false;
    int nreq = 0;
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    std::vector<char> staging;
    std::vector<int> ints;  // AlltoAllv's counts and displacements
  };
  struct StridedType {
    size_t count, stride;
    DType t;
    MPI_Datatype type;
  };

  // A free slot (slots are reused, so a warm communicator allocates nothing).
  Request Begin() {
    size_t i = 0;
    while (i < slots_.size() && slots_[i].busy) ++i;
    if (i == slots_.size()) slots_.emplace_back();
    slots_[i].busy = true;
    Request r;
    r.slot = static_cast<int>(i);
    r.begin = Stamp{MPI_Wtime() * 1e6, -1};
    return r;
  }

  static absl::StatusOr<MPI_Datatype> Type(DType t, bool reduces, std::string_view op) {
    if (t == DType::kF32) return MPI_FLOAT;
    // MPI has no bf16 arithmetic; moving bf16 bits needs none.
    if (!reduces) return MPI_UINT16_T;
    return absl::UnimplementedError(
        Cat("mpi: ", op, ": bf16 reductions are not supported by the mpi backend (use f32)"));
  }

  static absl::StatusOr<int> Count(size_t n, std::string_view op) {
    if (n > static_cast<size_t>(INT32_MAX)) {
      return absl::InvalidArgumentError(
          Cat("mpi: ", op, ": count ", n, " exceeds MPI's int range (2^31-1 elements)"));
    }
    return static_cast<int>(n);
  }

  absl::StatusOr<MPI_Datatype> Strided(MPI_Datatype base, size_t count, size_t stride, DType t) {
    for (const StridedType& s : types_) {
      if (s.count == count && s.stride == stride && s.t == t) return s.type;
    }
    MPI_Datatype block = MPI_DATATYPE_NULL, resized = MPI_DATATYPE_NULL;
    MOEPLAN_MPI(MPI_Type_contiguous(static_cast<int>(count), base, &block), "MPI_Type_contiguous");
    MOEPLAN_MPI(
        MPI_Type_create_resized(block, 0, static_cast<MPI_Aint>(stride * SizeOf(t)), &resized),
        "MPI_Type_create_resized");
    MPI_Type_free(&block);
    MOEPLAN_MPI(MPI_Type_commit(&resized), "MPI_Type_commit");
    types_.push_back({count, stride, t, resized});
    return resized;
  }

  MPI_Comm comm_;
  Device* dev_;
  MpiWait wait_;
  int rank_ = 0, size_ = 1;
  std::vector<Slot> slots_;
  std::vector<StridedType> types_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeMpiWorld(Device* device, MpiWait wait) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return absl::FailedPreconditionError("mpi: MPI_Init has not been called");
  MPI_Comm world = MPI_COMM_NULL;
  MOEPLAN_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup(MPI_COMM_WORLD)");
  MOEPLAN_MPI(MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return std::unique_ptr<Communicator>(new MpiCommunicator(world, device, wait));
}

std::string MpiVersion() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string_view v(text, static_cast<size_t>(len));
  const size_t end = v.find_first_of(",\n");
  return std::string(v.substr(0, end));
}

double MaxOverWorld(double v) {
  double out = v;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

int64_t SumOverWorld(int64_t v) {
  int64_t out = v;
  MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return out;
}

bool TrueOnAllRanks(bool v) {
  int in = v ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return out == 1;
}

}  // namespace moeplan::executor
