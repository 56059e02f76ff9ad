// One SAX pass of RapidJSON's reader over the text, with default flags (which
// refuse trailing commas, comments, NaN and raw control characters in strings)
// plus UTF-8 validation; the handler refuses a repeated key and nesting past
// kMaxJsonDepth. Nothing is built: the values are protobuf's to read.
#include "strict_json.h"

#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <cctype>
#include <string>
#include <unordered_map>
#include <vector>

#include "moeplan/base/strings.h"

namespace moeplan::proto::internal {

namespace {

constexpr unsigned kFlags = rapidjson::kParseValidateEncodingFlag;

// "line 3, column 14: " (or "column 14: " for one-line text); columns count
// characters, not bytes, as editors do.
std::string Position(std::string_view json, size_t offset) {
  offset = std::min(offset, json.size());
  size_t begin = 0;
  if (offset > 0) {
    const size_t newline = json.rfind('\n', offset - 1);
    if (newline != std::string_view::npos) begin = newline + 1;
  }
  size_t column = 1;
  for (size_t i = begin; i < offset; ++i) {
    if ((static_cast<unsigned char>(json[i]) & 0xc0) != 0x80) ++column;
  }
  if (json.find('\n') == std::string_view::npos) return Cat("column ", column, ": ");
  size_t line = 1;
  for (size_t i = 0; i < begin; ++i) line += json[i] == '\n';
  return Cat("line ", line, ", column ", column, ": ");
}

// The name protobuf's JSON mapping gives a field ("seq_len" -> "seqLen"); it
// reads both, so both spellings in one object are one key twice. The schema has
// no map or Struct fields, so every key of every object is a field name.
std::string JsonName(std::string_view key) {
  std::string out;
  bool upper = false;
  for (char c : key) {
    if (c == '_') {
      upper = true;
    } else {
      out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
      upper = false;
    }
  }
  return out;
}

struct Frame {
  bool object = false;
  std::unordered_map<std::string, std::string> keys;  // JsonName -> the key as written
  std::string key;                                    // the member being read (objects)
  bool awaiting_value = false;                        // after a key, before its value ends
  size_t index = 0;                                   // the element being read (arrays)
};

class StrictHandler : public rapidjson::BaseReaderHandler<rapidjson::UTF8<>, StrictHandler> {
 public:
  StrictHandler(std::string_view json, const rapidjson::MemoryStream* in) : json_(json), in_(in) {}

  bool Default() { return ValueEnded(); }
  bool StartObject() { return Open(true); }
  bool StartArray() { return Open(false); }
  bool EndObject(rapidjson::SizeType) { return Close(); }
  bool EndArray(rapidjson::SizeType) { return Close(); }

  bool Key(const char* data, rapidjson::SizeType size, bool) {
    const std::string key(data, size);
    Frame& f = frames_.back();
    const auto [it, added] = f.keys.emplace(JsonName(key), key);
    if (!added) {
      // Name the repeated key where it starts: past the previous value, blanks and comma.
      size_t at = last_end_;
      while (at < json_.size() &&
             (json_[at] == ',' || std::isspace(static_cast<unsigned char>(json_[at])))) {
        ++at;
      }
      const std::string why =
          it->second == key ? "" : Cat(it->second, " and ", key, " are one field; ");
      error_ = Cat(Position(json_, at), Printable(PathWith(key), 128), ": duplicate key (",
                   Printable(why, 160), "a key may appear once per object)");
      return false;
    }
    f.key = key;
    f.awaiting_value = true;
    last_end_ = in_->Tell();
    return true;
  }

  // The path of the field being read; `current` false leaves out the member or
  // element of the innermost container (the container itself is named).
  std::string Path(bool current) const {
    std::string out;
    for (size_t i = 0; i < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (i + 1 == frames_.size() && !current) break;
      if (f.object && f.awaiting_value) {
        out += out.empty() ? f.key : Cat(".", f.key);
      } else if (!f.object) {
        out += Cat("[", f.index, "]");
      }
    }
    return out;
  }

  bool ReadingKey() const {
    return !frames_.empty() && frames_.back().object && !frames_.back().awaiting_value;
  }
  const std::string& error() const { return error_; }

 private:
  std::string PathWith(std::string_view key) const {
    const std::string container = Path(true);
    return container.empty() ? std::string(key) : Cat(container, ".", key);
  }

  bool Open(bool object) {
    if (frames_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      error_ = Cat(Position(json_, in_->Tell() - 1), "nested deeper than ", kMaxJsonDepth,
                   " arrays and objects");
      return false;
    }
    frames_.emplace_back().object = object;
    last_end_ = in_->Tell();
    return true;
  }

  bool Close() {
    frames_.pop_back();
    return ValueEnded();
  }

  bool ValueEnded() {
    if (!frames_.empty()) {
      Frame& f = frames_.back();
      if (f.object) {
        f.awaiting_value = false;
      } else {
        ++f.index;
      }
    }
    last_end_ = in_->Tell();
    return true;
  }

  std::string_view json_;
  const rapidjson::MemoryStream* in_;
  std::vector<Frame> frames_;
  size_t last_end_ = 0;  // the offset just past the last token the handler saw
  std::string error_;
};

std::string ControlCharacterEscape(unsigned char c) {
  switch (c) {
    case '\t':
      return "\\t";
    case '\r':
      return "\\r";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default:
      return fmt::format("\\u{:04x}", c);
  }
}

std::string WithPath(const std::string& path, std::string_view what) {
  return path.empty() ? std::string(what) : Cat(Printable(path, 128), ": ", what);
}

// A syntax error said as what to fix: the rules protobuf's parser did not
// enforce get their own words, the rest RapidJSON's.
std::string SyntaxError(std::string_view json, const rapidjson::Reader& reader,
                        const StrictHandler& h) {
  const size_t off = reader.GetErrorOffset();
  const rapidjson::ParseErrorCode code = reader.GetParseErrorCode();
  const unsigned char at = off < json.size() ? static_cast<unsigned char>(json[off]) : 0;
  const bool in_string = code == rapidjson::kParseErrorStringEscapeInvalid ||
                         code == rapidjson::kParseErrorStringMissQuotationMark;
  if (off < json.size() && at < 0x20 && in_string) {
    const std::string path = h.Path(!h.ReadingKey());
    if (at == '\n') {
      return Position(json, off) +
             WithPath(path, "line break in a string (close the string, or write it as \\n)");
    }
    return Position(json, off) +
           WithPath(path, fmt::format("raw control character U+{:04X} in a string (write it as {})",
                                      at, ControlCharacterEscape(at)));
  }
  if (off < json.size() && at < 0x20 && at != '\t' && at != '\n' && at != '\r') {
    return Position(json, off) +
           WithPath(h.Path(true),
                    fmt::format("raw control character U+{:04X} outside a string", at));
  }
  if (off < json.size() && (at == '}' || at == ']')) {
    size_t prev = off;
    while (prev > 0 && std::isspace(static_cast<unsigned char>(json[prev - 1]))) --prev;
    if (prev > 0 && json[prev - 1] == ',') {
      return Position(json, prev - 1) +
             WithPath(h.Path(false), at == '}' ? "trailing comma before '}' (JSON allows none "
                                                 "after the last member)"
                                               : "trailing comma before ']' (JSON allows none "
                                                 "after the last element)");
    }
  }
  if (at == '/' && off + 1 < json.size() && (json[off + 1] == '/' || json[off + 1] == '*')) {
    return Position(json, off) + WithPath(h.Path(true), "invalid JSON: a comment (JSON has none)");
  }
  if (at == '\'') {
    return Position(json, off) +
           WithPath(h.Path(true), "invalid JSON: a single quote (JSON quotes with \")");
  }
  std::string what = code == rapidjson::kParseErrorStringInvalidEncoding
                         ? "invalid UTF-8 in a string"
                         : rapidjson::GetParseError_En(code);
  if (!what.empty()) what[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(what[0])));
  if (!what.empty() && what.back() == '.') what.pop_back();
  return Position(json, off) + WithPath(h.Path(true), Cat("invalid JSON: ", what));
}

}  // namespace

absl::Status CheckStrictJson(std::string_view json) {
  rapidjson::MemoryStream in(json.data(), json.size());
  StrictHandler handler(json, &in);
  rapidjson::Reader reader;
  if (reader.Parse<kFlags>(in, handler).IsError()) {
    return absl::InvalidArgumentError(handler.error().empty() ? SyntaxError(json, reader, handler)
                                                              : handler.error());
  }
  // The reader takes a NUL for the end of the text; a NUL before the end is
  // a control character outside any string.
  if (in.Tell() < json.size()) {
    return absl::InvalidArgumentError(Position(json, in.Tell()) +
                                      fmt::format("raw control character U+{:04X} outside a string",
                                                  static_cast<unsigned char>(json[in.Tell()])));
  }
  return absl::OkStatus();
}

}  // namespace moeplan::proto::internal
