// A bounded LRU cache of plan responses, keyed by the canonical bytes of a
// normalised request and the profile's name and version (see PlanCacheKey), so
// a new profile version never hits an old plan. Bounded in entries and in
// bytes: the least recently used go first, and a response larger than the
// whole byte budget is not kept.
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

  // The serialised response, or null.
  Value Get(const std::string& key);
  // Parses a hit into `response`; false on a miss (or bytes that do not parse
  // as `response`'s type, which a key's method prefix rules out).
  bool GetInto(const std::string& key, google::protobuf::Message* response);
  void Put(const std::string& key, Value value);
  // Serialises `response` (deterministically) and puts it.
  void Put(const std::string& key, const google::protobuf::Message& response);

  // What one entry counts against the byte bound: its key, its bytes, and the
  // list node and index slot that hold them.
  static size_t EntryBytes(size_t key_bytes, size_t value_bytes);
  // Drops every entry of a profile (after a new version is put).
  size_t EraseProfile(std::string_view profile_name);

  size_t size() const;
  size_t bytes() const;  // the sum of EntryBytes over the entries held
  size_t capacity() const { return capacity_; }
  size_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t hits() const;
  uint64_t misses() const;

 private:
  struct Entry {
    std::string key;
    Value value;
    size_t bytes = 0;
  };
  void EvictLocked();
  const size_t capacity_;
  const size_t capacity_bytes_;
  size_t bytes_ = 0;
  mutable std::mutex mu_;
  std::list<Entry> lru_;                                                     // most recent first
  absl::flat_hash_map<std::string_view, std::list<Entry>::iterator> index_;  // views into lru_ keys
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace moeplan::server
