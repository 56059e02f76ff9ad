#include "moeplan/proto/json.h"

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "strict_json.h"

namespace moeplan::proto {

namespace {

// Protobuf echoes a value whole ('invalid value "<100 KB>" for type
// TYPE_INT32'), escapes and all: each quoted value is cut to kQuotedBytes and
// escaped, like every echo of a user's value (base's Quoted), the rest escaped.
std::string BoundQuotedValues(std::string_view text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t open = text.find('"', i);
    if (open == std::string_view::npos) {
      out += Printable(text.substr(i), 256);
      break;
    }
    out += Printable(text.substr(i, open - i), 256);
    size_t close = text.find('"', open + 1);
    if (close == std::string_view::npos) close = text.size();
    const std::string_view value = text.substr(open + 1, close - open - 1);
    out += '"';
    out += Printable(value, kQuotedBytes);
    out += '"';
    i = close + 1;
  }
  return out;
}

// Protobuf 3.21 reports "(parent.path) field: what", "(path): what" or
// "field: what"; say it as "path.field: what" like the planner's validation, with
// "unknown field" for the common case, and keep syntax errors on one line.
std::string NormalizeJsonError(std::string_view raw, std::string_view type_name) {
  std::string msg;
  for (char c : raw) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    if (c == ' ' && !msg.empty() && msg.back() == ' ') continue;
    msg += c;
  }
  while (!msg.empty() && (msg.back() == ' ' || msg.back() == '^')) msg.pop_back();
  std::string path, rest = msg;
  if (!msg.empty() && msg.front() == '(') {
    const size_t close = msg.find(')');
    if (close != std::string::npos) {
      path = msg.substr(1, close - 1);
      rest = msg.substr(close + 1);
      if (!rest.empty() && rest.front() == ':') {
        rest = rest.substr(1);
      } else if (!rest.empty() && rest.front() == ' ') {
        rest = rest.substr(1);
        const size_t colon = rest.find(": ");
        if (colon != std::string::npos) {
          path = Cat(path, ".", rest.substr(0, colon));
          rest = rest.substr(colon + 1);
        }
      }
      while (!rest.empty() && rest.front() == ' ') rest.erase(0, 1);
    }
  }
  const std::string_view kUnknown = "Cannot find field.";
  if (path.empty() && rest.size() > kUnknown.size() &&
      rest.compare(rest.size() - kUnknown.size(), kUnknown.size(), kUnknown) == 0) {
    // "name: Cannot find field." at the top level.
    const size_t colon = rest.find(": ");
    if (colon != std::string::npos) {
      path = rest.substr(0, colon);
      rest = std::string(kUnknown);
    }
  }
  path = Printable(path, 128);
  rest = BoundQuotedValues(rest);
  if (rest == kUnknown) return Cat(path, ": unknown field (not in ", type_name, ")");
  if (!path.empty()) return Cat(path, ": ", rest);
  return Cat("invalid JSON: ", rest);
}

}  // namespace

absl::Status ParseJson(std::string_view json, google::protobuf::Message* msg) {
  msg->Clear();
  // Protobuf's parser is lenient (repeated keys, trailing commas, raw control
  // characters): the syntax is checked strictly first, for every input.
  MOEPLAN_RETURN_IF_ERROR(internal::CheckStrictJson(json));
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), msg, options);
  if (!status.ok()) {
    msg->Clear();
    return absl::InvalidArgumentError(
        NormalizeJsonError(std::string_view(status.message().data(), status.message().size()),
                           msg->GetDescriptor()->full_name()));
  }
  if (absl::Status s = CheckText(*msg); !s.ok()) {
    msg->Clear();
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = Cat(path, ": cannot open: ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(why);
    if (err == EACCES) return absl::PermissionDeniedError(why);
    return absl::InternalError(why);
  }
  std::string out;
  char buf[1 << 16];
  while (!in.eof()) {
    in.read(buf, sizeof buf);
    if (in.bad()) return absl::InternalError(Cat(path, ": read failed: ", std::strerror(errno)));
    const size_t n = static_cast<size_t>(in.gcount());
    if (out.size() + n > max_bytes) {
      return absl::InvalidArgumentError(
          Cat(path, ": larger than ", max_bytes, " bytes, the most an input file may hold"));
    }
    out.append(buf, n);
  }
  return out;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path, 4096);
  if (!text.ok()) {
    return absl::InvalidArgumentError(Cat("--token-file: ", View(text.status().message())));
  }
  std::string token = text->substr(0, text->find('\n'));
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  return token;
}

absl::Status ReadJsonFile(const std::string& path, google::protobuf::Message* msg) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  if (absl::Status s = ParseJson(*text, msg); !s.ok()) {
    return absl::InvalidArgumentError(Cat(path, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& msg, JsonStyle style) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = style.pretty;
  options.always_print_primitive_fields = style.always_print_primitive_fields;
  options.preserve_proto_field_names = style.preserve_proto_field_names;
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(msg, &out, options);
  if (!status.ok()) return absl::InternalError(std::string(status.message()));
  return out;
}

absl::Status WriteFileAtomic(const std::string& given, std::string_view contents) {
  // Only ever replace a regular file: renaming over a device node, FIFO or
  // socket would replace it (as root, /dev/null), and a directory cannot be.
  // A symbolic link is followed, so its target is replaced, not the link.
  std::string path = given;
  struct stat st;
  if (::lstat(given.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char* real = ::realpath(given.c_str(), nullptr);
    if (real != nullptr) {
      path = real;
      std::free(real);
    }
  }
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a device";
    return absl::InvalidArgumentError(
        Cat(given, ": is ", what, "; output is written only to regular files"));
  }
  std::string tmpl = path + ".tmp.XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) {
    return absl::PermissionDeniedError(
        Cat(path, ": cannot create a file next to it: ", std::strerror(errno)));
  }
  auto fail = [&](std::string_view what) {
    const std::string why = Cat(path, ": ", what, ": ", std::strerror(errno));
    ::close(fd);
    ::unlink(name.data());
    return absl::InternalError(why);
  };
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write failed");
    }
    done += static_cast<size_t>(n);
  }
  // mkstemp creates 0600; output files are ordinary user files.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0) return fail("chmod failed");
  if (::fsync(fd) != 0) return fail("fsync failed");
  if (::close(fd) != 0) {
    const std::string why = Cat(path, ": close failed: ", std::strerror(errno));
    ::unlink(name.data());
    return absl::InternalError(why);
  }
  if (::rename(name.data(), path.c_str()) != 0) {
    const std::string why = Cat(path, ": rename failed: ", std::strerror(errno));
    ::unlink(name.data());
    return absl::InternalError(why);
  }
  // Make the rename itself durable.
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace moeplan::proto
