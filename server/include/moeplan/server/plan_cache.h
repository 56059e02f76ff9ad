// A bounded LRU cache of plan responses, keyed by the canonical bytes of a
// normalised request and the profile's name and version (see PlanCacheKey), so
// a new profile version never hits an old plan. Bounded in entries and in
// bytes (keys plus the responses' serialised sizes): the least recently used
// go first, and a response larger than the whole byte budget is not kept.
// Thread-safe; values are shared immutable responses.
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
  // A PlanLayerResponse or a PlanModelResponse; keys say which (the server
  // prefixes the request bytes with the method).
  using Value = std::shared_ptr<const google::protobuf::Message>;

  static constexpr size_t kDefaultCapacityBytes = size_t{256} << 20;
  // capacity 0 (entries or bytes) disables caching.
  explicit PlanCache(size_t capacity, size_t capacity_bytes = kDefaultCapacityBytes)
      : capacity_(capacity), capacity_bytes_(capacity_bytes) {}

  Value Get(const std::string& key);
  void Put(const std::string& key, Value value);
  // Drops every entry of a profile (after a new version is put).
  size_t EraseProfile(std::string_view profile_name);

  size_t size() const;
  size_t bytes() const;  // keys plus serialised responses held
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
