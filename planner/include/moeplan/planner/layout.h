// Layouts of a whole model (docs/layouts.md): the DPMoE, PPMoE and MP+EP+ESP
// (Parm) families with tensor, pipeline, expert and data parallelism and
// ZeRO, their field rules, and the model one stage of a layout runs. The
// rest of the layout code builds on this header: the memory model
// (layout_memory.h), pipelines (pipeline.h), the executable programs of
// pipelined layouts (pipeline_program.h) and the evaluation and search
// (layout_planner.h), which plans stages with model_planner.h.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "moeplan/planner/model.h"
#include "moeplan/planner/pipeline_layout.h"
#include "moeplan/planner/types.h"

namespace moeplan::planner {

enum class Family : uint8_t {
  // Experts over data-parallel ranks (ep | dp*cp), each sharded like the dense
  // TP (esp = tp), or a folded grid (esp != tp with sp: ep*esp | tp*cp*dp).
  kDpMoe = 0,
  kPpMoe = 1,  // experts over the TP group (ep * esp = tp): local dispatch, TP-AllReduce combine
  kParm = 2,   // MP+EP+ESP: ep * esp = tp * dp, per-layer default / S1 / S2
};
inline constexpr Family kAllFamilies[] = {Family::kDpMoe, Family::kPpMoe, Family::kParm};
std::string_view FamilyName(Family f);  // "dpmoe", "ppmoe", "parm"
bool ParseFamily(std::string_view name, Family* out);

enum class PipelineSchedule : uint8_t { kGpipe = 0, k1F1B = 1, kInterleaved = 2, kDualPipe = 3 };
inline constexpr PipelineSchedule kAllPipelineSchedules[] = {
    PipelineSchedule::kGpipe, PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved,
    PipelineSchedule::kDualPipe};
// What the search tries when search.pipelines is empty (DualPipe when named).
inline constexpr PipelineSchedule kDefaultSearchPipelines[] = {
    PipelineSchedule::kGpipe, PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved};
// "gpipe", "1f1b", "interleaved", "dualpipe"
std::string_view PipelineScheduleName(PipelineSchedule s);
bool ParsePipelineSchedule(std::string_view name, PipelineSchedule* out);

// Megatron-Core's --moe-token-dispatcher-type: AlltoAll (linear or 2DH, the
// faster) or DeepEP's (flex; AllToAllAlgo::kDeepEp).
// kAllGather: Megatron-Core's allgather dispatcher (AllToAllAlgo::kAllGather),
// the small-EP choice.
enum class Dispatcher : uint8_t { kAllToAll = 0, kDeepEp = 1, kAllGather = 2 };
inline constexpr Dispatcher kAllDispatchers[] = {Dispatcher::kAllToAll, Dispatcher::kDeepEp,
                                                 Dispatcher::kAllGather};
std::string_view DispatcherName(Dispatcher d);  // "alltoall", "deepep", "allgather"
bool ParseDispatcher(std::string_view name, Dispatcher* out);

// Megatron-Core's --recompute-modules (selective recomputation; docs/layouts.md
// "Recomputation"): each module's forward runs again before its backward,
// and its activations are not kept. Bits of Layout::recompute_modules.
enum RecomputeModule : uint8_t {
  kRecomputeCoreAttn = 1 << 0,       // the attention core (scores, softmax, context)
  kRecomputeLayernorm = 1 << 1,      // the two norms before attention and the MLP / MoE
  kRecomputeMlp = 1 << 2,            // a dense block's MLP
  kRecomputeMoeAct = 1 << 3,         // the experts' activation
  kRecomputeSharedExperts = 1 << 4,  // the shared experts
  kRecomputeMlaUpProj = 1 << 5,      // MLA's query and key/value up projections
};
inline constexpr int kNumRecomputeModules = 6;
// "core_attn", "layernorm", "mlp", "moe_act", "shared_experts", "mla_up_proj"
// for module index i (bit 1 << i).
std::string_view RecomputeModuleName(int i);
// The bit of a module's name; false for an unknown name.
bool ParseRecomputeModule(std::string_view name, uint8_t* bit);

// One layout of P = dp * tp * cp * pp GPUs. Rank order: TP innermost
// (consecutive ranks of a node), then CP, then DP, then PP (stages on
// different nodes once a stage fills them). Experts: ESP innermost, then EP,
// then expert replicas, over the stage's tp * cp * dp ranks.
struct Layout {
  int dp = 1, tp = 1, pp = 1, ep = 1, esp = 1;
  // Megatron-Core's --context-parallel-size: each sequence split over cp
  // ranks, attention exchanging K/V around their ring (docs/layouts.md
  // "Context parallelism"); the cp ranks join dp for gradients and experts.
  int cp = 1;
  int microbatches = 1;  // m per iteration per replica
  int zero_stage = 0;
  Family family = Family::kParm;
  PipelineSchedule pipeline = PipelineSchedule::k1F1B;
  int virtual_stages = 1;  // v (interleaved)
  bool recompute = false;  // full activation recomputation
  // Selective recomputation: RecomputeModule bits (not with `recompute`).
  uint8_t recompute_modules = 0;
  // Megatron-Core's --sequence-parallel (tp >= 2; not ppmoe): docs/layouts.md.
  bool sequence_parallel = false;
  // Megatron-Core's --overlap-moe-expert-parallel-comm: in a pipeline's
  // steady state each forward runs with the backward after it, a
  // micro-batch's AlltoAlls under the other's compute (docs/layouts.md
  // "Overlapping micro-batches"). DualPipe always overlaps its pairs.
  bool a2a_overlap = false;
  Dispatcher dispatcher = Dispatcher::kAllToAll;
  // Megatron-Core's --overlap-param-gather (zero 1-2): each chunk's parameter
  // AllGathers after the step run under its next first forward (docs/layouts.md
  // "Overlapped parameter gathers").
  bool overlap_param_gather = false;
  // Megatron-Core's --tp-comm-overlap (sp): the TP sub-blocks' collectives
  // pipelined with their GEMMs (ParallelLayout::tp_comm_overlap).
  bool tp_comm_overlap = false;
  // The layers of each of the pp * virtual_stages stages, in forward order
  // (a parsed Megatron-Core pipeline layout, pipeline_layout.h); empty: the
  // layers spread evenly, the embedding first and the loss last.
  std::vector<PipelineStageLayers> stage_layers;

  int Gpus() const { return dp * tp * cp * pp; }
  // Model chunks each stage holds: v interleaved, 2 with DualPipe.
  int Chunks() const {
    return pipeline == PipelineSchedule::kDualPipe ? 2 : virtual_stages > 1 ? virtual_stages : 1;
  }
  // Micro-batches each chunk runs: DualPipe's two chunks half each.
  int ChunkMicrobatches() const {
    return pipeline == PipelineSchedule::kDualPipe ? microbatches / 2 : microbatches;
  }
  // Whether the pipeline runs overlapped forward-backward pairs.
  bool OverlapsPairs() const { return a2a_overlap || pipeline == PipelineSchedule::kDualPipe; }
  // Ranks a dense gradient is reduced over (Megatron-Core's DP x CP group).
  int GradientRanks() const { return dp * cp; }
  // Ranks holding the same expert shard (their gradients are synchronised).
  int ExpertReplicas() const {
    return family == Family::kPpMoe ? dp * cp : dp * cp * tp / (ep * esp);
  }
};

// The family a (dp, tp, cp, ep, esp) belongs to when none is named: ppmoe
// when ep * esp = tp > 1, dpmoe when esp = tp and ep < dp * cp or, with
// sequence parallelism, when ep * esp divides tp * cp * dp and is smaller (a
// folded expert grid), else parm.
// DeepEP's and the allgather dispatcher need expert parallelism over an
// exchange (a MoE model, ep >= 2, not ppmoe); the AlltoAll's fits any layout.
bool DispatcherApplies(const ModelConfig& m, const Layout& l, Dispatcher d);
Family InferFamily(const Layout& l);

// Field rules of a layout for `model` on `cluster` with `global_batch`
// sequences per iteration; errors InvalidArgument "layout.<field>: <rule> (got ...)",
// and ResourceExhausted for a pipeline over kMaxPipelineSteps.
absl::Status ValidateLayout(const ModelConfig& model, const Layout& layout, int64_t global_batch,
                            const ClusterShape& cluster);

// Steps of the layout's pipeline simulation (pp * virtual_stages *
// microbatches * 2) and the check of them against kMaxPipelineSteps.
int64_t PipelineSteps(const Layout& layout);
absl::Status CheckPipelineSteps(const Layout& layout);

// At most how many spans the layout's pipeline timeline holds
// (TracePipeline: every step, the send after it, each stage's tail), and
// the check of `spans` (the timelines of `candidates` layouts) against
// kMaxTimelineOps, before any is traced: ResourceExhausted naming
// include_timeline, the request field that asks for them, and ending with
// `remedy` (what to ask for instead).
int64_t PipelineSpans(const Layout& layout);
absl::Status CheckTimelineSpans(int64_t spans, size_t candidates, std::string_view remedy);

// A layout as it runs: microbatches 0 reads as pp, and one stage runs
// 1F1B (each micro-batch's backward after its forward). Not validated.
Layout ResolveLayout(const Layout& layout);

// The model as one stage of the layout runs it: micro_batch_size per
// micro-batch, parallel {mp = tp, ep, esp, dp = dp * cp, pp,
// sequence_parallel, cp}; with cp > 1 seq_length is each rank's seq_length / cp
// tokens of a sequence (attention reads the ring's cp chunks).
ModelConfig ModelForLayout(const ModelConfig& model, const Layout& layout,
                           int64_t micro_batch_size);

}  // namespace moeplan::planner
