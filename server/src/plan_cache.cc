#include "moeplan/server/plan_cache.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

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

PlanCache::Value PlanCache::Get(const std::string& key) {
  if (capacity_ == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(std::string_view(key));
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
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

void PlanCache::Put(const std::string& key, const google::protobuf::Message& response) {
  if (capacity_ == 0 || capacity_bytes_ == 0) return;
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    if (!response.SerializeToCodedStream(&coded)) return;
  }
  bytes.shrink_to_fit();  // hold what is counted, not the growth slack
  Put(key, std::make_shared<const std::string>(std::move(bytes)));
}

void PlanCache::Put(const std::string& key, Value value) {
  if (capacity_ == 0 || capacity_bytes_ == 0 || value == nullptr) return;
  const size_t bytes = EntryBytes(key.size(), value->size());
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(std::string_view(key)); it != index_.end()) {
    const auto node = it->second;
    index_.erase(it);
    bytes_ -= node->bytes;
    lru_.erase(node);
  }
  if (bytes > capacity_bytes_) return;  // would evict everything and still not fit
  lru_.push_front(Entry{key, std::move(value), bytes});
  index_.emplace(std::string_view(lru_.front().key), lru_.begin());
  bytes_ += bytes;
  EvictLocked();
}

void PlanCache::EvictLocked() {
  while (lru_.size() > capacity_ || bytes_ > capacity_bytes_) {
    bytes_ -= lru_.back().bytes;
    index_.erase(std::string_view(lru_.back().key));
    lru_.pop_back();
  }
}

size_t PlanCache::EraseProfile(std::string_view profile_name) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t erased = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    const std::string& k = it->key;
    if (k.size() > profile_name.size() && k.compare(0, profile_name.size(), profile_name) == 0 &&
        k[profile_name.size()] == '\0') {
      index_.erase(std::string_view(k));
      bytes_ -= it->bytes;
      it = lru_.erase(it);
      ++erased;
    } else {
      ++it;
    }
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
uint64_t PlanCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

}  // namespace moeplan::server
