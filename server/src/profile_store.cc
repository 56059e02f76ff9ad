#include "moeplan/server/profile_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <filesystem>
#include <system_error>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/proto/convert.h"
#include "moeplan/proto/json.h"

namespace moeplan::server {
namespace {

constexpr std::string_view kMagic = "moeplan-profile 1 ";
constexpr std::string_view kProfileSuffix = ".profile";
constexpr std::string_view kMeasurementSuffix = ".jsonl";

uint32_t Crc32(std::string_view data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths; feed in chunks.
  while (!data.empty()) {
    const uInt n = static_cast<uInt>(std::min<size_t>(data.size(), 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data()), n);
    data.remove_prefix(n);
  }
  return static_cast<uint32_t>(crc);
}

absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(Cat(path, ": exists and is not a directory"));
  }
  return absl::PermissionDeniedError(Cat(path, ": cannot create: ", std::strerror(errno)));
}

std::vector<std::string> ListDir(const std::string& dir, std::string_view suffix) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > suffix.size() && name[0] != '.' &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        out.push_back(name);
      }
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Counts complete lines; a torn last line (a crash mid-append) is cut off so that
// the next append starts on a line of its own.
absl::StatusOr<uint64_t> CountAndRepairLines(const std::string& path, std::string* repaired) {
  absl::StatusOr<std::string> text = proto::ReadFile(path);
  if (!text.ok()) return text.status();
  const uint64_t lines = std::count(text->begin(), text->end(), '\n');
  const size_t keep = text->rfind('\n') == std::string::npos ? 0 : text->rfind('\n') + 1;
  if (keep != text->size()) {
    if (::truncate(path.c_str(), static_cast<off_t>(keep)) != 0) {
      return absl::InternalError(
          Cat(path, ": cannot truncate a torn last line: ", std::strerror(errno)));
    }
    *repaired = Cat(path, ": dropped a torn last line of ", text->size() - keep, " bytes");
  }
  return lines;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ProfileEntry>> MakeProfileEntry(v1::ClusterProfile message,
                                                                     bool builtin) {
  absl::StatusOr<planner::ClusterProfile> profile = proto::ProfileFromProto(message);
  if (!profile.ok()) return profile.status();
  absl::StatusOr<planner::CostModel> cost = planner::CostModel::Create(*profile);
  if (!cost.ok()) return cost.status();
  auto entry = std::make_shared<ProfileEntry>(
      ProfileEntry{std::move(message), *std::move(profile), *std::move(cost), builtin});
  return std::shared_ptr<const ProfileEntry>(std::move(entry));
}

std::string EncodeProfileFile(std::string_view json) {
  return fmt::format("{}crc32={:08x} bytes={}\n{}", kMagic, Crc32(json), json.size(), json);
}

absl::StatusOr<std::string> DecodeProfileFile(std::string_view contents) {
  const size_t eol = contents.find('\n');
  if (contents.substr(0, kMagic.size()) != kMagic || eol == std::string_view::npos) {
    return absl::DataLossError("not a moeplan profile file (bad header line)");
  }
  unsigned crc = 0;
  unsigned long long bytes = 0;
  const std::string header(contents.substr(kMagic.size(), eol - kMagic.size()));
  if (std::sscanf(header.c_str(), "crc32=%8x bytes=%llu", &crc, &bytes) != 2) {
    return absl::DataLossError(Cat("bad header fields '", header, "'"));
  }
  const std::string_view body = contents.substr(eol + 1);
  if (body.size() != bytes) {
    return absl::DataLossError(
        Cat("truncated or extended: header says ", bytes, " bytes, file has ", body.size()));
  }
  if (const uint32_t actual = Crc32(body); actual != crc) {
    return absl::DataLossError(
        fmt::format("checksum mismatch: header crc32={:08x}, contents crc32={:08x}", crc, actual));
  }
  return std::string(body);
}

ProfileStore::ProfileStore(std::string data_dir) : data_dir_(std::move(data_dir)) {}

std::string ProfileStore::ProfilePath(std::string_view name) const {
  return Cat(data_dir_, "/profiles/", name, kProfileSuffix);
}
std::string ProfileStore::MeasurementPath(std::string_view name) const {
  return Cat(data_dir_, "/measurements/", name, kMeasurementSuffix);
}

absl::StatusOr<std::unique_ptr<ProfileStore>> ProfileStore::Open(const std::string& data_dir,
                                                                 OpenReport* report) {
  if (data_dir.empty()) return absl::InvalidArgumentError("--data-dir: must not be empty");
  for (const std::string& d : {data_dir, data_dir + "/profiles", data_dir + "/measurements"}) {
    MOEPLAN_RETURN_IF_ERROR(MakeDir(d));
  }
  std::unique_ptr<ProfileStore> store(new ProfileStore(data_dir));
  for (const std::string& name : calibration::BuiltinProfileNames()) {
    absl::StatusOr<v1::ClusterProfile> msg = calibration::BuiltinProfile(name);
    if (!msg.ok()) return msg.status();
    absl::StatusOr<std::shared_ptr<const ProfileEntry>> e = MakeProfileEntry(*msg, true);
    if (!e.ok()) return e.status();
    store->profiles_[name] = *e;
  }
  // A crash between mkstemp and rename leaves "<name>.profile.tmp.XXXXXX": never
  // acknowledged, so removed.
  if (DIR* d = ::opendir((data_dir + "/profiles").c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.find(".profile.tmp.") != std::string::npos) {
        const std::string path = Cat(data_dir, "/profiles/", name);
        ::unlink(path.c_str());
        report->skipped.push_back(Cat(path,
                                      ": unacknowledged temporary file of an interrupted "
                                      "write; removed"));
      }
    }
    ::closedir(d);
  }
  for (const std::string& file : ListDir(data_dir + "/profiles", kProfileSuffix)) {
    const std::string path = Cat(data_dir, "/profiles/", file);
    const std::string name = file.substr(0, file.size() - kProfileSuffix.size());
    absl::StatusOr<std::string> contents = proto::ReadFile(path);
    absl::StatusOr<std::string> json = contents.ok()
                                           ? DecodeProfileFile(*contents)
                                           : absl::StatusOr<std::string>(contents.status());
    v1::ClusterProfile msg;
    absl::Status s = json.ok() ? proto::ParseJson(*json, &msg) : json.status();
    absl::StatusOr<std::shared_ptr<const ProfileEntry>> entry =
        s.ok() ? MakeProfileEntry(msg, false)
               : absl::StatusOr<std::shared_ptr<const ProfileEntry>>(s);
    if (entry.ok() && (*entry)->message.name() != name) {
      entry = absl::DataLossError(Cat("holds profile '", (*entry)->message.name(), "'"));
    }
    if (entry.ok() && store->profiles_.count(name)) {
      entry = absl::FailedPreconditionError("shadows a built-in profile");
    }
    if (!entry.ok()) {
      report->skipped.push_back(Cat(path, ": ", View(entry.status().message()), "; skipped"));
      continue;
    }
    store->profiles_[name] = *std::move(entry);
    report->loaded.push_back(name);
  }
  for (const std::string& file : ListDir(data_dir + "/measurements", kMeasurementSuffix)) {
    const std::string path = Cat(data_dir, "/measurements/", file);
    std::string repaired;
    absl::StatusOr<uint64_t> n = CountAndRepairLines(path, &repaired);
    if (!n.ok()) return n.status();
    if (!repaired.empty()) report->skipped.push_back(repaired);
    store->measurement_counts_[file.substr(0, file.size() - kMeasurementSuffix.size())] = *n;
  }
  return store;
}

std::shared_ptr<const ProfileEntry> ProfileStore::Get(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = profiles_.find(name);
  return it == profiles_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const ProfileEntry>> ProfileStore::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<const ProfileEntry>> out;
  out.reserve(profiles_.size());
  for (const auto& [name, e] : profiles_) out.push_back(e);
  return out;
}

std::vector<std::string> ProfileStore::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, e] : profiles_) out.push_back(name);
  return out;
}

absl::StatusOr<std::shared_ptr<const ProfileEntry>> ProfileStore::Put(
    const v1::ClusterProfile& profile) {
  absl::StatusOr<std::shared_ptr<const ProfileEntry>> entry = MakeProfileEntry(profile, false);
  if (!entry.ok()) return entry.status();
  if (profile.version() < 1) {
    return absl::InvalidArgumentError(Cat("version: must be >= 1 (got ", profile.version(), ")"));
  }
  const std::string& name = profile.name();
  std::lock_guard<std::mutex> write_lock(write_mu_);
  if (std::shared_ptr<const ProfileEntry> old = Get(name)) {
    if (old->builtin) {
      return absl::FailedPreconditionError(
          Cat("name: '", name, "' is a built-in profile and read-only; put it under another name"));
    }
    if (profile.version() == old->message.version() &&
        profile.SerializeAsString() == old->message.SerializeAsString()) {
      return old;  // an idempotent retry: already durable
    }
    if (profile.version() <= old->message.version()) {
      return absl::FailedPreconditionError(Cat("version: must be greater than the stored version ",
                                               old->message.version(), " of '", name, "' (got ",
                                               profile.version(), ")"));
    }
  }
  absl::StatusOr<std::string> json = proto::ToJson(profile);
  if (!json.ok()) return json.status();
  MOEPLAN_RETURN_IF_ERROR(proto::WriteFileAtomic(ProfilePath(name), EncodeProfileFile(*json)));
  std::lock_guard<std::mutex> lock(mu_);
  profiles_[name] = *entry;
  return *entry;
}

absl::StatusOr<ProfileStore::Measurements> ProfileStore::ReadMeasurements(
    std::string_view profile_name, size_t newest) const {
  // Appends hold write_mu_ until their line is whole: no torn last line here.
  std::lock_guard<std::mutex> write_lock(write_mu_);
  const std::string path = MeasurementPath(profile_name);
  Measurements out;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return out;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InternalError(Cat(path, ": cannot open: ", std::strerror(errno)));
  std::deque<std::string> window;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++out.total;
    if (newest == 0) continue;  // counted, not kept
    if (window.size() == newest) window.pop_front();
    window.push_back(std::move(line));
    line.clear();
  }
  if (in.bad()) return absl::InternalError(Cat(path, ": read failed: ", std::strerror(errno)));
  out.lines.assign(std::make_move_iterator(window.begin()), std::make_move_iterator(window.end()));
  return out;
}

absl::StatusOr<uint64_t> ProfileStore::AppendMeasurement(const std::string& profile_name,
                                                         std::string_view line) {
  if (line.find('\n') != std::string_view::npos) {
    return absl::InternalError("measurement line contains a newline");
  }
  std::lock_guard<std::mutex> write_lock(write_mu_);
  const std::string path = MeasurementPath(profile_name);
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(Cat(path, ": cannot open: ", std::strerror(errno)));
  // Appends are serialised (write_mu_), so the end of the file now is where
  // this line starts: a write that fails part-way (a full disk) is cut back
  // to it, so the log never holds a torn line that a later append would
  // continue.
  const off_t start = ::lseek(fd, 0, SEEK_END);
  auto fail = [&](std::string_view what) {
    const std::string why = Cat(path, ": ", what, ": ", std::strerror(errno));
    if (start >= 0 && ::ftruncate(fd, start) == 0) ::fdatasync(fd);
    ::close(fd);
    return absl::InternalError(why);
  };
  std::string data(line);
  data.push_back('\n');
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("write failed");
    done += static_cast<size_t>(n);
  }
  if (::fdatasync(fd) != 0) return fail("fdatasync failed");
  ::close(fd);
  std::lock_guard<std::mutex> lock(mu_);
  return ++measurement_counts_[profile_name];
}

}  // namespace moeplan::server
