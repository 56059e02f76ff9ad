// `moeplan import-hf`: a Hugging Face config.json as a moeplan ModelConfig
// (docs/model.md "Hugging Face config.json"), and LoadModelFile, which reads
// plan-model's --model file of either kind.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "cli_util.h"
#include "commands.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/proto/hf_config.h"
#include "moeplan/proto/json.h"

namespace moeplan::client {

namespace {

// The folder of a ".../NAME/config.json" (as the Hub's repositories are
// downloaded), else the file's stem.
std::string ModelName(const std::string& path) {
  const std::filesystem::path p(path);
  if (p.filename() != "config.json") return p.stem().string();
  std::filesystem::path folder = p.parent_path();
  if (folder.empty() || folder.filename() == "." || folder.filename() == "..") {
    std::error_code ec;
    folder = std::filesystem::weakly_canonical(std::filesystem::absolute(p, ec), ec).parent_path();
  }
  return folder.filename().string();
}

proto::HfTraining Training(const HfFlags& f) {
  proto::HfTraining t;
  if (f.seq_length > 0) t.seq_length = f.seq_length;
  if (f.micro_batch_size > 0) t.micro_batch_size = f.micro_batch_size;
  t.global_batch_size = f.global_batch_size;
  t.fp8_format = f.fp8_format;
  t.fp8_recipe = f.fp8_recipe;
  t.fp8_param_gather = f.fp8_param_gather;
  return t;
}

// A flag that only means something for a Hugging Face config is never
// silently ignored.
absl::Status RefuseHfFlags(const HfFlags& f) {
  const std::pair<bool, std::string_view> flags[] = {
      {f.seq_length > 0,
       "--seq-length: applies to Hugging Face config.json models only; set "
       "seq_length in the model file"},
      {f.micro_batch_size > 0,
       "--micro-batch-size: applies to Hugging Face config.json models "
       "only; set micro_batch_size in the model file"},
      {f.global_batch_size > 0,
       "--global-batch-size: applies to Hugging Face config.json models "
       "only; set global_batch_size in the model file"},
      {!f.fp8_format.empty(),
       "--fp8-format: applies to Hugging Face config.json models only; set fp8_format in "
       "the model file"},
      {!f.fp8_recipe.empty(),
       "--fp8-recipe: applies to Hugging Face config.json models only; set fp8_recipe in "
       "the model file"},
      {f.fp8_param_gather,
       "--fp8-param-gather: applies to Hugging Face config.json models only; set "
       "fp8_param_gather in the model file"},
  };
  for (const auto& [given, error] : flags) {
    if (given) return absl::InvalidArgumentError(std::string(error));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadModelFile(const std::string& path, const HfFlags& hf, v1::ModelConfig* model,
                           std::vector<proto::HfField>* fields) {
  MOEPLAN_ASSIGN_OR_RETURN(const std::string text, proto::ReadFile(path));
  if (!proto::LooksLikeHfConfig(text)) {
    if (absl::Status s = proto::ParseJson(text, model); !s.ok()) {
      return absl::InvalidArgumentError(Cat(path, ": ", View(s.message())));
    }
    return RefuseHfFlags(hf);
  }
  absl::StatusOr<proto::HfImport> imported =
      proto::ImportHfConfig(text, Training(hf), ModelName(path));
  if (!imported.ok()) {
    return absl::Status(imported.status().code(),
                        Cat(path, ": ", View(imported.status().message())));
  }
  *model = std::move(imported->model);
  if (fields != nullptr) *fields = std::move(imported->fields);
  return absl::OkStatus();
}

absl::Status ImportHfCmd(const ImportHfArgs& a) {
  MOEPLAN_RETURN_IF_ERROR(RefuseOutputOverInput({{"-o", a.out}}, {{"CONFIG", a.config}}));
  v1::ModelConfig model;
  std::vector<proto::HfField> fields;
  MOEPLAN_ASSIGN_OR_RETURN(const std::string text, proto::ReadFile(a.config));
  if (!proto::LooksLikeHfConfig(text)) {
    return absl::InvalidArgumentError(
        Cat(a.config,
            ": not a Hugging Face config.json (a JSON object with \"model_type\" or "
            "\"architectures\")"));
  }
  MOEPLAN_RETURN_IF_ERROR(LoadModelFile(a.config, a.hf, &model, &fields));
  MOEPLAN_ASSIGN_OR_RETURN(std::string json, proto::ToJson(model));
  json += "\n";
  if (!a.out.empty()) {
    absl::Status s = proto::WriteFileAtomic(a.out, json);
    if (!s.ok()) return absl::Status(s.code(), Cat("-o: ", View(s.message())));
  } else {
    MOEPLAN_RETURN_IF_ERROR(WriteStdout(json));
  }
  std::string report;
  for (const proto::HfField& f : fields) {
    report += Cat(proto::HfUseName(f.use), "  ", Printable(f.name), f.note.empty() ? "" : " ",
                  Printable(f.note, 512), "\n");
  }
  std::fputs(report.c_str(), stderr);
  return absl::OkStatus();
}

}  // namespace moeplan::client
