// CheckText: no string field of a message carries a control character.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/reflection.h>

#include <string>
#include <vector>

#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/proto/json.h"

namespace moeplan::proto {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Depth-first over set fields; `path` is the JSON path of `m` ("" at the top).
absl::Status Walk(const Message& m, const std::string& path, int depth) {
  if (depth > 64) return absl::OkStatus();  // the strict reader bounds nesting at 100
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string name = path.empty() ? f->name() : Cat(path, ".", f->name());
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
      for (int i = 0; i < n; ++i) {
        const std::string s = f->is_repeated() ? r->GetRepeatedString(m, f, i) : r->GetString(m, f);
        if (FindControlCharacter(s) != std::string::npos) {
          return absl::InvalidArgumentError(
              Cat(f->is_repeated() ? Cat(name, "[", i, "]") : name,
                  ": must not contain control characters (got ", Quoted(s), ")"));
        }
      }
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (f->is_map()) continue;  // none in moeplan.v1 carries text to a terminal
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(m, f); ++i) {
          MOEPLAN_RETURN_IF_ERROR(
              Walk(r->GetRepeatedMessage(m, f, i), Cat(name, "[", i, "]"), depth + 1));
        }
      } else {
        MOEPLAN_RETURN_IF_ERROR(Walk(r->GetMessage(m, f), name, depth + 1));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckText(const google::protobuf::Message& msg) { return Walk(msg, "", 0); }

}  // namespace moeplan::proto
