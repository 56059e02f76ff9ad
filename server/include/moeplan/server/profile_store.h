// The server's profiles: the built-in spec profiles (read-only) plus profiles put
// by clients, persisted under DATA_DIR/profiles/<name>.profile. Every write goes
// to a temporary file, is fsync'ed and renamed into place before it is
// acknowledged; every file carries a CRC-32 of its JSON body that is verified on
// load, so a corrupt file is reported and skipped, never used. Measurements that
// jobs report are appended (and fsync'ed) to DATA_DIR/measurements/<name>.jsonl.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/planner/cost_model.h"
#include "moeplan/planner/profile.h"
#include "moeplan/v1/profile.pb.h"

namespace moeplan::server {

// A validated profile, ready to plan with. Immutable once published.
struct ProfileEntry {
  v1::ClusterProfile message;
  planner::ClusterProfile profile;
  planner::CostModel cost;
  bool builtin = false;
};

// Builds an entry (validates the profile). InvalidArgument naming the field.
absl::StatusOr<std::shared_ptr<const ProfileEntry>> MakeProfileEntry(v1::ClusterProfile message,
                                                                     bool builtin);

// The on-disk form of a stored profile: a header line
// "moeplan-profile 1 crc32=<8 hex digits> bytes=<n>" and the JSON body.
std::string EncodeProfileFile(std::string_view json);
// The JSON body, or DataLoss naming what is wrong (header, length, checksum).
absl::StatusOr<std::string> DecodeProfileFile(std::string_view contents);

class ProfileStore {
 public:
  struct OpenReport {
    std::vector<std::string> loaded;   // profile names
    std::vector<std::string> skipped;  // "<path>: <why>", one per bad file
  };

  // Creates DATA_DIR (and its subdirectories) if needed and loads every stored
  // profile. Bad files are listed in `report` and skipped; the store still opens.
  static absl::StatusOr<std::unique_ptr<ProfileStore>> Open(const std::string& data_dir,
                                                            OpenReport* report);

  // nullptr when no profile has that name.
  std::shared_ptr<const ProfileEntry> Get(std::string_view name) const;
  // All profiles, sorted by name.
  std::vector<std::shared_ptr<const ProfileEntry>> List() const;
  std::vector<std::string> Names() const;

  // Validates, persists and publishes. Rules: a built-in name is read-only
  // (FailedPrecondition); the version must be >= 1 and greater than the stored
  // one, except that re-putting the identical profile is acknowledged again
  // (idempotent retries). Field errors are InvalidArgument "<field>: ...".
  absl::StatusOr<std::shared_ptr<const ProfileEntry>> Put(const v1::ClusterProfile& profile);

  // Appends one line (no newline inside) to the profile's measurement log and
  // fsyncs it. Returns how many measurements that profile now has.
  absl::StatusOr<uint64_t> AppendMeasurement(const std::string& profile_name,
                                             std::string_view line);
  // The newest `newest` lines of the profile's measurement log (all when it
  // holds fewer; none: empty), oldest first, and how many lines it holds in
  // all. Read line by line: memory holds the lines returned, not the log.
  struct Measurements {
    std::vector<std::string> lines;
    uint64_t total = 0;
  };
  absl::StatusOr<Measurements> ReadMeasurements(std::string_view profile_name,
                                                size_t newest) const;

  const std::string& data_dir() const { return data_dir_; }

 private:
  explicit ProfileStore(std::string data_dir);
  std::string ProfilePath(std::string_view name) const;
  std::string MeasurementPath(std::string_view name) const;

  const std::string data_dir_;
  mutable std::mutex mu_;  // guards profiles_ and measurement_counts_
  std::map<std::string, std::shared_ptr<const ProfileEntry>, std::less<>> profiles_;
  std::map<std::string, uint64_t, std::less<>> measurement_counts_;
  mutable std::mutex write_mu_;  // serialises file writes (puts and appends) and log reads
};

}  // namespace moeplan::server
