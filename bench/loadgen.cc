// moeplan-loadgen: load generator for moeplan-server's PlanLayer, closed loop
// (default) or open loop at a fixed rate (--rate).
//
//   moeplan-loadgen --server 127.0.0.1:PORT [--clients 8] [--duration-s 10] [--warmup-s 1]
//                   [--mode cached|uncached|check] [--layer FILE] [--profile NAME]
//                   [--server-pid PID] [--deadline-ms 1000] [--channels 2] [--threads 0]
//                   [--rate R] [--json]
//
// With --rate R, calls are sent on a fixed schedule (R per second in all) with at
// most --clients outstanding, and latency counts from each call's scheduled time.
// Without it, keeps exactly --clients PlanLayer calls outstanding (gRPC async stubs over
// --channels connections, one completion queue per polling thread; each
// completion immediately re-issues its slot) for --warmup-s + --duration-s seconds, then stops
// issuing, drains what is in flight (bounded by the deadline) and prints throughput, latency
// percentiles, errors by status code and, with --server-pid, the server's RSS
// growth over the measured window.
//
// cached:   every call sends the same request, so after the first the server
//           answers from its plan cache. The request is serialised once and sent
//           as bytes (gRPC's generic stub), and each reply is compared byte for
//           byte with the last one the worker parsed and checked (a reply that
//           differs, such as one planned after its profile changed, is parsed
//           and checked): the load generator's own protobuf work stays out of
//           what is measured.
// uncached: every call carries a distinct, valid batch_size (a cyclic sequence far
//           longer than the server's cache), so every call is planned afresh.
// check:    the standard health service's Check (an empty unary call): gRPC's
//           own cost on this machine, the yardstick the plan modes are
//           reported against (scripts/load.sh prints their ratios to it).
//
// Exit status: 0 when every call succeeded, 1 when any failed (warmup and drain
// included), 2 on a usage or setup error.
#include <fmt/format.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "moeplan/base/flags.h"
#include "moeplan/proto/json.h"
#include "moeplan/v1/service.grpc.pb.h"

#ifndef MOEPLAN_SOURCE_DIR
#define MOEPLAN_SOURCE_DIR "."
#endif

namespace {

namespace v1 = ::moeplan::v1;
using Clock = std::chrono::steady_clock;

// --- latency histogram -------------------------------------------------------
// HDR-style log-linear buckets over nanoseconds: exact below 1024 ns, then 512
// sub-buckets per power of two (relative error < 0.2%). Fixed size, no allocation
// when recording.
class Histogram {
 public:
  static constexpr int kSubBits = 10;
  static constexpr uint64_t kSub = uint64_t{1} << kSubBits;  // 1024
  static constexpr uint64_t kHalf = kSub / 2;                // 512
  static constexpr int kMaxShift = 64 - kSubBits;
  static constexpr size_t kBuckets = kSub + kMaxShift * kHalf;

  Histogram() : counts_(kBuckets, 0) {}

  void Record(uint64_t ns) {
    ++counts_[Index(ns)];
    ++count_;
    sum_ns_ += ns;
    max_ns_ = std::max(max_ns_, ns);
    min_ns_ = std::min(min_ns_, ns);
  }
  void Merge(const Histogram& o) {
    for (size_t i = 0; i < kBuckets; ++i) counts_[i] += o.counts_[i];
    count_ += o.count_;
    sum_ns_ += o.sum_ns_;
    max_ns_ = std::max(max_ns_, o.max_ns_);
    min_ns_ = std::min(min_ns_, o.min_ns_);
  }
  uint64_t count() const { return count_; }
  uint64_t max_ns() const { return count_ ? max_ns_ : 0; }
  uint64_t min_ns() const { return count_ ? min_ns_ : 0; }
  double mean_ns() const { return count_ ? static_cast<double>(sum_ns_) / count_ : 0.0; }
  // The highest value equivalent to the q-quantile's bucket (capped at the max).
  uint64_t Quantile(double q) const {
    if (count_ == 0) return 0;
    const uint64_t rank =
        std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_))));
    uint64_t seen = 0;
    for (size_t i = 0; i < kBuckets; ++i) {
      seen += counts_[i];
      if (seen >= rank) return std::min(UpperBound(i), max_ns_);
    }
    return max_ns_;
  }

 private:
  static size_t Index(uint64_t v) {
    if (v < kSub) return static_cast<size_t>(v);
    const int msb = 63 - std::countl_zero(v);  // >= kSubBits
    const int shift = msb - (kSubBits - 1);    // >= 1; v >> shift in [kHalf, kSub)
    return static_cast<size_t>(shift) * kHalf + static_cast<size_t>(v >> shift);
  }
  static uint64_t UpperBound(size_t i) {
    if (i < kSub) return i;
    const uint64_t shift = i / kHalf - 1;
    const uint64_t sub = i - shift * kHalf;
    return ((sub + 1) << shift) - 1;
  }

  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  uint64_t sum_ns_ = 0;
  uint64_t max_ns_ = 0;
  uint64_t min_ns_ = UINT64_MAX;
};

// --- status codes -------------------------------------------------------------
constexpr int kNumCodes = 17;            // grpc::StatusCode OK..UNAUTHENTICATED
constexpr int kBadResponse = kNumCodes;  // OK status but an empty / malformed plan
constexpr int kNumErrorKinds = kNumCodes + 1;

const char* CodeName(int c) {
  static constexpr std::array<const char*, kNumErrorKinds> kNames = {"OK",
                                                                     "CANCELLED",
                                                                     "UNKNOWN",
                                                                     "INVALID_ARGUMENT",
                                                                     "DEADLINE_EXCEEDED",
                                                                     "NOT_FOUND",
                                                                     "ALREADY_EXISTS",
                                                                     "PERMISSION_DENIED",
                                                                     "RESOURCE_EXHAUSTED",
                                                                     "FAILED_PRECONDITION",
                                                                     "ABORTED",
                                                                     "OUT_OF_RANGE",
                                                                     "UNIMPLEMENTED",
                                                                     "INTERNAL",
                                                                     "UNAVAILABLE",
                                                                     "DATA_LOSS",
                                                                     "UNAUTHENTICATED",
                                                                     "BAD_RESPONSE"};
  return c >= 0 && c < kNumErrorKinds ? kNames[c] : "?";
}

// --- uncached request sequence -----------------------------------------------
// Distinct valid batch sizes: multiples of `step` (so batch_size*seq_len divides
// by mp, as S1 requires) in [step, step*count], within the planner's limits on
// tokens and buffer bytes. Call i gets step * (1 + (offset + i) mod count).
struct BatchSequence {
  int64_t step = 1;
  int64_t count = 1;
  int64_t offset = 0;
  int32_t At(uint64_t i) const {
    return static_cast<int32_t>(step * (1 + static_cast<int64_t>((offset + i) % count)));
  }
};

BatchSequence MakeBatchSequence(const v1::LayerConfig& l) {
  const int64_t mp = std::max(1, l.parallel().mp());
  const int64_t seq = std::max(1, l.seq_len());
  BatchSequence s;
  s.step = mp / std::gcd(seq, mp);
  // Mirror planner/src/validate.cc: B <= 2^24, B*L <= 2^31, X and D <= 2^50 bytes
  // (D ~ k*f*S*M*b; keep a 10% margin for the capacity's ceil).
  double max_b = std::min(static_cast<double>(int64_t{1} << 24),
                          static_cast<double>(int64_t{1} << 31) / static_cast<double>(seq));
  const double bpe = l.has_bytes_per_element() ? l.bytes_per_element() : 2;
  const double per_b = static_cast<double>(seq) * std::max(1, l.model_dim()) * bpe *
                       std::max(1.0, l.top_k() * l.capacity_factor()) * 1.1;
  max_b = std::min(max_b, std::ldexp(1.0, 50) / per_b);
  s.count = std::max<int64_t>(1, static_cast<int64_t>(max_b) / s.step);
  return s;
}

// --- RSS -----------------------------------------------------------------------
// VmRSS of a process in KiB; -1 when it cannot be read.
int64_t ReadRssKiB(int pid) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      try {
        return std::stoll(line.substr(6));
      } catch (...) {
        return -1;
      }
    }
  }
  return -1;
}

// --- the load loop ------------------------------------------------------------
struct Config {
  std::string server;
  int clients = 8;
  int channels = 2;
  int threads = 0;  // 0: min(channels, 2)
  double duration_s = 10;
  double warmup_s = 1;
  std::string mode = "cached";
  std::string layer_path = "examples/gpt2-moe-layer.json";
  std::string profile = "a100-8x8";
  int server_pid = 0;
  bool json = false;
  int deadline_ms = 1000;
  bool include_timeline = false;
  int64_t uncached_offset = -1;  // -1: random
  // > 0: open loop at this many calls per second in all (at most `clients`
  // outstanding); latency counts from each call's scheduled send time, so a
  // backlog shows up in the percentiles instead of slowing the offered load.
  double rate = 0;
};

struct Window {
  Clock::time_point start;    // loading begins
  Clock::time_point measure;  // warmup ends
  Clock::time_point end;      // measured window ends; no new calls after it
};

// One in-flight call. Reused for the whole run: the request keeps its storage,
// the response is parsed into a per-slot protobuf arena whose first block is
// preallocated and kept across Reset() (so parsing a response of the size the
// preflight saw allocates nothing), and the context is rebuilt in place per call
// (gRPC contexts are single-use).
struct Slot {
  explicit Slot(size_t arena_bytes)
      : arena_block(new char[arena_bytes]), arena(ArenaOptions(arena_block.get(), arena_bytes)) {}
  static google::protobuf::ArenaOptions ArenaOptions(char* block, size_t bytes) {
    google::protobuf::ArenaOptions o;
    o.initial_block = block;
    o.initial_block_size = bytes;
    return o;
  }
  std::unique_ptr<char[]> arena_block;
  google::protobuf::Arena arena;
  v1::PlanLayerResponse* response = nullptr;  // on `arena`
  v1::Planner::Stub* stub = nullptr;
  v1::PlanLayerRequest request;
  std::optional<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::PlanLayerResponse>> rpc;
  // --mode check and cached: calls through the generic stub, on bytes.
  grpc::GenericStub* generic = nullptr;
  grpc::ByteBuffer raw_request, raw_response;
  std::unique_ptr<grpc::ClientAsyncResponseReader<grpc::ByteBuffer>> raw_rpc;
  grpc::Status status;
  Clock::time_point sent;
  bool in_flight = false;
};

struct WorkerResult {
  Histogram latency;  // successful calls completed inside the measured window
  uint64_t ok_measured = 0;
  std::array<uint64_t, kNumErrorKinds> errors_measured{};
  std::array<uint64_t, kNumErrorKinds> errors_all{};  // warmup, window and drain
  uint64_t completed_all = 0;
  uint64_t cancelled_at_stop = 0;  // still in flight past the drain bound
  std::string first_error;
};

class Worker {
 public:
  // Slots first_slot, first_slot + stride, ... below `total` are this worker's;
  // slot i calls through stubs[i % stubs.size()].
  Worker(const std::vector<std::unique_ptr<v1::Planner::Stub>>& stubs,
         const std::vector<std::unique_ptr<grpc::GenericStub>>& generic, int first_slot, int stride,
         int total, const v1::PlanLayerRequest& base, size_t arena_bytes, const Config& cfg,
         const Window& w, const BatchSequence* seq, std::atomic<uint64_t>* seq_counter)
      : cfg_(cfg),
        w_(w),
        seq_(seq),
        seq_counter_(seq_counter),
        check_(cfg.mode == "check"),
        raw_(cfg.mode != "uncached"),
        method_(check_ ? "/grpc.health.v1.Health/Check" : "/moeplan.v1.Planner/PlanLayer") {
    // HealthCheckRequest{service = ""} is zero bytes: an empty message, not a
    // missing one (a default ByteBuffer has no slices).
    const std::string request_bytes = check_ ? std::string() : base.SerializeAsString();
    for (int i = first_slot; i < total; i += stride) {
      auto s = std::make_unique<Slot>(arena_bytes);
      s->stub = stubs[static_cast<size_t>(i) % stubs.size()].get();
      s->generic = generic[static_cast<size_t>(i) % generic.size()].get();
      grpc::Slice bytes(request_bytes.data(), request_bytes.size());
      s->raw_request = grpc::ByteBuffer(&bytes, 1);
      s->request = base;
      slots_.push_back(std::move(s));
    }
  }

  // `rate_share`: this worker's calls per second in open-loop mode (0: closed loop).
  void Run(double rate_share) {
    const auto deadline = std::chrono::milliseconds(cfg_.deadline_ms);
    const bool open_loop = rate_share > 0;
    const auto interval = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(open_loop ? 1.0 / rate_share : 0.0));
    Clock::time_point next_due = w_.start;
    std::vector<Slot*> idle;
    if (open_loop) {
      for (auto& s : slots_) idle.push_back(s.get());
    } else {
      for (auto& s : slots_) Issue(*s, deadline, Clock::now());
    }
    bool stopping = false;
    const Clock::time_point drain_bound = w_.end + deadline + std::chrono::seconds(2);
    bool cancelled = false;
    while (outstanding_ > 0 || (open_loop && Clock::now() < w_.end)) {
      if (open_loop) {
        // Send everything that is due and has a free slot; what has no slot stays
        // due (sent late, its latency counted from next_due).
        for (Clock::time_point now = Clock::now(); now < w_.end && next_due <= now && !idle.empty();
             next_due += interval) {
          Slot* s = idle.back();
          idle.pop_back();
          Issue(*s, deadline, next_due);
        }
      }
      void* tag = nullptr;
      bool ok = false;
      // Wake at least every 100 ms so a stalled server cannot hold us past the bound,
      // and in open loop when the next call is due.
      auto wake = std::chrono::system_clock::now() + std::chrono::milliseconds(100);
      if (open_loop && !idle.empty() && next_due < w_.end) {
        const auto until_due = next_due - Clock::now();
        wake = std::min(wake, std::chrono::system_clock::now() +
                                  std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                      std::max(until_due, Clock::duration::zero())));
      }
      const grpc::CompletionQueue::NextStatus ns = cq_.AsyncNext(&tag, &ok, wake);
      if (ns == grpc::CompletionQueue::SHUTDOWN) break;
      const Clock::time_point now = Clock::now();
      if (ns == grpc::CompletionQueue::GOT_EVENT) {
        Slot& s = *static_cast<Slot*>(tag);
        Complete(s, now);
        if (open_loop) {
          idle.push_back(&s);
        } else if (now < w_.end) {
          Issue(s, deadline, now);
        } else {
          stopping = true;
        }
      }
      if (!stopping && now >= w_.end) stopping = true;
      if (stopping && !cancelled && now >= drain_bound) {
        for (auto& s : slots_) {
          if (s->in_flight) {
            s->ctx->TryCancel();
            ++result_.cancelled_at_stop;
          }
        }
        cancelled = true;
      }
    }
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  const WorkerResult& result() const { return result_; }

 private:
  // `sent`: when the call counts as sent (its scheduled time in open loop).
  void Issue(Slot& s, std::chrono::milliseconds deadline, Clock::time_point sent) {
    s.rpc.reset();
    s.ctx.reset();
    s.ctx.emplace();
    s.ctx->set_deadline(std::chrono::system_clock::now() + deadline);
    if (seq_ != nullptr) {
      s.request.mutable_layer()->set_batch_size(
          seq_->At(seq_counter_->fetch_add(1, std::memory_order_relaxed)));
    }
    s.status = grpc::Status();
    s.sent = sent;
    s.in_flight = true;
    ++outstanding_;
    if (raw_) {
      s.raw_rpc = s.generic->PrepareUnaryCall(&*s.ctx, method_, s.raw_request, &cq_);
      s.raw_rpc->StartCall();
      s.raw_rpc->Finish(&s.raw_response, &s.status, &s);
      return;
    }
    s.response = nullptr;
    s.arena.Reset();
    s.response = google::protobuf::Arena::CreateMessage<v1::PlanLayerResponse>(&s.arena);
    s.rpc = s.stub->PrepareAsyncPlanLayer(&*s.ctx, s.request, &cq_);
    s.rpc->StartCall();
    s.rpc->Finish(s.response, &s.status, &s);
  }

  void Complete(Slot& s, Clock::time_point now) {
    s.in_flight = false;
    --outstanding_;
    ++result_.completed_all;
    int code = static_cast<int>(s.status.error_code());
    if (code < 0 || code >= kNumCodes) code = static_cast<int>(grpc::StatusCode::UNKNOWN);
    if (code == 0 && !check_ && !(raw_ ? SameOrValid(s.raw_response) : Valid(*s.response))) {
      code = kBadResponse;
    }
    const bool measured = now >= w_.measure && now < w_.end;
    if (code == 0) {
      if (measured) {
        ++result_.ok_measured;
        result_.latency.Record(static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(now - s.sent).count()));
      }
      return;
    }
    ++result_.errors_all[code];
    if (measured) ++result_.errors_measured[code];
    if (result_.first_error.empty()) {
      result_.first_error =
          fmt::format("{}: {}", CodeName(code),
                      code == kBadResponse ? "response without candidates or best_schedule"
                                           : s.status.error_message());
    }
  }

  static bool Valid(const v1::PlanLayerResponse& r) {
    return r.candidates_size() > 0 && r.best_schedule() != v1::SCHEDULE_UNSPECIFIED;
  }

  // Cached mode: a reply with the bytes of the last one checked is good as it
  // is; any other (the first, or one planned anew after its profile changed)
  // is parsed and checked, and its bytes kept.
  bool SameOrValid(const grpc::ByteBuffer& reply) {
    if (!reply.Dump(&slices_).ok()) return false;
    if (checked_.has_value()) {
      size_t at = 0;
      bool same = true;
      for (const grpc::Slice& sl : slices_) {
        if (at + sl.size() > checked_->size() ||
            std::memcmp(checked_->data() + at, sl.begin(), sl.size()) != 0) {
          same = false;
          break;
        }
        at += sl.size();
      }
      if (same && at == checked_->size()) return true;
    }
    std::string bytes;
    for (const grpc::Slice& sl : slices_) {
      bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    v1::PlanLayerResponse parsed;
    if (!parsed.ParseFromString(bytes) || !Valid(parsed)) return false;
    checked_ = std::move(bytes);
    return true;
  }

  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<grpc::Slice> slices_;   // reused: a reply's slices
  std::optional<std::string> checked_;  // cached mode: the last reply parsed and checked
  const Config& cfg_;
  const Window& w_;
  const BatchSequence* seq_;
  std::atomic<uint64_t>* seq_counter_;
  int outstanding_ = 0;
  const bool check_;
  const bool raw_;  // check and cached: bytes through the generic stub
  const std::string method_;
  WorkerResult result_;
};

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int index) {
  grpc::ChannelArguments args;
  // Own subchannel pool per channel: separate channels get separate connections.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("moeplan.loadgen.channel", index);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

std::string ResolveLayerPath(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::exists(path) || fs::path(path).is_absolute()) return path;
  const fs::path alt = fs::path(MOEPLAN_SOURCE_DIR) / path;
  return fs::exists(alt) ? alt.string() : path;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"moeplan-loadgen: closed-loop PlanLayer load against moeplan-server"};
  app.add_option("--server", cfg.server, "host:port of moeplan-server")->required();
  app.add_option("--clients", cfg.clients, "Calls kept outstanding at all times")
      ->capture_default_str()
      ->check(moeplan::flags::IntInRange(1, 100000));
  app.add_option("--channels", cfg.channels,
                 "gRPC channels, each its own TCP connection; calls are spread over them "
                 "round-robin (capped at --clients)")
      ->capture_default_str()
      ->check(moeplan::flags::IntInRange(1, 1024));
  app.add_option("--threads", cfg.threads,
                 "Completion-queue polling threads, one CQ each (0: min(channels, 2))")
      ->capture_default_str()
      ->check(moeplan::flags::IntInRange(0, 64));
  app.add_option("--duration-s", cfg.duration_s, "Measured seconds")
      ->capture_default_str()
      ->check(moeplan::flags::FiniteInRange(0.1, 86400.0));
  app.add_option("--warmup-s", cfg.warmup_s, "Unmeasured seconds before the window")
      ->capture_default_str()
      ->check(moeplan::flags::FiniteInRange(0.0, 3600.0));
  app.add_option("--mode", cfg.mode,
                 "cached: one request repeated; uncached: every request differs; check: the "
                 "health service's empty Check, gRPC's own cost")
      ->capture_default_str()
      ->check(CLI::IsMember({"cached", "uncached", "check"}));
  app.add_option("--layer", cfg.layer_path, "LayerConfig JSON")
      ->capture_default_str()
      ->check(moeplan::flags::NonEmpty());
  app.add_option("--profile", cfg.profile, "Profile name")
      ->capture_default_str()
      ->check(moeplan::flags::NonEmpty());
  app.add_option("--server-pid", cfg.server_pid, "Report this process's RSS over the window")
      ->check(moeplan::flags::PositiveInt());
  app.add_flag("--json", cfg.json, "Print one JSON object instead of text");
  app.add_option("--deadline-ms", cfg.deadline_ms, "Per-call deadline")
      ->capture_default_str()
      ->check(moeplan::flags::IntInRange(1, 3600000));
  app.add_flag("--include-timeline", cfg.include_timeline, "Ask for candidates[].ops too");
  app.add_option("--uncached-offset", cfg.uncached_offset,
                 "uncached: start of the batch_size sequence (default random), so that "
                 "successive runs against one server do not revisit each other's entries")
      ->check(moeplan::flags::IntAtLeast(0));
  app.add_option("--rate", cfg.rate,
                 "Open loop: calls per second in all, sent on schedule with at most --clients "
                 "outstanding; latency from the scheduled time (0: closed loop)")
      ->capture_default_str()
      ->check(moeplan::flags::FiniteAtLeast(0.0));
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("moeplan-loadgen: error: {} (see --help)\n", e.what());
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // gRPC's absl::Mutex calls otherwise pay for deadlock-graph bookkeeping in this
  // build of absl (a few % of the generator's CPU); the generator is not the
  // thing under test.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  cfg.channels = std::min(cfg.channels, cfg.clients);
  if (cfg.threads == 0) cfg.threads = std::min(cfg.channels, 2);
  cfg.threads = std::min(cfg.threads, cfg.clients);
  const bool uncached = cfg.mode == "uncached";

  // The request.
  v1::PlanLayerRequest base;
  const std::string layer_path = ResolveLayerPath(cfg.layer_path);
  if (absl::Status s = moeplan::proto::ReadJsonFile(layer_path, base.mutable_layer()); !s.ok()) {
    fmt::print(stderr, "moeplan-loadgen: error: {}\n", std::string(s.message()));
    return 2;
  }
  base.set_profile_name(cfg.profile);
  base.set_include_timeline(cfg.include_timeline);
  BatchSequence seq;
  if (uncached) {
    seq = MakeBatchSequence(base.layer());
    if (cfg.uncached_offset < 0) {
      std::random_device rd;
      seq.offset =
          static_cast<int64_t>((uint64_t{rd()} << 32 | rd()) % static_cast<uint64_t>(seq.count));
    } else {
      seq.offset = cfg.uncached_offset % seq.count;
    }
    if (seq.count < 100000) {
      fmt::print(stderr,
                 "moeplan-loadgen: warning: only {} distinct batch sizes for this layer; a "
                 "server cache that large would turn repeats into hits\n",
                 seq.count);
    }
  }

  // Preflight: one blocking call (the largest batch of the sequence in uncached
  // mode) so a wrong address, profile or layer fails fast with its message.
  const int slots_total = cfg.clients;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < cfg.channels; ++i) channels.push_back(MakeChannel(cfg.server, i));
  for (auto& ch : channels) {
    if (!ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5))) {
      fmt::print(stderr, "moeplan-loadgen: error: cannot connect to {} within 5 s\n", cfg.server);
      return 2;
    }
  }
  size_t arena_bytes = 0;
  {
    auto stub = v1::Planner::NewStub(channels[0]);
    v1::PlanLayerRequest probe = base;
    if (uncached) probe.mutable_layer()->set_batch_size(static_cast<int32_t>(seq.step * seq.count));
    google::protobuf::Arena arena;
    auto* resp = google::protobuf::Arena::CreateMessage<v1::PlanLayerResponse>(&arena);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status s = stub->PlanLayer(&ctx, probe, resp);
    if (!s.ok()) {
      fmt::print(stderr, "moeplan-loadgen: error: preflight PlanLayer failed: {}: {}\n",
                 CodeName(static_cast<int>(s.error_code())), s.error_message());
      return 2;
    }
    // Room for twice the probe's parsed size in each slot's first arena block.
    arena_bytes = std::max<size_t>(16 << 10, (2 * arena.SpaceUsed() + 4095) / 4096 * 4096);
  }

  // Load.
  Window w;
  w.start = Clock::now();
  w.measure = w.start + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(cfg.warmup_s));
  w.end = w.measure + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(cfg.duration_s));
  std::atomic<uint64_t> seq_counter{0};
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::unique_ptr<v1::Planner::Stub>> stubs;
  std::vector<std::unique_ptr<grpc::GenericStub>> generic;
  for (auto& ch : channels) {
    stubs.push_back(v1::Planner::NewStub(ch));
    generic.push_back(std::make_unique<grpc::GenericStub>(ch));
  }
  for (int i = 0; i < cfg.threads; ++i) {
    workers.push_back(std::make_unique<Worker>(stubs, generic, i, cfg.threads, slots_total, base,
                                               arena_bytes, cfg, w, uncached ? &seq : nullptr,
                                               &seq_counter));
  }
  std::vector<std::thread> threads;
  const double rate_share = cfg.rate / static_cast<double>(workers.size());
  for (auto& wk : workers) threads.emplace_back([&wk, rate_share] { wk->Run(rate_share); });

  int64_t rss_start = -1, rss_end = -1;
  std::this_thread::sleep_until(w.measure);
  if (cfg.server_pid > 0) rss_start = ReadRssKiB(cfg.server_pid);
  std::this_thread::sleep_until(w.end);
  if (cfg.server_pid > 0) rss_end = ReadRssKiB(cfg.server_pid);
  for (auto& t : threads) t.join();

  // Report.
  Histogram lat;
  uint64_t ok = 0, completed_all = 0, cancelled = 0;
  std::array<uint64_t, kNumErrorKinds> err_m{}, err_all{};
  std::string first_error;
  for (auto& wk : workers) {
    const WorkerResult& r = wk->result();
    lat.Merge(r.latency);
    ok += r.ok_measured;
    completed_all += r.completed_all;
    cancelled += r.cancelled_at_stop;
    for (int c = 0; c < kNumErrorKinds; ++c) {
      err_m[c] += r.errors_measured[c];
      err_all[c] += r.errors_all[c];
    }
    if (first_error.empty()) first_error = r.first_error;
  }
  const uint64_t errors_measured = std::accumulate(err_m.begin(), err_m.end(), uint64_t{0});
  const uint64_t errors_all = std::accumulate(err_all.begin(), err_all.end(), uint64_t{0});
  const uint64_t requests = ok + errors_measured;
  const double throughput = static_cast<double>(ok) / cfg.duration_s;
  const auto us = [](uint64_t ns) { return static_cast<double>(ns) / 1000.0; };
  const double p50 = us(lat.Quantile(0.50)), p90 = us(lat.Quantile(0.90)),
               p99 = us(lat.Quantile(0.99)), p999 = us(lat.Quantile(0.999)), max = us(lat.max_ns()),
               mean = lat.mean_ns() / 1000.0;
  const bool have_rss = rss_start > 0 && rss_end > 0;
  const double rss_growth =
      have_rss ? 100.0 * static_cast<double>(rss_end - rss_start) / static_cast<double>(rss_start)
               : 0.0;

  if (cfg.json) {
    std::string codes;
    for (int c = 1; c < kNumErrorKinds; ++c) {
      if (err_all[c] == 0) continue;
      codes += fmt::format("{}\"{}\":{}", codes.empty() ? "" : ",", CodeName(c), err_all[c]);
    }
    std::string rss = "null";
    if (have_rss) {
      rss = fmt::format("{{\"start_kib\":{},\"end_kib\":{},\"growth_pct\":{:.2f}}}", rss_start,
                        rss_end, rss_growth);
    }
    std::string escaped;
    for (char ch : first_error) {
      if (ch == '"' || ch == '\\') escaped.push_back('\\');
      if (static_cast<unsigned char>(ch) >= 0x20) escaped.push_back(ch);
    }
    fmt::print(
        "{{\"server\":\"{}\",\"clients\":{},\"channels\":{},\"threads\":{},\"mode\":\"{}\","
        "\"duration_s\":{},"
        "\"warmup_s\":{},\"requests\":{},\"ok\":{},\"errors\":{},\"errors_total\":{},"
        "\"errors_by_code\":{{{}}},\"cancelled_at_stop\":{},\"completed_all\":{},"
        "\"ok_all\":{},\"preflight_calls\":1,\"throughput_rps\":{:.1f},"
        "\"latency_us\":{{\"mean\":{:.1f},\"p50\":{:.1f},\"p90\":{:.1f},\"p99\":{:.1f},"
        "\"p999\":{:.1f},\"max\":{:.1f}}},\"rss\":{},\"first_error\":\"{}\"}}\n",
        cfg.server, cfg.clients, cfg.channels, cfg.threads, cfg.mode, cfg.duration_s, cfg.warmup_s,
        requests, ok, errors_measured, errors_all, codes, cancelled, completed_all,
        completed_all - errors_all, throughput, mean, p50, p90, p99, p999, max, rss, escaped);
  } else {
    fmt::print("server      {}\n", cfg.server);
    fmt::print("clients     {} ({} channels, {} threads)\n", cfg.clients, cfg.channels,
               cfg.threads);
    fmt::print(
        "mode        {}{}\n", cfg.mode,
        cfg.rate > 0 ? fmt::format(", open loop at {:.0f} req/s", cfg.rate) : ", closed loop");
    fmt::print("window      {} s after {} s warmup\n", cfg.duration_s, cfg.warmup_s);
    fmt::print("requests    {} ({} ok)\n", requests, ok);
    fmt::print("errors      {} in window, {} in all\n", errors_measured, errors_all);
    for (int c = 1; c < kNumErrorKinds; ++c) {
      if (err_all[c] > 0) fmt::print("  {:<20} {}\n", CodeName(c), err_all[c]);
    }
    if (!first_error.empty()) fmt::print("  first: {}\n", first_error);
    fmt::print("throughput  {:.1f} req/s\n", throughput);
    fmt::print(
        "latency us  mean {:.1f}  p50 {:.1f}  p90 {:.1f}  p99 {:.1f}  p99.9 {:.1f}  max {:.1f}\n",
        mean, p50, p90, p99, p999, max);
    if (have_rss) {
      fmt::print("server rss  start {} KiB  end {} KiB  growth {:+.2f}%\n", rss_start, rss_end,
                 rss_growth);
    } else if (cfg.server_pid > 0) {
      fmt::print("server rss  unreadable (pid {})\n", cfg.server_pid);
    }
  }
  return errors_all > 0 || cancelled > 0 ? 1 : 0;
}
