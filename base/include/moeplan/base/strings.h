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

namespace strings_internal {
// The longest prefix of `s` of at most `max_bytes` that does not end inside a
// UTF-8 sequence (a cut value stays valid UTF-8 where it was).
inline size_t Utf8Prefix(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s.size();
  size_t n = max_bytes;
  // Back off over continuation bytes (10xxxxxx) to the start of the character.
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;
  return n;
}

inline void AppendEscaped(std::string_view s, std::string* out) {
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      fmt::format_to(std::back_inserter(*out), "\\x{:02x}", c);
    } else {
      *out += ch;
    }
  }
}
}  // namespace strings_internal

// Untrusted text made safe to echo in a message or a log line: control bytes,
// backslash and DEL as \xNN (so a newline cannot forge a line and no escape
// sequence reaches a terminal), and at most `max_bytes` of the input kept (cut
// at a character boundary), the rest said as "...(N bytes)".
inline std::string Printable(std::string_view s, size_t max_bytes = 128) {
  std::string out;
  const size_t n = strings_internal::Utf8Prefix(s, max_bytes);
  out.reserve(n + 16);
  strings_internal::AppendEscaped(s.substr(0, n), &out);
  if (n < s.size()) fmt::format_to(std::back_inserter(out), "...({} bytes)", s.size());
  return out;
}

// How many bytes of a user's value an error message quotes.
inline constexpr size_t kQuotedBytes = 64;

// A user-supplied value quoted for an error message, the one way every library
// echoes one: in single quotes, escaped as Printable escapes, and at most
// kQuotedBytes of it, so that a 100 KB value cannot make a status too big to
// travel (gRPC sends it in a header) or a line too long to read:
//   Quoted("dpmoe")          == "'dpmoe'"
//   Quoted("a\x1b[31m")      == "'a\\x1b[31m'"
//   Quoted(100 KB of 'x')    == "'xxx...x'... (102400 bytes)"  (64 x's)
inline std::string Quoted(std::string_view s, size_t max_bytes = kQuotedBytes) {
  std::string out = "'";
  const size_t n = strings_internal::Utf8Prefix(s, max_bytes);
  strings_internal::AppendEscaped(s.substr(0, n), &out);
  out += '\'';
  if (n < s.size()) fmt::format_to(std::back_inserter(out), "... ({} bytes)", s.size());
  return out;
}

// The offset of the first control character in UTF-8 text: C0 (U+0000 to
// U+001F), DEL (U+007F) or C1 (U+0080 to U+009F, bytes C2 80 to C2 9F), which
// terminals may take as part of an escape sequence; npos when there is none.
// Names and other labels that reach a terminal refuse them.
inline size_t FindControlCharacter(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return i;
    if (c == 0xc2 && i + 1 < s.size()) {
      const unsigned char next = static_cast<unsigned char>(s[i + 1]);
      if (next >= 0x80 && next <= 0x9f) return i;
    }
  }
  return std::string_view::npos;
}

// absl::Status::message() as a std::string_view.
inline std::string_view View(absl::string_view v) { return std::string_view(v.data(), v.size()); }

}  // namespace moeplan
