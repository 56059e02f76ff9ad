// Files compiled into a library (cmake/EmbedFiles.cmake, through the
// moeplan_embed_files() CMake function): each library's generated source
// defines `kEmbeddedFiles` and `kNumEmbeddedFiles` in a namespace of its own,
// which its code declares with MOEPLAN_DECLARE_EMBEDDED_FILES() there.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace moeplan {

struct EmbeddedFile {
  std::string_view name;  // the file's base name
  std::string_view contents;
};

// The contents of the file named `name`, or empty.
inline std::string_view FindEmbedded(std::span<const EmbeddedFile> files, std::string_view name) {
  for (const EmbeddedFile& f : files) {
    if (f.name == name) return f.contents;
  }
  return {};
}

}  // namespace moeplan

#define MOEPLAN_DECLARE_EMBEDDED_FILES()                 \
  extern const ::moeplan::EmbeddedFile kEmbeddedFiles[]; \
  extern const std::size_t kNumEmbeddedFiles
