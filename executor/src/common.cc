// Shared pieces of the executor: element types, device buffers and the blocking
// forms of the collectives.
#include <utility>

#include "moeplan/base/bf16.h"
#include "moeplan/base/status.h"
#include "moeplan/executor/comm.h"
#include "moeplan/executor/device.h"

namespace moeplan::executor {

size_t SizeOf(DType t) { return t == DType::kBF16 ? 2 : 4; }

std::string_view DTypeName(DType t) { return t == DType::kBF16 ? "bf16" : "f32"; }

bool ParseDType(std::string_view name, DType* out) {
  if (name == "f32" || name == "fp32") {
    *out = DType::kF32;
    return true;
  }
  if (name == "bf16") {
    *out = DType::kBF16;
    return true;
  }
  return false;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Make(Device* dev, size_t bytes) {
  DeviceBuffer b;
  absl::StatusOr<void*> p = dev->Alloc(bytes);
  if (!p.ok()) return p.status();
  b.dev_ = dev;
  b.p_ = *p;
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    dev_ = std::exchange(o.dev_, nullptr);
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (dev_ != nullptr && p_ != nullptr) dev_->Free(p_);
  dev_ = nullptr;
  p_ = nullptr;
  bytes_ = 0;
}

absl::Status UploadAs(Device& dev, void* dst, absl::Span<const float> host, DType t,
                      std::vector<uint16_t>* scratch) {
  if (t == DType::kF32) return dev.Upload(dst, host.data(), host.size() * sizeof(float));
  std::vector<uint16_t> local;
  std::vector<uint16_t>& half = scratch != nullptr ? *scratch : local;
  half.resize(host.size());
  for (size_t i = 0; i < host.size(); ++i) half[i] = FloatToBf16(host[i]);
  return dev.Upload(dst, half.data(), half.size() * sizeof(uint16_t));
}

absl::Status DownloadAs(Device& dev, absl::Span<float> host, const void* src, DType t,
                        std::vector<uint16_t>* scratch) {
  if (t == DType::kF32) return dev.Download(host.data(), src, host.size() * sizeof(float));
  std::vector<uint16_t> local;
  std::vector<uint16_t>& half = scratch != nullptr ? *scratch : local;
  half.resize(host.size());
  MOEPLAN_RETURN_IF_ERROR(dev.Download(half.data(), src, half.size() * sizeof(uint16_t)));
  for (size_t i = 0; i < host.size(); ++i) host[i] = Bf16ToFloat(half[i]);
  return absl::OkStatus();
}

namespace {
absl::Status Finish(Communicator* c, absl::StatusOr<Request> r, Request* timing) {
  if (!r.ok()) return r.status();
  Request req = *r;
  MOEPLAN_RETURN_IF_ERROR(c->Wait(&req));
  if (timing != nullptr) *timing = req;
  return absl::OkStatus();
}
}  // namespace

absl::Status Communicator::AllGather(const void* send, void* recv, size_t count, DType t,
                                     size_t recv_stride, Request* timing) {
  return Finish(this, StartAllGather(send, recv, count, t, recv_stride), timing);
}
absl::Status Communicator::ReduceScatter(const void* send, void* recv, size_t recv_count, DType t,
                                         size_t send_stride, Request* timing) {
  return Finish(this, StartReduceScatter(send, recv, recv_count, t, send_stride), timing);
}
absl::Status Communicator::AllReduce(const void* send, void* recv, size_t count, DType t,
                                     Request* timing) {
  return Finish(this, StartAllReduce(send, recv, count, t), timing);
}
absl::Status Communicator::AlltoAll(const void* send, void* recv, size_t count_per_peer, DType t,
                                    Request* timing) {
  return Finish(this, StartAlltoAll(send, recv, count_per_peer, t), timing);
}
absl::Status Communicator::SendRecv(const void* send, size_t send_count, int dst, void* recv,
                                    size_t recv_count, int src, DType t, Request* timing) {
  return Finish(this, StartSendRecv(send, send_count, dst, recv, recv_count, src, t), timing);
}

}  // namespace moeplan::executor
