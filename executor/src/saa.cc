#include "moeplan/executor/saa.h"

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"

namespace moeplan::executor {
namespace {

using planner::OpKind;

// One collective in flight and its record.
struct InFlight {
  Communicator* comm = nullptr;  // nullptr: nothing in flight
  Request req;
  size_t rec = 0;
};

class Steps {
 public:
  explicit Steps(const SaaArgs& a) : a_(a), es_(SizeOf(a.dtype)) {}

  size_t Bytes(int64_t elems) const { return static_cast<size_t>(elems) * es_; }

  absl::Status Finish(InFlight* f) {
    if (f->comm == nullptr) return absl::OkStatus();
    MOEPLAN_RETURN_IF_ERROR(f->comm->Wait(&f->req));
    if (a_.recorder != nullptr) a_.recorder->Set(f->rec, f->req.begin, f->req.end);
    f->comm = nullptr;
    return absl::OkStatus();
  }

  // Issues `start` on `comm` (recorded as name.step).
  template <class Fn>
  absl::StatusOr<InFlight> Issue(Communicator* comm, std::string_view name, int step, Fn&& start) {
    InFlight f;
    if (a_.recorder != nullptr) f.rec = a_.recorder->Reserve(name, step, a_.phase, OpKind::kComm);
    MOEPLAN_ASSIGN_OR_RETURN(f.req, start());
    f.comm = comm;
    return f;
  }

  absl::StatusOr<InFlight> Exchange(int step, const char* send, char* recv, int to, int from) {
    return Issue(a_.a2a, a_.a2a_name, step, [&] {
      return a_.a2a->StartSendRecv(send, static_cast<size_t>(a_.chunk), to, recv,
                                   static_cast<size_t>(a_.chunk), from, a_.dtype);
    });
  }

 private:
  const SaaArgs& a_;
  size_t es_;
};

absl::Status CheckArgs(const SaaArgs& a) {
  if (a.device == nullptr || a.a2a == nullptr || a.group == nullptr) {
    return absl::InvalidArgumentError("saa: device, a2a and group are required");
  }
  if (a.chunk < 0 || a.stride < 0) {
    return absl::InvalidArgumentError(
        Cat("saa: chunk (", a.chunk, ") and stride (", a.stride, ") must be >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SaaGather(const SaaArgs& a, const void* send_v, void* a2a_recv_v, void* out_v) {
  MOEPLAN_RETURN_IF_ERROR(CheckArgs(a));
  const auto* send = static_cast<const char*>(send_v);
  auto* a2a_recv = static_cast<char*>(a2a_recv_v);
  auto* out = static_cast<char*>(out_v);
  Steps st(a);
  const int w = a.a2a->size(), q = a.a2a->rank();
  const size_t cb = st.Bytes(a.chunk);
  auto chunk_of = [&](int c) -> const char* {
    return (c == q ? send : a2a_recv) + cb * static_cast<size_t>(c);
  };
  auto gather = [&](int step, int c) -> absl::StatusOr<InFlight> {
    char* dst = out + cb * static_cast<size_t>(c);
    if (a.group->size() == 1) {
      MOEPLAN_RETURN_IF_ERROR(a.device->Copy(dst, chunk_of(c), cb, kComputeLane));
      return InFlight{};
    }
    return st.Issue(a.group, a.group_name, step, [&] {
      return a.group->StartAllGather(chunk_of(c), dst, static_cast<size_t>(a.chunk), a.dtype,
                                     static_cast<size_t>(a.stride));
    });
  };
  InFlight step, ag;
  for (int i = 1; i < w; ++i) {
    MOEPLAN_RETURN_IF_ERROR(st.Finish(&step));  // the exchange steps run one after another
    const int to = (q + i) % w, from = (q - i + w) % w;
    MOEPLAN_ASSIGN_OR_RETURN(step,
                             st.Exchange(i, send + cb * static_cast<size_t>(to),
                                         a2a_recv + cb * static_cast<size_t>(from), to, from));
    // The chunk that arrived with step i-1 (the local chunk q first).
    MOEPLAN_RETURN_IF_ERROR(st.Finish(&ag));  // the gathers too
    MOEPLAN_ASSIGN_OR_RETURN(ag, gather(i - 1, (q - (i - 1) + w) % w));
  }
  MOEPLAN_RETURN_IF_ERROR(st.Finish(&step));
  MOEPLAN_RETURN_IF_ERROR(st.Finish(&ag));
  MOEPLAN_ASSIGN_OR_RETURN(ag, gather(w - 1, (q + 1) % w));
  return st.Finish(&ag);
}

absl::Status SaaScatter(const SaaArgs& a, const void* in_v, void* staging_v, void* a2a_recv_v) {
  MOEPLAN_RETURN_IF_ERROR(CheckArgs(a));
  const auto* in = static_cast<const char*>(in_v);
  auto* staging = static_cast<char*>(staging_v);
  auto* a2a_recv = static_cast<char*>(a2a_recv_v);
  Steps st(a);
  const int w = a.a2a->size(), q = a.a2a->rank();
  const size_t cb = st.Bytes(a.chunk);
  auto reduce = [&](int step, int c, char* dst) -> absl::Status {
    const char* src = in + cb * static_cast<size_t>(c);
    if (a.group->size() == 1) return a.device->Copy(dst, src, cb, kComputeLane);
    MOEPLAN_ASSIGN_OR_RETURN(InFlight f, st.Issue(a.group, a.group_name, step, [&] {
      return a.group->StartReduceScatter(src, dst, static_cast<size_t>(a.chunk), a.dtype,
                                         static_cast<size_t>(a.stride));
    }));
    return st.Finish(&f);
  };
  InFlight step;
  for (int i = 1; i < w; ++i) {
    const int to = (q + i) % w, from = (q - i + w) % w;
    char* reduced = staging + cb * static_cast<size_t>(to);
    MOEPLAN_RETURN_IF_ERROR(reduce(i, to, reduced));  // overlaps step i-1's exchange
    MOEPLAN_RETURN_IF_ERROR(st.Finish(&step));
    MOEPLAN_ASSIGN_OR_RETURN(
        step, st.Exchange(i, reduced, a2a_recv + cb * static_cast<size_t>(from), to, from));
  }
  MOEPLAN_RETURN_IF_ERROR(reduce(0, q, a2a_recv + cb * static_cast<size_t>(q)));
  return st.Finish(&step);
}

}  // namespace moeplan::executor
