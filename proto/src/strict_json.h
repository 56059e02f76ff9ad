// The strict syntax pass every JSON input goes through before protobuf's
// parser (ParseJson; proto/README.md "Strict JSON"): protobuf 3.21 keeps the
// last of a repeated key, accepts trailing commas, single quotes and unquoted
// keys, and lets raw control characters through strings.
#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace moeplan::proto::internal {

// The deepest nesting of arrays and objects accepted (protobuf's own limit).
inline constexpr int kMaxJsonDepth = 100;

// OK when `json` is one strict RFC 8259 JSON value: no key twice in an object
// (a field's two spellings, "seq_len" and "seqLen", are one key), no trailing
// comma, comment, NaN or Infinity, no raw control character (U+0000 to
// U+001F) in a string, valid UTF-8 in strings, nothing after the value, at most
// kMaxJsonDepth levels. Otherwise InvalidArgument, one line:
//   "line 3, column 14: parallel.mp: duplicate key (a key may appear once per object)"
// with "line L, " left out when `json` is one line (a JSON Lines line: the
// caller names the line), the column counted in characters from 1, and the
// field's path where the error is inside one. Values in it are bounded and
// escaped.
absl::Status CheckStrictJson(std::string_view json);

}  // namespace moeplan::proto::internal
