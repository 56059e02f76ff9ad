#include "moeplan/server/plan_cache.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <iterator>

#include "moeplan/base/strings.h"

namespace moeplan::server {

std::string PlanCacheKey(std::string_view profile_name, uint32_t profile_version,
                         std::string_view request_bytes) {
  std::string key;
  key.reserve(profile_name.size() + request_bytes.size() + 16);
  key.append(profile_name);
  key.push_back('\0');
  key.append(std::to_string(profile_version));
  key.push_back('\0');
  key.append(request_bytes);
  return key;
}

PlanCache::Value PlanCache::Get(const std::string& key, bool count) {
  if (capacity_ == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(std::string_view(key));
  if (it == index_.end()) {
    if (count) ++misses_;
    return nullptr;
  }
  if (count) ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->value;
}

PlanCache::Value PlanCache::GetRaw(std::string_view raw_key, std::string* profile, bool count) {
  if (capacity_ == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = raw_index_.find(raw_key);
  if (it == raw_index_.end()) return nullptr;  // the canonical level counts the miss
  if (count) {
    ++hits_;
    ++raw_hits_;
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  if (profile != nullptr) *profile = it->second->profile;
  return it->second->value;
}

size_t PlanCache::EntryBytes(size_t key_bytes, size_t value_bytes) {
  // The list node (an Entry and two links), the index slot, the shared
  // string's control block; small next to any response, but counted.
  constexpr size_t kBookkeeping = sizeof(Entry) + 2 * sizeof(void*) +
                                  sizeof(std::string_view) + sizeof(void*) + 64;
  return key_bytes + value_bytes + kBookkeeping;
}

bool PlanCache::GetInto(const std::string& key, google::protobuf::Message* response) {
  const Value hit = Get(key);
  if (hit == nullptr) return false;
  if (response->ParseFromString(*hit)) return true;
  response->Clear();
  return false;
}

PlanCache::Value SerializeDeterministic(const google::protobuf::Message& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    if (!message.SerializeToCodedStream(&coded)) return nullptr;
  }
  bytes.shrink_to_fit();  // hold what is counted, not the growth slack
  return std::make_shared<const std::string>(std::move(bytes));
}

void PlanCache::Put(const std::string& key, const google::protobuf::Message& response) {
  if (capacity_ == 0 || capacity_bytes_ == 0) return;
  Put(key, SerializeDeterministic(response));
}

void PlanCache::Put(const std::string& key, Value value) {
  if (capacity_ == 0 || capacity_bytes_ == 0 || value == nullptr) return;
  // PlanCacheKey starts with the profile's name.
  const std::string_view profile = std::string_view(key).substr(0, key.find('\0'));
  std::lock_guard<std::mutex> lock(mu_);
  InsertLocked(Entry{key, std::string(profile), std::move(value), 0, false});
}

void PlanCache::PutRaw(std::string_view raw_key, Value value, std::string_view profile,
                       uint64_t generation) {
  if (capacity_ == 0 || capacity_bytes_ == 0 || value == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (generation != generation_) return;  // planned before a profile changed
  InsertLocked(Entry{std::string(raw_key), std::string(profile), std::move(value), 0, true});
}

void PlanCache::InsertLocked(Entry entry) {
  Index& index = IndexOf(entry);
  if (auto it = index.find(std::string_view(entry.key)); it != index.end()) EraseLocked(it->second);
  // The profile's name is held too; a raw entry's value is often a canonical
  // entry's as well, and is counted at both (the bound stays an upper bound).
  entry.bytes = EntryBytes(entry.key.size() + entry.profile.size(), entry.value->size());
  if (entry.bytes > capacity_bytes_) return;  // would evict everything and still not fit
  bytes_ += entry.bytes;
  lru_.push_front(std::move(entry));
  index.emplace(std::string_view(lru_.front().key), lru_.begin());
  EvictLocked();
}

void PlanCache::EraseLocked(std::list<Entry>::iterator node) {
  IndexOf(*node).erase(std::string_view(node->key));
  bytes_ -= node->bytes;
  lru_.erase(node);
}

void PlanCache::EvictLocked() {
  while (lru_.size() > capacity_ || bytes_ > capacity_bytes_) {
    EraseLocked(std::prev(lru_.end()));
    ++evictions_;
  }
}

size_t PlanCache::EraseProfile(std::string_view profile_name) {
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  size_t erased = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    const auto next = std::next(it);
    if (it->profile == profile_name) {
      EraseLocked(it);
      ++erased;
    }
    it = next;
  }
  return erased;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}
size_t PlanCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}
uint64_t PlanCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}
uint64_t PlanCache::raw_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return raw_hits_;
}
uint64_t PlanCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}
uint64_t PlanCache::evictions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return evictions_;
}
PlanCache::Stats PlanCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Stats{lru_.size(), bytes_, hits_, raw_hits_, misses_, evictions_};
}
uint64_t PlanCache::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

}  // namespace moeplan::server
