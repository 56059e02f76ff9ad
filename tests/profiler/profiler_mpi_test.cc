// moeplan-profile's measurements on the real MPI backend, under mpirun -np 4
// (label "mpi"): every kind of point measures, is checked and correct, with
// consistent times; a communicator that corrupts one received element per rank
// is caught by the check (nccl-tests' style), so a broken collective can never
// be calibrated from.
#include <gtest/gtest.h>
#include <mpi.h>

#include <map>

#include "moeplan/executor/backends.h"
#include "moeplan/profiler/profiler.h"
#include "moeplan/profiler/sweep.h"

namespace moeplan::profiler {
namespace {

namespace ex = executor;

ex::Backend& TheBackend() {
  static ex::Backend b = *ex::MakeBackend("mpi");
  return b;
}

NodeLayout Layout() { return {1, TheBackend().world->size()}; }

MeasureOptions Fast() {
  MeasureOptions o;
  o.iters = 3;
  o.warmup = 1;
  o.point_budget_s = 0.05;
  o.kernel_min_rep_us = 100.0;
  return o;
}

TEST(ProfilerMpi, EveryPointKindMeasuresCorrectly) {
  SweepOptions so;
  so.min_bytes = 4 << 10;
  so.max_bytes = 16 << 10;
  so.size_step = 4;
  so.gemm_sizes = {16, 64};
  so.memory_tokens = {64};
  absl::StatusOr<Sweep> sweep = PlanSweep(Layout(), so);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  absl::StatusOr<std::unique_ptr<Profiler>> p =
      Profiler::Create(&TheBackend(), TheBackend().world.get(), Layout(), Fast());
  ASSERT_TRUE(p.ok()) << p.status();
  std::map<Point::Kind, int> kinds;
  int irregular = 0;
  for (const Point& pt : sweep->points) {
    absl::StatusOr<v1::ProfileSample> s = (*p)->Measure(pt);
    ASSERT_TRUE(s.ok()) << pt.Label() << ": " << s.status();
    ++kinds[pt.kind];
    EXPECT_EQ(s->wrong_elements(), 0) << pt.Label();
    EXPECT_GT(s->median_us(), 0.0) << pt.Label();
    EXPECT_LE(s->min_us(), s->median_us()) << pt.Label();
    EXPECT_LE(s->median_us(), s->max_us()) << pt.Label();
    EXPECT_GE(s->iters(), 3) << pt.Label();
    if (pt.kind == Point::Kind::kCollective || pt.kind == Point::Kind::kSaa ||
        pt.kind == Point::Kind::kGemm) {
      EXPECT_TRUE(s->checked()) << pt.Label();
    }
    if (pt.kind == Point::Kind::kMemory) {
      // The planner's byte counts: gelu reads z and writes a (2 x 64 x M x 4 B),
      // gelu_bwd reads z and da and writes dz (3 x).
      EXPECT_EQ(s->memory().kernel(), pt.kernel);
      const int64_t elems = 64 * pt.n * 4;
      if (pt.kernel == "gelu") {
        EXPECT_EQ(s->memory().bytes(), 2 * elems);
      }
      if (pt.kernel == "gelu_bwd") {
        EXPECT_EQ(s->memory().bytes(), 3 * elems);
      }
      EXPECT_GT(s->memory().bytes(), 0) << pt.Label();
    }
    if (pt.kind == Point::Kind::kCollective) {
      EXPECT_EQ(s->collective().bytes(), pt.bytes);
      EXPECT_GT(s->collective().busbw_gbytes_per_s(), 0.0);
      // Irregular AlltoAlls (every received element checked above) say so.
      EXPECT_EQ(s->collective().load_ratio(), pt.irregular ? pt.load : 0.0) << pt.Label();
      irregular += pt.irregular;
    }
  }
  // 4 ranks on one node: loads 1 and 2 on groups of 2 and 4, load 4 on the
  // group of 4; two sizes.
  EXPECT_EQ(irregular, 5 * 2);
  EXPECT_GT(kinds[Point::Kind::kCollective], 0);
  EXPECT_GT(kinds[Point::Kind::kSaa], 0);
  EXPECT_GT(kinds[Point::Kind::kGemm], 0);
  EXPECT_EQ(kinds[Point::Kind::kMemory], static_cast<int>(kMemoryKernels.size()));
}

// Delegates to the MPI communicator, then adds 1 to the first received
// element of every AllGather once it completes.
class Corrupting : public ex::Communicator {
 public:
  explicit Corrupting(std::unique_ptr<ex::Communicator> inner) : inner_(std::move(inner)) {}
  std::string_view backend() const override { return inner_->backend(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  ex::LaneId lane() const override { return inner_->lane(); }
  absl::StatusOr<ex::Request> StartAllGather(const void* send, void* recv, size_t count,
                                             ex::DType t, size_t stride) override {
    absl::StatusOr<ex::Request> r = inner_->StartAllGather(send, recv, count, t, stride);
    if (r.ok()) victims_[r->slot] = static_cast<float*>(recv);
    return r;
  }
  absl::StatusOr<ex::Request> StartReduceScatter(const void* send, void* recv, size_t n,
                                                 ex::DType t, size_t stride) override {
    return inner_->StartReduceScatter(send, recv, n, t, stride);
  }
  absl::StatusOr<ex::Request> StartAllReduce(const void* send, void* recv, size_t n,
                                             ex::DType t) override {
    return inner_->StartAllReduce(send, recv, n, t);
  }
  absl::StatusOr<ex::Request> StartAlltoAll(const void* send, void* recv, size_t n,
                                            ex::DType t) override {
    return inner_->StartAlltoAll(send, recv, n, t);
  }
  absl::StatusOr<ex::Request> StartAlltoAllv(const void* send, const size_t* sn, const size_t* so,
                                             void* recv, const size_t* rn, const size_t* ro,
                                             ex::DType t) override {
    return inner_->StartAlltoAllv(send, sn, so, recv, rn, ro, t);
  }
  absl::Status ExchangeCounts(absl::Span<const int64_t> send, absl::Span<int64_t> recv) override {
    return inner_->ExchangeCounts(send, recv);
  }
  absl::StatusOr<ex::Request> StartSendRecv(const void* send, size_t sn, int dst, void* recv,
                                            size_t rn, int src, ex::DType t) override {
    return inner_->StartSendRecv(send, sn, dst, recv, rn, src, t);
  }
  absl::Status Wait(ex::Request* r) override {
    const int slot = r->slot;
    absl::Status s = inner_->Wait(r);
    if (auto it = victims_.find(slot); it != victims_.end()) {
      *it->second += 1.0f;
      victims_.erase(it);
    }
    return s;
  }
  absl::StatusOr<std::unique_ptr<ex::Communicator>> Split(int color, int key) override {
    absl::StatusOr<std::unique_ptr<ex::Communicator>> c = inner_->Split(color, key);
    if (!c.ok()) return c.status();
    return std::unique_ptr<ex::Communicator>(new Corrupting(*std::move(c)));
  }
  absl::Status Barrier() override { return inner_->Barrier(); }

 private:
  std::unique_ptr<ex::Communicator> inner_;
  std::map<int, float*> victims_;
};

TEST(ProfilerMpi, ABrokenCollectiveIsCaught) {
  absl::StatusOr<std::unique_ptr<ex::Communicator>> dup = TheBackend().world->Split(0, 0);
  ASSERT_TRUE(dup.ok()) << dup.status();
  Corrupting world(*std::move(dup));
  absl::StatusOr<std::unique_ptr<Profiler>> p =
      Profiler::Create(&TheBackend(), &world, Layout(), Fast());
  ASSERT_TRUE(p.ok()) << p.status();
  Point pt;
  pt.kind = Point::Kind::kCollective;
  pt.collective = Collective::kAllGather;
  pt.shape = {2, 1};
  pt.bytes = 4096;
  absl::StatusOr<v1::ProfileSample> s = (*p)->Measure(pt);
  ASSERT_TRUE(s.ok()) << s.status();
  // One wrong element on each of the world's ranks.
  EXPECT_EQ(s->wrong_elements(), world.size());
  // The same point on the honest communicator is clean.
  absl::StatusOr<std::unique_ptr<Profiler>> honest =
      Profiler::Create(&TheBackend(), TheBackend().world.get(), Layout(), Fast());
  ASSERT_TRUE(honest.ok());
  absl::StatusOr<v1::ProfileSample> ok = (*honest)->Measure(pt);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->wrong_elements(), 0);
}

}  // namespace
}  // namespace moeplan::profiler

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    ::testing::TestEventListeners& l = ::testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  moeplan::profiler::TheBackend().world.reset();
  MPI_Finalize();
  return rc;
}
