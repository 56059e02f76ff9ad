// NcclCommunicator: the collectives of comm.h with NCCL on device buffers.
// Each communicator owns one lane (a CUDA stream of the device) and its own MPI
// communicator, which bootstraps it (rank 0's ncclUniqueId is broadcast) and
// serves Split and Barrier. Ops are stream-ordered: Start* joins the compute
// lane (the inputs are produced there), stamps begin, enqueues, stamps end;
// Wait makes the compute lane wait for the end stamp without blocking the host.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <climits>
#include <cstdio>
#include <memory>
#include <string>

#include "cuda_internal.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/executor/backends.h"
#include "moeplan/executor/comm.h"

namespace moeplan::executor {
namespace {

absl::Status NcclErrorStatus(ncclResult_t r, ncclComm_t comm, const char* call,
                             const std::string& where) {
  // ncclGetLastError accepts a null communicator (the last error of any).
  const char* last = ncclGetLastError(comm);
  std::string msg = Cat("nccl: ", call, " in ", where, ": ", ncclGetErrorString(r));
  if (last != nullptr && last[0] != '\0') msg += Cat(" (", last, ")");
  return absl::InternalError(msg);
}

#define MOEPLAN_NCCL_RETURN_IF_ERROR(comm, expr, ...)                                      \
  do {                                                                                     \
    const ncclResult_t moeplan_nccl_r_ = (expr);                                           \
    if (moeplan_nccl_r_ != ncclSuccess) {                                                  \
      return NcclErrorStatus(moeplan_nccl_r_, (comm), #expr, ::moeplan::Cat(__VA_ARGS__)); \
    }                                                                                      \
  } while (false)

absl::Status MpiErrorStatus(int code, const char* call, const std::string& where) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return absl::InternalError(Cat("mpi: ", call, " in ", where, ": ", std::string(text, len)));
}

#define MOEPLAN_MPI_RETURN_IF_ERROR(expr, ...)                                    \
  do {                                                                            \
    const int moeplan_mpi_rc_ = (expr);                                           \
    if (moeplan_mpi_rc_ != MPI_SUCCESS) {                                         \
      return MpiErrorStatus(moeplan_mpi_rc_, #expr, ::moeplan::Cat(__VA_ARGS__)); \
    }                                                                             \
  } while (false)

absl::StatusOr<ncclDataType_t> NcclType(DType t, std::string_view who) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
  }
  return absl::InvalidArgumentError(Cat(who, ": unsupported dtype ", static_cast<int>(t)));
}

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// What rank 0 broadcasts: whether it got an id, and the id. One broadcast, so
// that a failing rank 0 cannot leave the others waiting for a second one.
struct Bootstrap {
  int ok = 0;
  ncclUniqueId id;
};

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `mpi` (freed in the destructor, also on failure).
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(Device* device, int ordinal,
                                                              MPI_Comm mpi) {
    std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(device, ordinal, mpi));
    MOEPLAN_RETURN_IF_ERROR(c->Init());
    return std::unique_ptr<Communicator>(std::move(c));
  }

  ~NcclCommunicator() override {
    // Errors are only printed: a destructor cannot return them.
    if (cudaSetDevice(ordinal_) == cudaSuccess) {
      if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
      if (staging_ != nullptr) (void)cudaFree(staging_);
      (void)cudaGetLastError();
    }
    if (nccl_ != nullptr) {
      // Finalize flushes this rank's outstanding operations; every rank
      // destroys its communicators in the same order, as NCCL requires.
      ncclResult_t r = ncclCommFinalize(nccl_);
      if (r == ncclSuccess) r = ncclCommDestroy(nccl_);
      if (r != ncclSuccess) {
        std::fprintf(stderr, "moeplan: nccl communicator teardown failed: %s\n",
                     ncclGetErrorString(r));
      }
    }
    if (mpi_ != MPI_COMM_NULL && !MpiFinalized()) MPI_Comm_free(&mpi_);
  }

  std::string_view backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  LaneId lane() const override { return lane_; }

  absl::StatusOr<Request> StartAllGather(const void* send, void* recv, size_t count, DType t,
                                         size_t recv_stride) override {
    constexpr std::string_view kWho = "NcclCommunicator::StartAllGather";
    absl::StatusOr<ncclDataType_t> dt = NcclType(t, kWho);
    if (!dt.ok()) return dt.status();
    if (recv_stride != 0 && recv_stride < count) {
      return Invalid(kWho, Cat("recv_stride ", recv_stride, " < count ", count));
    }
    const bool strided = recv_stride != 0 && recv_stride != count;
    absl::StatusOr<Request> req = Begin(kWho);
    if (!req.ok()) return req.status();
    if (count > 0) {
      const size_t elt = SizeOf(t);
      if (!strided) {
        MOEPLAN_NCCL_RETURN_IF_ERROR(nccl_, ncclAllGather(send, recv, count, *dt, nccl_, stream_),
                                     Where(kWho, count));
      } else {
        // NCCL gathers contiguously: gather into the staging buffer, then
        // spread the rank blocks to their strided places, in stream order.
        absl::StatusOr<void*> stage = Staging(count * elt * size_, kWho);
        if (!stage.ok()) return stage.status();
        MOEPLAN_NCCL_RETURN_IF_ERROR(nccl_, ncclAllGather(send, *stage, count, *dt, nccl_, stream_),
                                     Where(kWho, count));
        MOEPLAN_CUDA_RETURN_IF_ERROR(
            cudaMemcpy2DAsync(recv, recv_stride * elt, *stage, count * elt, count * elt, size_,
                              cudaMemcpyDeviceToDevice, stream_),
            kWho, " spreading ", size_, " blocks of ", count, " to stride ", recv_stride);
      }
    }
    return End(*req, kWho);
  }

  absl::StatusOr<Request> StartReduceScatter(const void* send, void* recv, size_t recv_count,
                                             DType t, size_t send_stride) override {
    constexpr std::string_view kWho = "NcclCommunicator::StartReduceScatter";
    absl::StatusOr<ncclDataType_t> dt = NcclType(t, kWho);
    if (!dt.ok()) return dt.status();
    if (send_stride != 0 && send_stride < recv_count) {
      return Invalid(kWho, Cat("send_stride ", send_stride, " < recv_count ", recv_count));
    }
    const bool strided = send_stride != 0 && send_stride != recv_count;
    absl::StatusOr<Request> req = Begin(kWho);
    if (!req.ok()) return req.status();
    if (recv_count > 0) {
      const size_t elt = SizeOf(t);
      const void* input = send;
      if (strided) {
        // NCCL reads the blocks contiguously: pack them first, in stream order.
        absl::StatusOr<void*> stage = Staging(recv_count * elt * size_, kWho);
        if (!stage.ok()) return stage.status();
        MOEPLAN_CUDA_RETURN_IF_ERROR(
            cudaMemcpy2DAsync(*stage, recv_count * elt, send, send_stride * elt, recv_count * elt,
                              size_, cudaMemcpyDeviceToDevice, stream_),
            kWho, " packing ", size_, " blocks of ", recv_count, " from stride ", send_stride);
        input = *stage;
      }
      MOEPLAN_NCCL_RETURN_IF_ERROR(
          nccl_, ncclReduceScatter(input, recv, recv_count, *dt, ncclSum, nccl_, stream_),
          Where(kWho, recv_count));
    }
    return End(*req, kWho);
  }

  absl::StatusOr<Request> StartAllReduce(const void* send, void* recv, size_t count,
                                         DType t) override {
    constexpr std::string_view kWho = "NcclCommunicator::StartAllReduce";
    absl::StatusOr<ncclDataType_t> dt = NcclType(t, kWho);
    if (!dt.ok()) return dt.status();
    absl::StatusOr<Request> req = Begin(kWho);
    if (!req.ok()) return req.status();
    if (count > 0) {
      MOEPLAN_NCCL_RETURN_IF_ERROR(nccl_,
                                   ncclAllReduce(send, recv, count, *dt, ncclSum, nccl_, stream_),
                                   Where(kWho, count));
    }
    return End(*req, kWho);
  }

  absl::StatusOr<Request> StartAlltoAll(const void* send, void* recv, size_t count_per_peer,
                                        DType t) override {
    constexpr std::string_view kWho = "NcclCommunicator::StartAlltoAll";
    absl::StatusOr<ncclDataType_t> dt = NcclType(t, kWho);
    if (!dt.ok()) return dt.status();
    absl::StatusOr<Request> req = Begin(kWho);
    if (!req.ok()) return req.status();
    if (count_per_peer > 0) {
      const size_t block = count_per_peer * SizeOf(t);
      MOEPLAN_NCCL_RETURN_IF_ERROR(nccl_, ncclGroupStart(), Where(kWho, count_per_peer));
      absl::Status status;
      for (int p = 0; p < size_ && status.ok(); ++p) {
        status =
            GroupedSend(static_cast<const char*>(send) + p * block, count_per_peer, *dt, p, kWho);
        if (status.ok()) {
          status = GroupedRecv(static_cast<char*>(recv) + p * block, count_per_peer, *dt, p, kWho);
        }
      }
      // The group is closed even after a failed call, so NCCL's group state
      // stays consistent for later ops.
      const ncclResult_t end = ncclGroupEnd();
      if (!status.ok()) return status;
      if (end != ncclSuccess) {
        return NcclErrorStatus(end, nccl_, "ncclGroupEnd()", Where(kWho, count_per_peer));
      }
    }
    return End(*req, kWho);
  }

  absl::StatusOr<Request> StartAlltoAllv(const void* send, const size_t* send_counts,
                                         const size_t* send_offsets, void* recv,
                                         const size_t* recv_counts, const size_t* recv_offsets,
                                         DType t) override {
    constexpr std::string_view kWho = "NcclCommunicator::StartAlltoAllv";
    absl::StatusOr<ncclDataType_t> dt = NcclType(t, kWho);
    if (!dt.ok()) return dt.status();
    absl::StatusOr<Request> req = Begin(kWho);
    if (!req.ok()) return req.status();
    const size_t elt = SizeOf(t);
    MOEPLAN_NCCL_RETURN_IF_ERROR(nccl_, ncclGroupStart(), kWho);
    absl::Status status;
    for (int p = 0; p < size_ && status.ok(); ++p) {
      const size_t i = static_cast<size_t>(p);
      if (send_counts[i] > 0) {
        status = GroupedSend(static_cast<const char*>(send) + send_offsets[i] * elt, send_counts[i],
                             *dt, p, kWho);
      }
      if (status.ok() && recv_counts[i] > 0) {
        status = GroupedRecv(static_cast<char*>(recv) + recv_offsets[i] * elt, recv_counts[i], *dt,
                             p, kWho);
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    if (!status.ok()) return status;
    if (end != ncclSuccess) return NcclErrorStatus(end, nccl_, "ncclGroupEnd()", std::string(kWho));
    return End(*req, kWho);
  }

  // The counts are host values: they go over this communicator's MPI twin.
  absl::Status ExchangeCounts(absl::Span<const int64_t> send, absl::Span<int64_t> recv) override {
    constexpr std::string_view kWho = "NcclCommunicator::ExchangeCounts";
    if (send.size() != recv.size() || send.size() % static_cast<size_t>(size_) != 0) {
      return Invalid(kWho, Cat("send and recv must hold the same multiple of the group size ",
                               size_, " (got ", send.size(), " and ", recv.size(), ")"));
    }
    const size_t per_peer = send.size() / static_cast<size_t>(size_);
    if (per_peer > static_cast<size_t>(INT_MAX)) {
      return Invalid(kWho, Cat(per_peer, " values per peer exceed MPI's int range"));
    }
    MOEPLAN_MPI_RETURN_IF_ERROR(
        MPI_Alltoall(send.data(), static_cast<int>(per_peer), MPI_INT64_T, recv.data(),
                     static_cast<int>(per_peer), MPI_INT64_T, mpi_),
        kWho, " (", per_peer, " values per peer)");
    return absl::OkStatus();
  }

  absl::StatusOr<Request> StartSendRecv(const void* send, size_t send_count, int dst, void* recv,
                                        size_t recv_count, int src, DType t) override {
    constexpr std::string_view kWho = "NcclCommunicator::StartSendRecv";
    absl::StatusOr<ncclDataType_t> dt = NcclType(t, kWho);
    if (!dt.ok()) return dt.status();
    if (dst < -1 || dst >= size_)
      return Invalid(kWho, Cat("dst ", dst, " not in [-1, ", size_, ")"));
    if (src < -1 || src >= size_)
      return Invalid(kWho, Cat("src ", src, " not in [-1, ", size_, ")"));
    absl::StatusOr<Request> req = Begin(kWho);
    if (!req.ok()) return req.status();
    const bool do_send = dst >= 0 && send_count > 0;
    const bool do_recv = src >= 0 && recv_count > 0;
    if (do_send || do_recv) {
      MOEPLAN_NCCL_RETURN_IF_ERROR(nccl_, ncclGroupStart(), Where(kWho, send_count));
      absl::Status status;
      if (do_send) status = GroupedSend(send, send_count, *dt, dst, kWho);
      if (status.ok() && do_recv) status = GroupedRecv(recv, recv_count, *dt, src, kWho);
      const ncclResult_t end = ncclGroupEnd();
      if (!status.ok()) return status;
      if (end != ncclSuccess) {
        return NcclErrorStatus(end, nccl_, "ncclGroupEnd()", Where(kWho, send_count));
      }
    }
    return End(*req, kWho);
  }

  void SetLaneJoins(bool on) override { joins_ = on; }

  absl::Status Wait(Request* r) override {
    if (r == nullptr) return Invalid("NcclCommunicator::Wait", "request is null");
    if (r->slot < 0) return absl::OkStatus();  // already waited
    // Device-side only: later compute-lane work starts after the op's end.
    if (joins_) MOEPLAN_RETURN_IF_ERROR(device_->WaitStamp(kComputeLane, r->end));
    r->slot = -1;
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    MOEPLAN_MPI_RETURN_IF_ERROR(MPI_Comm_split(mpi_, color, key, &sub), "NcclCommunicator::Split(",
                                color, ", ", key, ")");
    if (sub == MPI_COMM_NULL) {
      return Invalid("NcclCommunicator::Split", Cat("color ", color, " gave no group"));
    }
    return Create(device_, ordinal_, sub);
  }

  absl::Status Barrier() override {
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), "NcclCommunicator::Barrier");
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "NcclCommunicator::Barrier");
    MOEPLAN_MPI_RETURN_IF_ERROR(MPI_Barrier(mpi_), "NcclCommunicator::Barrier");
    return absl::OkStatus();
  }

 private:
  NcclCommunicator(Device* device, int ordinal, MPI_Comm mpi)
      : device_(device), ordinal_(ordinal), mpi_(mpi) {}

  static absl::Status Invalid(std::string_view who, const std::string& what) {
    return absl::InvalidArgumentError(Cat(who, ": ", what));
  }
  std::string Where(std::string_view who, size_t count) const {
    return Cat(who, " (", count, " elements, rank ", rank_, " of ", size_, ")");
  }

  absl::Status Init() {
    constexpr std::string_view kWho = "MakeNcclWorld/Split";
    MOEPLAN_MPI_RETURN_IF_ERROR(MPI_Comm_rank(mpi_, &rank_), kWho);
    MOEPLAN_MPI_RETURN_IF_ERROR(MPI_Comm_size(mpi_, &size_), kWho);
    absl::StatusOr<LaneId> lane = device_->NewLane();
    if (!lane.ok()) return lane.status();
    lane_ = *lane;
    absl::StatusOr<cudaStream_t> stream = CudaStreamOf(device_, lane_, kWho);
    if (!stream.ok()) return stream.status();
    stream_ = *stream;

    Bootstrap boot;
    std::string id_error;
    if (rank_ == 0) {
      const ncclResult_t r = ncclGetUniqueId(&boot.id);
      boot.ok = r == ncclSuccess ? 1 : 0;
      if (r != ncclSuccess) id_error = ncclGetErrorString(r);
    }
    MOEPLAN_MPI_RETURN_IF_ERROR(MPI_Bcast(&boot, static_cast<int>(sizeof(boot)), MPI_BYTE, 0, mpi_),
                                kWho, " broadcasting the nccl unique id");
    if (boot.ok == 0) {
      return absl::InternalError(Cat("nccl: ncclGetUniqueId failed on rank 0 in ", kWho,
                                     id_error.empty() ? "" : ": ", id_error));
    }
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), kWho);
    // Kept only on success, so the destructor never finalises a failed one.
    ncclComm_t comm = nullptr;
    MOEPLAN_NCCL_RETURN_IF_ERROR(nullptr, ncclCommInitRank(&comm, size_, boot.id, rank_), kWho,
                                 " (rank ", rank_, " of ", size_, " on cuda:", ordinal_, ")");
    nccl_ = comm;
    return absl::OkStatus();
  }

  // Every op: after the compute lane's work so far (its inputs), stamped.
  absl::StatusOr<Request> Begin(std::string_view who) {
    MOEPLAN_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_), who);
    if (joins_) MOEPLAN_RETURN_IF_ERROR(device_->Join(lane_, kComputeLane));
    absl::StatusOr<Stamp> begin = device_->Record(lane_);
    if (!begin.ok()) return begin.status();
    Request r;
    r.begin = *begin;
    return r;
  }
  absl::StatusOr<Request> End(Request r, std::string_view who) {
    absl::StatusOr<Stamp> end = device_->Record(lane_);
    if (!end.ok()) return end.status();
    r.end = *end;
    r.slot = next_slot_;
    next_slot_ = next_slot_ == INT_MAX ? 0 : next_slot_ + 1;
    return r;
  }

  absl::Status GroupedSend(const void* buf, size_t count, ncclDataType_t dt, int peer,
                           std::string_view who) {
    MOEPLAN_NCCL_RETURN_IF_ERROR(nccl_, ncclSend(buf, count, dt, peer, nccl_, stream_), who,
                                 " (send of ", count, " elements to rank ", peer, ")");
    return absl::OkStatus();
  }
  absl::Status GroupedRecv(void* buf, size_t count, ncclDataType_t dt, int peer,
                           std::string_view who) {
    MOEPLAN_NCCL_RETURN_IF_ERROR(nccl_, ncclRecv(buf, count, dt, peer, nccl_, stream_), who,
                                 " (receive of ", count, " elements from rank ", peer, ")");
    return absl::OkStatus();
  }

  // The staging buffer, grown (never shrunk) to at least `bytes`. Only this
  // communicator's stream uses it, so stream order makes reuse safe; before
  // freeing a smaller one, that stream is drained.
  absl::StatusOr<void*> Staging(size_t bytes, std::string_view who) {
    if (bytes <= staging_bytes_) return staging_;
    if (staging_ != nullptr) {
      MOEPLAN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), who,
                                   " growing the staging buffer");
      MOEPLAN_CUDA_RETURN_IF_ERROR(cudaFree(staging_), who, " growing the staging buffer");
      staging_ = nullptr;
      staging_bytes_ = 0;
    }
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
      (void)cudaGetLastError();  // out-of-memory is not sticky; do not report it twice
      return absl::ResourceExhaustedError(Cat("cuda: cudaMalloc(", bytes, " bytes) in ", who,
                                              " (staging): ", cudaGetErrorString(e)));
    }
    staging_ = p;
    staging_bytes_ = bytes;
    return staging_;
  }

  Device* const device_;
  const int ordinal_;
  MPI_Comm mpi_ = MPI_COMM_NULL;
  ncclComm_t nccl_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  bool joins_ = true;  // SetLaneJoins
  LaneId lane_ = kComputeLane;
  cudaStream_t stream_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  int next_slot_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclWorld(Device* device) {
  absl::StatusOr<int> ordinal = CudaOrdinalOf(device, "MakeNcclWorld");
  if (!ordinal.ok()) return ordinal.status();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || MpiFinalized()) {
    return absl::FailedPreconditionError("MakeNcclWorld: MPI is not initialised (call MPI_Init)");
  }
  MPI_Comm world = MPI_COMM_NULL;
  MOEPLAN_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MakeNcclWorld");
  return NcclCommunicator::Create(device, *ordinal, world);
}

}  // namespace moeplan::executor
