// Strict JSON for moeplan.v1 messages through protobuf's JSON mapping: unknown
// fields are rejected, errors say which field. Files are written atomically.
#pragma once

#include <google/protobuf/message.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moeplan::proto {

// Parses `json` into `msg` (cleared first). InvalidArgument on syntax errors,
// unknown fields, wrong types and out-of-range numbers, e.g.
// "parallel.bogus: Cannot find field.".
// Every string field is then checked by CheckText.
absl::Status ParseJson(std::string_view json, google::protobuf::Message* msg);

// No string field of `msg`, at any depth, holds a control character (C0, DEL,
// C1): names, comments, hosts and notes reach terminals, tables and report.md,
// and "\u001b" is valid JSON, as is any byte in a binary request. Errors name
// the field: "comment: must not contain control characters (got 'a\x1b[2J')".
// The server checks what it is sent with it before storing anything.
absl::Status CheckText(const google::protobuf::Message& msg);

// Reads and parses a file; errors are prefixed with the path. NotFound when the
// file does not exist.
absl::Status ReadJsonFile(const std::string& path, google::protobuf::Message* msg);

struct JsonStyle {
  bool pretty = true;
  bool always_print_primitive_fields = true;
  bool preserve_proto_field_names = true;  // snake_case keys, as in the .proto files
};
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& msg, JsonStyle style = {});

// Reads a whole file. NotFound / PermissionDenied / Internal with the path;
// InvalidArgument past max_bytes.
// Inputs (configs, profiles, samples) are refused past this size, read no
// further: `--layer /dev/zero` is an error, not an endless read.
inline constexpr size_t kMaxInputFileBytes = size_t{64} << 20;
absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     size_t max_bytes = kMaxInputFileBytes);

// A bearer-token file (--token-file of the server and the clients): its first
// line without the line end or trailing spaces, possibly empty. Errors are
// InvalidArgument "--token-file: ..." (unreadable, or over 4 KiB).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Writes `contents` to `path` atomically: a temporary file in the same directory,
// flushed and fsync'ed, then renamed over `path`. On error nothing is left behind
// and an existing `path` is untouched. Only regular files are replaced (a
// symbolic link's target is): a device, FIFO, socket or directory at `path` is
// InvalidArgument "<path>: is a FIFO; output is written only to regular files".
absl::Status WriteFileAtomic(const std::string& path, std::string_view contents);

}  // namespace moeplan::proto
