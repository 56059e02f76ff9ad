// Message building. Debian's abseil is built with its own absl::string_view
// (not an alias of std::string_view), so absl::StrCat rejects std::string_view;
// Cat formats every argument with fmt instead.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace moeplan {

namespace strings_internal {
template <class T>
const T& Arg(const T& v) {
  return v;
}
inline std::string_view Arg(absl::string_view v) { return std::string_view(v.data(), v.size()); }
}  // namespace strings_internal

// Concatenates the arguments as fmt's "{}" prints them (doubles: shortest
// round-trip form).
template <class... Args>
std::string Cat(const Args&... args) {
  std::string out;
  (fmt::format_to(std::back_inserter(out), "{}", strings_internal::Arg(args)), ...);
  return out;
}

// `s` as one word for /bin/sh: single-quoted, a quote inside as '\''.
inline std::string ShellQuote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Untrusted text made safe to echo in a message or a log line: control bytes,
// backslash and DEL as \xNN (so a newline cannot forge a line and no escape
// sequence reaches a terminal), and at most `max_bytes` of the input kept,
// the rest said as "...(N bytes)".
inline std::string Printable(std::string_view s, size_t max_bytes = 128) {
  std::string out;
  const size_t n = std::min(s.size(), max_bytes);
  out.reserve(n + 16);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      fmt::format_to(std::back_inserter(out), "\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > max_bytes) fmt::format_to(std::back_inserter(out), "...({} bytes)", s.size());
  return out;
}

// absl::Status::message() as a std::string_view.
inline std::string_view View(absl::string_view v) { return std::string_view(v.data(), v.size()); }

}  // namespace moeplan
