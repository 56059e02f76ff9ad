// Message building. Debian's abseil is built with its own absl::string_view
// (not an alias of std::string_view), so absl::StrCat rejects std::string_view;
// Cat formats every argument with fmt instead.
#pragma once

#include <fmt/format.h>

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

// absl::Status::message() as a std::string_view.
inline std::string_view View(absl::string_view v) { return std::string_view(v.data(), v.size()); }

}  // namespace moeplan
