// PlanCache: LRU order, the entry and byte bounds, capacity 0, and profile
// invalidation (docs/service.md "Plan cache").
#include "moeplan/server/plan_cache.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <memory>
#include <string>

#include "moeplan/v1/layer.pb.h"
#include "moeplan/v1/service.pb.h"

namespace moeplan::server {
namespace {

// A response of about `bytes` serialised bytes (its name field).
v1::LayerConfig Response(size_t bytes, char fill = 'x') {
  v1::LayerConfig m;
  m.set_name(std::string(bytes, fill));
  return m;
}

// What an entry of `Response(bytes)` under `key` counts.
size_t Counted(const std::string& key, size_t bytes) {
  // The key, and the profile's name (the key's first part), held apart.
  return PlanCache::EntryBytes(key.size() + key.find('\0'), Response(bytes).ByteSizeLong());
}

std::string Key(std::string_view profile, uint32_t version, std::string_view request) {
  return PlanCacheKey(profile, version, request);
}

TEST(PlanCache, EvictsTheLeastRecentlyUsed) {
  PlanCache cache(2);
  cache.Put(Key("p", 1, "a"), Response(10, 'a'));
  cache.Put(Key("p", 1, "b"), Response(10, 'b'));
  ASSERT_NE(cache.Get(Key("p", 1, "a")), nullptr);  // a is now the most recent
  cache.Put(Key("p", 1, "c"), Response(10, 'c'));   // evicts b
  EXPECT_NE(cache.Get(Key("p", 1, "a")), nullptr);
  EXPECT_EQ(cache.Get(Key("p", 1, "b")), nullptr);
  EXPECT_NE(cache.Get(Key("p", 1, "c")), nullptr);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.hits(), 3u);
  EXPECT_EQ(cache.misses(), 1u);
}

TEST(PlanCache, PutOfAKnownKeyReplacesItsValueAndRefreshesIt) {
  PlanCache cache(2);
  cache.Put(Key("p", 1, "a"), Response(10, 'a'));
  cache.Put(Key("p", 1, "b"), Response(10, 'b'));
  cache.Put(Key("p", 1, "a"), Response(20, 'z'));  // a most recent again
  cache.Put(Key("p", 1, "c"), Response(10, 'c'));  // evicts b
  v1::LayerConfig a;
  ASSERT_TRUE(cache.GetInto(Key("p", 1, "a"), &a));
  EXPECT_EQ(a.name(), std::string(20, 'z'));
  EXPECT_EQ(cache.Get(Key("p", 1, "b")), nullptr);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(PlanCache, CapacityZeroKeepsNothing) {
  for (PlanCache* cache : {new PlanCache(0), new PlanCache(10, 0)}) {
    std::unique_ptr<PlanCache> owned(cache);
    cache->Put(Key("p", 1, "a"), Response(10));
    EXPECT_EQ(cache->Get(Key("p", 1, "a")), nullptr);
    EXPECT_EQ(cache->size(), 0u);
    EXPECT_EQ(cache->bytes(), 0u);
  }
}

TEST(PlanCache, BoundedInBytes) {
  const std::string k1 = Key("p", 1, "a"), k2 = Key("p", 1, "b"), k3 = Key("p", 1, "c");
  const size_t one = Counted(k1, 1000);
  PlanCache cache(100, 2 * one + one / 2);  // room for two responses, not three
  cache.Put(k1, Response(1000));
  cache.Put(k2, Response(1000));
  EXPECT_EQ(cache.bytes(), 2 * one);
  cache.Put(k3, Response(1000));  // evicts k1, the least recent
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.bytes(), 2 * one);
  EXPECT_EQ(cache.Get(k1), nullptr);
  EXPECT_NE(cache.Get(k2), nullptr);
  // A response larger than the whole budget is not kept, and evicts nothing.
  cache.Put(Key("p", 1, "huge"), Response(10 * one));
  EXPECT_EQ(cache.Get(Key("p", 1, "huge")), nullptr);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.bytes(), 2 * one);
}

TEST(PlanCache, ANewProfileVersionNeverHitsAndEraseProfileDropsOnlyThatProfile) {
  PlanCache cache(10);
  cache.Put(Key("p", 1, "a"), Response(10));
  cache.Put(Key("p", 1, "b"), Response(10));
  cache.Put(Key("p2", 1, "a"), Response(10));  // a name that starts like "p"
  cache.Put(Key("q", 1, "a"), Response(10));
  EXPECT_EQ(cache.Get(Key("p", 2, "a")), nullptr);  // version 2: a different key
  EXPECT_EQ(cache.EraseProfile("p"), 2u);
  EXPECT_EQ(cache.Get(Key("p", 1, "a")), nullptr);
  EXPECT_NE(cache.Get(Key("p2", 1, "a")), nullptr);
  EXPECT_NE(cache.Get(Key("q", 1, "a")), nullptr);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.bytes(), Counted(Key("p2", 1, "a"), 10) + Counted(Key("q", 1, "a"), 10));
}

// The first level: raw request bytes. Its entries share the LRU order and the
// bounds, go with their profile, and are never confused with canonical keys.
TEST(PlanCache, RawEntriesGoWithTheirProfileAndRefuseAStaleGeneration) {
  PlanCache cache(3);
  const PlanCache::Value a = std::make_shared<const std::string>("response a");
  const uint64_t g0 = cache.generation();
  cache.PutRaw("L raw-a", a, "p", g0);
  cache.PutRaw("L raw-b", a, "q", g0);
  std::string profile;
  ASSERT_EQ(cache.GetRaw("L raw-a", &profile), a);  // the same bytes, not a copy
  EXPECT_EQ(profile, "p");
  EXPECT_EQ(cache.Get("L raw-a"), nullptr);  // raw keys are not canonical ones
  EXPECT_EQ(cache.GetRaw(Key("p", 1, "x")), nullptr);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 1u);  // only the canonical level counts misses

  // A profile changes: its raw entries go, and a plan begun before the change
  // (holding the old generation) is not kept under a raw key.
  cache.Put(Key("p", 1, "x"), Response(10));
  EXPECT_EQ(cache.EraseProfile("p"), 2u);
  EXPECT_EQ(cache.GetRaw("L raw-a"), nullptr);
  EXPECT_NE(cache.GetRaw("L raw-b"), nullptr);
  EXPECT_GT(cache.generation(), g0);
  cache.PutRaw("L raw-a", a, "p", g0);
  EXPECT_EQ(cache.GetRaw("L raw-a"), nullptr);
  cache.PutRaw("L raw-a", a, "p", cache.generation());
  EXPECT_EQ(cache.GetRaw("L raw-a"), a);

  // Both levels count against the one bound: the least recent goes.
  cache.Put(Key("q", 1, "y"), Response(10));
  cache.Put(Key("q", 1, "z"), Response(10));  // four entries: evicts raw-b
  EXPECT_EQ(cache.GetRaw("L raw-b"), nullptr);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.evictions(), 1u);
}

// The byte bound is what the cache holds. A response of many small messages
// (a timeline) takes several times its serialised size when parsed; the cache
// used to count the serialised size and hold the parsed copy, so a 256 MiB
// cache grew the server past 1 GiB.
TEST(PlanCache, HoldsNoMoreMemoryThanItCounts) {
  const struct mallinfo2 probe = mallinfo2();
  if (probe.uordblks == 0 && probe.hblkhd == 0) {
    GTEST_SKIP() << "this allocator reports no mallinfo2 (a sanitizer's?)";
  }
  // Any message of many small ones will do; this one is a timeline's shape.
  v1::ReportMeasurementRequest response;
  for (int i = 0; i < 20000; ++i) {
    v1::MeasuredOp* op = response.add_ops();
    op->set_name("op");
    op->set_duration_us(i);
  }
  PlanCache cache(10, size_t{64} << 20);
  const std::string key = Key("p", 1, "big");
  const auto held = [] {
    const struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
  };
  const size_t before = held();
  cache.Put(key, response);
  const size_t after = held();
  ASSERT_EQ(cache.size(), 1u);
  // Up to the allocator's rounding: a block of 128 KiB or more is mapped in
  // whole 4 KiB pages, and small blocks carry a header each.
  EXPECT_LE(after - before, cache.bytes() + 8192)
      << "the cache holds " << after - before << " bytes but counts " << cache.bytes();
  v1::ReportMeasurementRequest back;
  ASSERT_TRUE(cache.GetInto(key, &back));
  EXPECT_EQ(back.SerializeAsString(), response.SerializeAsString());
}

}  // namespace
}  // namespace moeplan::server
