// Megatron-Core's pipeline layout string, expanded and checked
// (pipeline_layout.h, docs/layouts.md "Pipeline layout").
#include "moeplan/planner/pipeline_layout.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "field_rules.h"
#include "moeplan/base/status.h"
#include "moeplan/base/strings.h"
#include "moeplan/planner/accounting.h"

namespace moeplan::planner {
namespace {

using internal::Bad;

constexpr std::string_view kField = "pipeline_model_parallel_layout";

bool IsSymbol(char c) { return c == 'E' || c == 't' || c == 'm' || c == 'L' || c == '|'; }

// "'c' at offset N" for the error's "got".
std::string At(std::string_view s, size_t pos) {
  if (pos >= s.size()) return Cat("the end (offset ", pos, ")");
  const unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x20 || c >= 0x7f) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", c);
    return Cat("byte ", std::string_view(hex), " at offset ", pos);
  }
  return Cat("'", std::string_view(&s[pos], 1), "' at offset ", pos);
}

// Expands the repetitions: symbols and '|' in order.
class Expander {
 public:
  explicit Expander(std::string_view s) : s_(s) {}

  absl::Status Run(std::string* out) {
    MOEPLAN_RETURN_IF_ERROR(Seq(out, 0));
    if (pos_ < s_.size()) return Bad(kField, "')' closes no group", At(s_, pos_));
    return absl::OkStatus();
  }

 private:
  // Items until a ')' or the end.
  absl::Status Seq(std::string* out, int depth) {
    while (pos_ < s_.size() && s_[pos_] != ')') {
      const char c = s_[pos_];
      if (c == ',') {
        ++pos_;
        continue;
      }
      const size_t start = out->size();
      if (c == '(') {
        if (depth >= kMaxPipelineLayoutDepth) {
          return Bad(kField, Cat("groups nest at most ", kMaxPipelineLayoutDepth, " deep"),
                     At(s_, pos_));
        }
        const size_t open = pos_++;
        MOEPLAN_RETURN_IF_ERROR(Seq(out, depth + 1));
        if (pos_ >= s_.size()) return Bad(kField, "'(' is never closed", At(s_, open));
        ++pos_;
      } else if (IsSymbol(c)) {
        out->push_back(c);
        ++pos_;
      } else if (c == '*') {
        return Bad(kField, "'*' must follow a symbol or a group", At(s_, pos_));
      } else {
        return Bad(kField,
                   "symbols are E (embedding), t (decoder layer), m (MTP layer), L (loss), '|' "
                   "between stages, '(...)*N' and 'x*N' to repeat, ',' to read",
                   At(s_, pos_));
      }
      if (pos_ < s_.size() && s_[pos_] == '*') MOEPLAN_RETURN_IF_ERROR(Repeat(out, start));
    }
    return absl::OkStatus();
  }

  // "*N" after what starts at `start` of out: N copies in all.
  absl::Status Repeat(std::string* out, size_t start) {
    const size_t star = pos_++;
    int64_t n = 0;
    const size_t digits = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      n = n * 10 + (s_[pos_++] - '0');
      if (n > kMaxPipelineLayoutSymbols) {
        return Bad(kField, Cat("a count must be at most ", kMaxPipelineLayoutSymbols),
                   At(s_, digits));
      }
    }
    if (pos_ == digits) return Bad(kField, "'*' must be followed by a count", At(s_, star));
    if (n < 1) return Bad(kField, "a count must be at least 1", At(s_, digits));
    const size_t unit = out->size() - start;
    if (unit * static_cast<size_t>(n) + start > static_cast<size_t>(kMaxPipelineLayoutSymbols)) {
      return Bad(kField, Cat("expands to more than ", kMaxPipelineLayoutSymbols, " symbols"),
                 At(s_, star));
    }
    for (int64_t i = 1; i < n; ++i) out->append(*out, start, unit);
    return absl::OkStatus();
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<PipelineStageLayers>> ParsePipelineLayout(std::string_view layout) {
  if (layout.empty()) return Bad(kField, "must not be empty", "\"\"");
  std::string symbols;
  MOEPLAN_RETURN_IF_ERROR(Expander(layout).Run(&symbols));
  if (symbols.empty()) return Bad(kField, "must name a layer or a stage", Quoted(layout));
  std::vector<PipelineStageLayers> stages(1);
  int blocks = 0, mtp = 0;
  for (size_t i = 0; i < symbols.size(); ++i) {
    PipelineStageLayers& s = stages.back();
    switch (symbols[i]) {
      case '|':
        stages.push_back({blocks, blocks, mtp, mtp, false, false});
        break;
      case 'E':
        if (i != 0) {
          return Bad(kField, "E (the embedding) must be the first symbol", Cat("E after ", i));
        }
        s.embed = true;
        break;
      case 't':
        if (mtp > 0) {
          return Bad(kField, "decoder layers (t) must come before MTP layers (m)",
                     Cat("t after ", mtp, " m"));
        }
        s.end_block = ++blocks;
        break;
      case 'm':
        s.end_mtp = ++mtp;
        break;
      default:  // 'L'
        if (i + 1 != symbols.size()) {
          return Bad(kField, "L (the loss) must be the last symbol",
                     Cat("L before ", symbols.size() - i - 1, " more"));
        }
        s.loss = true;
        break;
    }
  }
  return stages;
}

absl::Status ValidatePipelineLayout(const std::vector<PipelineStageLayers>& stages,
                                    const ModelConfig& model, int pp) {
  const int n = static_cast<int>(stages.size());
  if (pp < 1 || n % pp != 0) {
    return Bad(kField,
               Cat("its stages must be a multiple of pp (", pp, "): pp x virtual stages per rank"),
               Cat(n, " stages"));
  }
  if (n == 0 || !stages.front().embed) {
    return Bad(kField, "must start with E (the embedding)", Cat(n, " stages"));
  }
  if (!stages.back().loss) return Bad(kField, "must end with L (the loss)", Cat(n, " stages"));
  const PipelineStageLayers& last = stages.back();
  if (last.end_block != model.num_layers) {
    return Bad(kField, Cat("must hold num_layers (", model.num_layers, ") decoder layers (t)"),
               Cat(last.end_block));
  }
  if (last.end_mtp != model.mtp_num_layers) {
    return Bad(kField, Cat("must hold mtp_num_layers (", model.mtp_num_layers, ") MTP layers (m)"),
               Cat(last.end_mtp));
  }
  for (int i = 0; i < n; ++i) {
    const PipelineStageLayers& s = stages[static_cast<size_t>(i)];
    if (s.end_mtp > s.first_mtp && !s.loss) {
      return Bad(kField,
                 "MTP layers (m) must share the loss's stage: moeplan plans them with the output "
                 "layer they share",
                 Cat("stage ", i));
    }
    if (s.first_block == s.end_block && s.first_mtp == s.end_mtp && !s.embed && !s.loss) {
      return Bad(kField, "every stage must hold a layer: moeplan plans no empty stage",
                 Cat("stage ", i, " (pipeline rank ", i % pp, ", virtual stage ", i / pp, ")"));
    }
  }
  return absl::OkStatus();
}

std::string FormatPipelineLayout(const std::vector<PipelineStageLayers>& stages) {
  std::string out;
  for (size_t i = 0; i < stages.size(); ++i) {
    const PipelineStageLayers& s = stages[i];
    if (i > 0) out += '|';
    if (s.embed) out += 'E';
    out.append(static_cast<size_t>(std::max(0, s.end_block - s.first_block)), 't');
    out.append(static_cast<size_t>(std::max(0, s.end_mtp - s.first_mtp)), 'm');
    if (s.loss) out += 'L';
  }
  return out;
}

std::vector<PipelineStageLayers> BalancedPipelineLayout(const ModelConfig& model, int stages) {
  const int L = model.num_layers, n = stages, D = model.mtp_num_layers;
  if (n < 2 || L < n - 2) return {};
  const FlopTerms t = FlopTermsOf(model);
  std::vector<double> prefix(static_cast<size_t>(L) + 1, 0.0);
  for (int i = 0; i < L; ++i) {
    prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + t.Block(model, i);
  }
  const double tail = t.output_layer + D * (t.Block(model, L) + t.mtp_input + t.output_layer);
  auto at = [&](int j, int i) { return static_cast<size_t>(j) * (L + 1) + static_cast<size_t>(i); };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[j, i]: the least heaviest chunk of chunks 0..j over layers [0, i),
  // chunk j ending at i; from[j, i] where chunk j starts. Chunk 0 may hold
  // the embedding alone, chunks 1..n-2 a layer at least.
  std::vector<double> best(static_cast<size_t>(n - 1) * (L + 1), kInf);
  std::vector<int> from(best.size(), 0);
  for (int i = 0; i <= L; ++i) best[at(0, i)] = prefix[static_cast<size_t>(i)];
  for (int j = 1; j < n - 1; ++j) {
    for (int i = j; i <= L; ++i) {
      for (int k = j - 1; k < i; ++k) {
        const double w = std::max(best[at(j - 1, k)], prefix[static_cast<size_t>(i)] - prefix[k]);
        if (w < best[at(j, i)]) {
          best[at(j, i)] = w;
          from[at(j, i)] = k;
        }
      }
    }
  }
  // The last chunk: layers [k, L) and the tail, maybe no layer.
  int start = L;
  double least = kInf;
  for (int k = n - 2; k <= L; ++k) {
    const double w =
        std::max(best[at(n - 2, k)], prefix[static_cast<size_t>(L)] - prefix[k] + tail);
    if (w < least) {
      least = w;
      start = k;
    }
  }
  std::vector<PipelineStageLayers> out(static_cast<size_t>(n));
  int end = L;
  for (int j = n - 1; j >= 0; --j) {
    PipelineStageLayers& c = out[static_cast<size_t>(j)];
    c.first_block = j == 0 ? 0 : start;
    c.end_block = end;
    c.embed = j == 0;
    c.loss = j == n - 1;
    if (c.loss) c.end_mtp = D;
    end = start;
    if (j >= 1 && j - 1 >= 1) start = from[at(j - 1, start)];
  }
  return out;
}

}  // namespace moeplan::planner
