// A bounded LRU cache of plan responses, at two levels:
//
// - canonical keys: the bytes of a normalised request and the profile's name
//   and version (see PlanCacheKey), so equivalent requests share an entry and a
//   new profile version never hits an old plan;
// - raw keys (GetRaw / PutRaw): the request's bytes exactly as they came off
//   the wire, so that a repeated request is answered without parsing it. A raw
//   entry names its profile; EraseProfile drops it with the canonical ones, and
//   PutRaw refuses an entry planned before an EraseProfile (generation()).
//
// Both levels share one LRU order and one bound in entries and in bytes: the
// least recently used go first, and a response larger than the whole byte
// budget is not kept.
//
// Responses are held serialised, so the byte bound is what the cache really
// holds (EntryBytes: key, bytes and the entry's bookkeeping). A parsed
// response with a timeline takes about five times its serialised size in
// memory; counting serialised sizes while holding parsed messages let a
// 256 MiB cache hold over 1 GiB. Thread-safe; values are shared and
// immutable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include <google/protobuf/message.h>

namespace moeplan::server {

// "<profile name>\0<version>\0<bytes>": `request_bytes` is the deterministic
// serialisation of the normalised request (defaults filled in, schedules made
// explicit), or of the inline profile too when the request carries one.
std::string PlanCacheKey(std::string_view profile_name, uint32_t profile_version,
                         std::string_view request_bytes);

class PlanCache {
 public:
  // The serialised PlanLayerResponse or PlanModelResponse; keys say which
  // (the server prefixes the request bytes with the method).
  using Value = std::shared_ptr<const std::string>;

  static constexpr size_t kDefaultCapacityBytes = size_t{256} << 20;
  // capacity 0 (entries or bytes) disables caching.
  explicit PlanCache(size_t capacity, size_t capacity_bytes = kDefaultCapacityBytes)
      : capacity_(capacity), capacity_bytes_(capacity_bytes) {}

  // The serialised response, or null; `count` false: the lookup is not
  // counted as a hit or a miss (a call's second look).
  Value Get(const std::string& key, bool count = true);
  // Parses a hit into `response`; false on a miss (or bytes that do not parse
  // as `response`'s type, which a key's method prefix rules out).
  bool GetInto(const std::string& key, google::protobuf::Message* response);
  void Put(const std::string& key, Value value);
  // Serialises `response` (deterministically) and puts it.
  void Put(const std::string& key, const google::protobuf::Message& response);

  // What one entry counts against the byte bound: its key, its bytes, and the
  // list node and index slot that hold them.
  static size_t EntryBytes(size_t key_bytes, size_t value_bytes);
  // The first level: the response cached for these raw request bytes (with
  // the method's tag the caller puts in front), or null. `profile`, when given,
  // receives the name of the profile the entry was planned with.
  Value GetRaw(std::string_view raw_key, std::string* profile = nullptr, bool count = true);
  // Keeps `value` under a raw key, labelled with its profile, unless an
  // EraseProfile ran since `generation` was read (the plan may be of an old
  // version, and a raw key, unlike a canonical one, does not name it).
  void PutRaw(std::string_view raw_key, Value value, std::string_view profile, uint64_t generation);
  // Bumped by every EraseProfile: read it before resolving the profile.
  uint64_t generation() const;

  // Drops every entry of a profile (after a new version is put), at both
  // levels, and bumps generation().
  size_t EraseProfile(std::string_view profile_name);

  size_t size() const;
  size_t bytes() const;  // the sum of EntryBytes over the entries held
  size_t capacity() const { return capacity_; }
  size_t capacity_bytes() const { return capacity_bytes_; }
  // Hits at either level; misses of the canonical level (a request that
  // misses both counts once); entries dropped to stay within the bounds.
  uint64_t hits() const;
  uint64_t raw_hits() const;  // of hits(), those found by the request's raw bytes
  uint64_t misses() const;
  uint64_t evictions() const;
  // All of the above at one instant (under one lock): what a scrape reads,
  // so that a counter derived from two of them never goes down.
  struct Stats {
    size_t entries = 0, bytes = 0;
    uint64_t hits = 0, raw_hits = 0, misses = 0, evictions = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    std::string key;
    std::string profile;  // the profile it was planned with
    Value value;
    size_t bytes = 0;
    bool raw = false;  // in raw_index_, not index_
  };
  using Index = absl::flat_hash_map<std::string_view, std::list<Entry>::iterator>;
  Index& IndexOf(const Entry& e) { return e.raw ? raw_index_ : index_; }
  void InsertLocked(Entry entry);
  void EraseLocked(std::list<Entry>::iterator node);
  void EvictLocked();
  const size_t capacity_;
  const size_t capacity_bytes_;
  size_t bytes_ = 0;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recent first
  Index index_;           // canonical keys: views into lru_'s keys
  Index raw_index_;       // raw keys, likewise
  uint64_t hits_ = 0, raw_hits_ = 0, misses_ = 0, evictions_ = 0, generation_ = 0;
};

// `message` serialised deterministically (map entries in key order), in a
// string of exactly its size; null if it does not serialise.
PlanCache::Value SerializeDeterministic(const google::protobuf::Message& message);

}  // namespace moeplan::server
