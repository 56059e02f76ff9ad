// Communicators of the executor (docs/executor.md): the five collectives over a group of
// ranks, blocking and non-blocking, and sub-groups. MpiCommunicator works on host
// buffers, NcclCommunicator on device buffers with one lane (stream) per
// communicator, bootstrapped through MPI. Reductions are sums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "moeplan/executor/device.h"

namespace moeplan::executor {

// An op in flight. `begin` is stamped when the op is issued; `end` when it is
// known complete (MPI: when Wait observes it; NCCL: an event after the op on
// the communicator's lane).
struct Request {
  int slot = -1;  // the communicator's handle; -1 once waited
  Stamp begin;
  Stamp end;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string_view backend() const = 0;  // "mpi", "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The lane this communicator's ops run on (the compute lane for MPI).
  virtual LaneId lane() const = 0;
  // Whether each communicator may be driven from its own host thread at once
  // (MPI initialised with MPI_THREAD_MULTIPLE); what the plan interpreter's
  // threaded lanes need.
  virtual bool ThreadSafe() const { return false; }
  // With joins on (the default), an op starts after the work issued on the
  // compute lane so far and Wait makes later compute-lane work wait for it.
  // The plan interpreter turns them off and orders the lanes by the plan's
  // edges itself (CUDA: events); no effect where ops run on the compute lane.
  virtual void SetLaneJoins(bool on) { (void)on; }

  // Non-blocking ops. Each starts after the work already issued on the compute
  // lane (its inputs) and may be in flight together with other ops of this and
  // other communicators; all ranks of the group must issue the same ops in the
  // same order. Wait() makes the results usable by work issued on the compute
  // lane afterwards (MPI: blocks the host until done; NCCL: the compute lane
  // waits for the op, the host does not). Counts are elements of `t`.
  //
  // AllGather: rank r's `count` elements land at recv + r * recv_stride elements
  // (recv_stride 0: count, i.e. contiguous).
  virtual absl::StatusOr<Request> StartAllGather(const void* send, void* recv, size_t count,
                                                 DType t, size_t recv_stride = 0) = 0;
  // ReduceScatter: block r of the input (`recv_count` elements at
  // send + r * send_stride, send_stride 0: recv_count) is summed over ranks into
  // rank r's recv.
  virtual absl::StatusOr<Request> StartReduceScatter(const void* send, void* recv,
                                                     size_t recv_count, DType t,
                                                     size_t send_stride = 0) = 0;
  virtual absl::StatusOr<Request> StartAllReduce(const void* send, void* recv, size_t count,
                                                 DType t) = 0;
  // AlltoAll: block p of send (count elements) goes to rank p, lands at block
  // `rank()` of its recv.
  virtual absl::StatusOr<Request> StartAlltoAll(const void* send, void* recv, size_t count_per_peer,
                                                DType t) = 0;
  // AlltoAllv (irregular exchange): send_counts[p] elements at send +
  // send_offsets[p] go to rank p; recv_counts[p] elements from rank p land at
  // recv + recv_offsets[p]. The four arrays hold size() host values (elements
  // of t) and must stay valid until Wait; each pair must agree (send_counts[p]
  // here == recv_counts[rank()] on p), which ExchangeCounts arranges.
  virtual absl::StatusOr<Request> StartAlltoAllv(const void* send, const size_t* send_counts,
                                                 const size_t* send_offsets, void* recv,
                                                 const size_t* recv_counts,
                                                 const size_t* recv_offsets, DType t) = 0;
  // Host values, blocking: block p of `send` (send.size() / size() values)
  // goes to rank p and lands at block rank() of its `recv` (the same size).
  // What an irregular exchange needs first: how much each peer will send.
  virtual absl::Status ExchangeCounts(absl::Span<const int64_t> send, absl::Span<int64_t> recv) = 0;
  // Sends to `dst` and receives from `src` (either may be -1 for none).
  virtual absl::StatusOr<Request> StartSendRecv(const void* send, size_t send_count, int dst,
                                                void* recv, size_t recv_count, int src,
                                                DType t) = 0;
  virtual absl::Status Wait(Request* r) = 0;

  // Blocking forms: Start + Wait; `timing` (optional) receives the stamps.
  absl::Status AllGather(const void* send, void* recv, size_t count, DType t,
                         size_t recv_stride = 0, Request* timing = nullptr);
  absl::Status ReduceScatter(const void* send, void* recv, size_t recv_count, DType t,
                             size_t send_stride = 0, Request* timing = nullptr);
  absl::Status AllReduce(const void* send, void* recv, size_t count, DType t,
                         Request* timing = nullptr);
  absl::Status AlltoAll(const void* send, void* recv, size_t count_per_peer, DType t,
                        Request* timing = nullptr);
  absl::Status SendRecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count,
                        int src, DType t, Request* timing = nullptr);

  // A sub-group: ranks with the same `color` form one, ordered by `key`.
  // Collective over this communicator.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;
  // Host-side barrier over the group (waits for the group's in-flight work first).
  virtual absl::Status Barrier() = 0;
};

}  // namespace moeplan::executor
