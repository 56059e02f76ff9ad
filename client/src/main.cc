// moeplan: the command-line planner. Plans locally against built-in or file
// profiles, or asks a moeplan-server with --server (docs/service.md); fits and
// validates measured profiles (docs/calibration.md). This file wires the
// command line; each command lives in its own file (commands.h).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "commands.h"
#include "moeplan/base/flags.h"
#include "moeplan/base/strings.h"

namespace moeplan::client {
namespace {

// One line on stderr, non-zero exit. Messages echo input (file contents,
// flag values): other control bytes are written as \xNN, so nothing from
// the input reaches the terminal as an escape sequence.
int Fail(const absl::Status& s) {
  std::string msg;
  for (char c : View(s.message())) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '\n') {
      msg += ' ';
    } else if (u < 0x20 || u == 0x7f) {
      msg += fmt::format("\\x{:02x}", u);
    } else {
      msg += c;
    }
  }
  fmt::print(stderr, "moeplan: error: {}\n", msg);
  return 1;
}

// --server and how to reach it: --tls-ca for a server with --tls-cert,
// --token-file for one with --token-file. Returns the --server option.
CLI::Option* AddServerOptions(CLI::App* cmd, ClientOptions* o, const std::string& help) {
  CLI::Option* server = cmd->add_option("--server", o->address, help)->check(flags::NonEmpty());
  cmd->add_option("--tls-ca", o->tls_ca_file,
                  "With --server: PEM of the CA that signed the server's certificate (TLS)")
      ->check(flags::NonEmpty())
      ->needs(server);
  cmd->add_option("--token-file", o->token_file,
                  "With --server: file whose first line is the server's bearer token")
      ->check(flags::NonEmpty())
      ->needs(server);
  return server;
}

CLI::App* AddPlanLayer(CLI::App* app, PlanLayerArgs* a) {
  CLI::App* plan = app->add_subcommand(
      "plan-layer",
      "Simulate default, S1 and S2 for one MoE layer (forward + backward) and rank them");
  plan->add_option("--layer", a->layer, "Layer config (moeplan.v1.LayerConfig JSON)")
      ->required()
      ->check(flags::NonEmpty());
  plan->add_option("--cluster", a->cluster,
                   "Built-in profile name (see `moeplan profiles list`) or profile JSON file")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  plan->add_option("--schedules", a->schedules, "Comma-separated subset of default,s1,s2, or all")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  plan->add_option("--format", a->format, "Output format")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  plan->add_option("--trace", a->trace,
                   "Write a Chrome trace (open in Perfetto / chrome://tracing) to this file")
      ->check(flags::NonEmpty());
  plan->add_option("--html", a->html,
                   "Write a self-contained HTML report (tables, charts, the best schedule's "
                   "timeline) to this file")
      ->check(flags::NonEmpty());
  plan->add_flag("--no-timeline", a->no_timeline, "Leave the per-op timelines out of the output");
  AddServerOptions(plan, &a->server,
                   "Plan on a moeplan-server at host:port instead of locally (same output)");
  return plan;
}

// plan-model's layouts (docs/layouts.md): --search ranks them, --layout
// evaluates one; the options that tune them need one of the two.
void AddLayoutOptions(CLI::App* plan, PlanModelArgs* a) {
  CLI::Option* search =
      plan->add_flag("--search", a->search,
                     "Rank every (dp, tp, pp, ep, esp) layout of the GPUs with its ZeRO stage, "
                     "pipeline schedule and micro-batches (docs/layouts.md)");
  CLI::Option* layout =
      plan->add_option(
              "--layout", a->layout,
              "Evaluate one layout: dp=..,tp=..,pp=..[,cp=.. (context parallel, default "
              "1),ep=..,esp=.. (or etp=..; "
              "default 1; a dense model's must be 1),microbatches=..,zero=..,"
              "family=dpmoe|ppmoe|parm,"
              "pipeline=gpipe|1f1b|interleaved,v=..,recompute=0|1|MODULE+MODULE.. (selective: "
              "core_attn, layernorm, mlp, moe_act, shared_experts, mla_up_proj),sp=0|1,"
              "layout=STRING "
              "(last: "
              "Megatron-Core's --pipeline-model-parallel-layout, e.g. Et|(tt|)*30mL)]")
          ->check(flags::NonEmpty());
  search->excludes(layout);
  plan->add_option("--top", a->top, "With --search: candidates to print, best first")
      ->check(flags::IntInRange(1, 1000))
      ->needs(search)
      ->capture_default_str();
  plan->add_option("--gpus", a->gpus,
                   "With --search: GPUs to lay out (default: the profile's; more extrapolates "
                   "its link costs to more nodes)")
      ->check(flags::IntInRange(1, 1 << 20))
      ->needs(search);
  plan->add_option("--families", a->families, "With --search: subset of dpmoe,ppmoe,parm, or all")
      ->check(flags::NonEmpty())
      ->needs(search)
      ->capture_default_str();
  plan->add_option("--pipelines", a->pipelines,
                   "With --search: subset of gpipe,1f1b,interleaved,dualpipe, or all (all: the "
                   "first three; dualpipe when named)")
      ->check(flags::NonEmpty())
      ->needs(search)
      ->capture_default_str();
  plan->add_option("--zero-stages", a->zero_stages, "With --search: subset of 0,1,2,3, or all")
      ->check(flags::NonEmpty())
      ->needs(search)
      ->capture_default_str();
  plan->add_option("--sequence-parallel", a->sequence_parallel,
                   "With --search: try sequence parallelism off, on (where tp >= 2, not "
                   "ppmoe) or both; a --layout names it with sp=1")
      ->check(CLI::IsMember({"off", "on", "both"}))
      ->needs(search)
      ->capture_default_str();
  plan->add_option(
          "--dispatchers", a->dispatchers,
          "With --search: token dispatchers to try, alltoall, deepep, allgather (these two "
          "where ep >= 2, not ppmoe) or all; a --layout names one with dispatcher=")
      ->check(flags::NonEmpty())
      ->needs(search)
      ->capture_default_str();
  plan->add_option("--a2a-overlap", a->a2a_overlap,
                   "With --search: try Megatron-Core's A2A overlap across micro-batches off, on "
                   "(where ep >= 2 with one stage, interleaved or dualpipe) or both; a --layout "
                   "names it with a2a_overlap=1")
      ->check(CLI::IsMember({"off", "on", "both"}))
      ->needs(search)
      ->capture_default_str();
  plan->add_option("--balanced-pipeline", a->balanced_pipeline,
                   "With --search: split pipelines evenly (off), by FLOPs with the embedding, MTP "
                   "depths and loss counted with their stages (on), or try both; a --layout "
                   "names a split with layout=")
      ->check(CLI::IsMember({"off", "on", "both"}))
      ->needs(search)
      ->capture_default_str();
  plan->add_option("--context-parallel", a->context_parallel,
                   "With --search: context-parallel degrees to try, e.g. 1,2,4 (where seq_length "
                   "divides by 2*cp and attention is fused); a --layout names it with cp=")
      ->check(flags::NonEmpty())
      ->needs(search)
      ->capture_default_str();
  plan->add_option("--expert-tensor-parallel", a->expert_tensor_parallel,
                   "With --search and --sequence-parallel on|both: expert tensor-parallel "
                   "degrees to try as folded expert grids (etp != tp) beside each dpmoe layout, "
                   "e.g. 1; a --layout names it with etp=")
      ->check(flags::NonEmpty())
      ->needs(search);
  plan->add_option("--max-microbatches", a->max_microbatches,
                   "With --search: most micro-batches per iteration tried")
      ->check(flags::IntInRange(1, 4096))
      ->needs(search)
      ->capture_default_str();
  plan->add_flag("--exhaustive", a->exhaustive,
                 "With --search: simulate every layout that fits instead of stopping at the "
                 "lower bound (slower; for measured profiles whose small messages cost less "
                 "per byte than large ones)")
      ->needs(search);
  plan->add_flag("--overlap-param-gather", a->overlap_param_gather,
                 "With --search: Megatron-Core's --overlap-param-gather on every candidate with "
                 "zero 1 or 2 (the parameter AllGathers under the next forward; --layout: "
                 "overlap_param_gather=1)")
      ->needs(search);
  plan->add_flag("--tp-comm-overlap", a->tp_comm_overlap,
                 "With --search: Megatron-Core's --tp-comm-overlap on every candidate with "
                 "sequence parallelism (TP collectives pipelined with their GEMMs; --layout: "
                 "tp_comm_overlap=1)")
      ->needs(search);
  // The memory check sizes layouts: with --search or --layout, never alone,
  // where it would be ignored.
  const CLI::Option* memory[] = {
      plan->add_option("--gpu-memory-gib", a->gpu_memory_gib,
                       "With --search or --layout: GPU memory for the memory check (default: "
                       "the profile's gpu_memory_gib; 0: no check)")
          ->check(flags::FiniteInRange(0.0, 1e6)),
      plan->add_option("--optimizer-bytes", a->optimizer_bytes,
                       "With --search or --layout: optimizer state bytes per parameter (Adam's "
                       "fp32 master + moments)")
          ->check(flags::FiniteInRange(0.0, 1024.0))
          ->capture_default_str(),
      plan->add_option("--grad-bytes", a->grad_bytes,
                       "With --search or --layout: gradient bytes per parameter")
          ->check(flags::FiniteInRange(0.0, 1024.0))
          ->capture_default_str(),
  };
  plan->parse_complete_callback([=] {
    if (search->count() > 0 || layout->count() > 0) return;
    for (const CLI::Option* o : memory) {
      if (o->count() > 0)
        throw CLI::ValidationError(o->get_name(), "only with --search or --layout");
    }
  });
}

// What a Hugging Face config.json does not say (plan-model and import-hf);
// plan-model refuses them with a native model file.
void AddHfOptions(CLI::App* cmd, HfFlags* f, std::string_view only) {
  // "Sequence length", or after `only` "...: sequence length".
  const auto help = [only](std::string text) {
    if (!only.empty()) {
      text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
    }
    return Cat(only, text);
  };
  cmd->add_option("--seq-length", f->seq_length, help("Sequence length (default 4096)"))
      ->check(flags::IntInRange(1, 1 << 24));
  cmd->add_option("--micro-batch-size", f->micro_batch_size,
                  help("Sequences per micro-batch (default 1)"))
      ->check(flags::IntInRange(1, 1 << 24));
  cmd->add_option(
         "--global-batch-size", f->global_batch_size,
         help("Sequences per iteration (default unset: micro-batch size x parallel.dp, and "
              "an import's dp is 1: give it with --layout or --search)"))
      ->check(flags::IntInRange(1, 1 << 24));
  cmd->add_option("--fp8-format", f->fp8_format,
                  help("FP8 training (Megatron-LM's --fp8-format): the linear layers' GEMMs in "
                       "FP8, the rest in BF16 (default: BF16 only)"))
      ->check(CLI::IsMember({"e4m3", "hybrid"}));
  cmd->add_option("--fp8-recipe", f->fp8_recipe,
                  help("FP8 scaling (--fp8-recipe; default delayed; needs --fp8-format)"))
      ->check(CLI::IsMember({"delayed", "tensorwise", "blockwise", "mxfp8"}));
  cmd->add_flag("--fp8-param-gather", f->fp8_param_gather,
                help("FP8 weights, gathered in FP8 (--fp8-param-gather; needs --fp8-format)"));
}

CLI::App* AddImportHf(CLI::App* app, ImportHfArgs* a) {
  CLI::App* cmd = app->add_subcommand(
      "import-hf",
      "Print the moeplan ModelConfig of a Hugging Face config.json (mixtral, qwen2_moe, "
      "qwen3_moe, deepseek_v2, deepseek_v3, olmoe), and on stderr what became of each key");
  cmd->add_option("config", a->config, "The model's config.json")
      ->required()
      ->check(flags::NonEmpty());
  AddHfOptions(cmd, &a->hf, "");
  cmd->add_option("-o,--out", a->out, "Write the ModelConfig JSON to this file instead")
      ->check(flags::NonEmpty());
  return cmd;
}

CLI::App* AddPlanModel(CLI::App* app, PlanModelArgs* a) {
  CLI::App* plan = app->add_subcommand(
      "plan-model",
      "Simulate a whole model (forward + backward + gradient sync) under every overlap variant "
      "(none, tutel, dw, partition, lancet), each with every MoE schedule and AlltoAll "
      "algorithm, and compare them");
  plan->add_option("--model", a->model,
                   "Model config (moeplan.v1.ModelConfig JSON), or a Hugging Face config.json "
                   "(see import-hf)")
      ->required()
      ->check(flags::NonEmpty());
  AddHfOptions(plan, &a->hf, "With a Hugging Face config.json as --model: ");
  plan->add_option("--cluster", a->cluster,
                   "Built-in profile name (see `moeplan profiles list`) or profile JSON file")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  plan->add_option("--variants", a->variants,
                   "Comma-separated subset of none,tutel,dw,partition,lancet, or all")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  plan->add_option("--schedules", a->schedules,
                   "MoE schedules to try: subset of default,s1,s2, or all (s1/s2 need mp > 1)")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  plan->add_option("--alltoall", a->alltoall,
                   "AlltoAll algorithms to try: linear, 2dh (hierarchical), deepep (DeepEP's "
                   "node-deduplicated dispatch), or all (linear and 2dh; a --layout names "
                   "deepep with dispatcher=deepep)")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  plan->add_option("--bucket-mb", a->bucket_mb, "DDP gradient bucket size in MiB")
      ->check(flags::FiniteAbove(0.0, 1048576.0))
      ->capture_default_str();
  plan->add_option("--partition-max-k", a->partition_max_k,
                   "Most micro-batches a partitioned range is split into (Lancet's rho)")
      ->check(flags::IntInRange(1, 64))
      ->capture_default_str();
  plan->add_option("--partition-groups", a->partition_groups,
                   "Groups of dense ops between two MoE layers (Lancet's gamma)")
      ->check(flags::IntInRange(1, 64))
      ->capture_default_str();
  plan->add_option("--partition-max-span", a->partition_max_span,
                   "Longest range in groups (Lancet's iota); 0: the span between two MoE layers")
      ->check(flags::IntInRange(0, 1024))
      ->capture_default_str();
  plan->add_option("--max-plan-seconds", a->max_plan_seconds,
                   "Longest the plan (or the search) may run before it is stopped with an error, "
                   "as moeplan-server's flag of that name; with --server, the call's deadline")
      ->check(flags::FiniteInRange(0.001, 86400.0))
      ->capture_default_str();
  plan->add_option("--format", a->format, "Output format")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  plan->add_option("--trace", a->trace,
                   "Write a Chrome trace (one process per variant, one track per resource)")
      ->check(flags::NonEmpty());
  plan->add_option("--html", a->html,
                   "Write a self-contained HTML report (ranked candidates with filters, "
                   "throughput against memory, time and memory breakdowns, the top ten's "
                   "pipelines, launcher arguments) to this file")
      ->check(flags::NonEmpty());
  plan->add_flag("--timeline", a->timeline,
                 "Include every op's timing in the JSON output (with --search or --layout: each "
                 "candidate's pipeline of one iteration)");
  AddServerOptions(plan, &a->server,
                   "Plan on a moeplan-server at host:port instead of locally (same output)");
  AddLayoutOptions(plan, a);
  return plan;
}

CLI::App* AddSweep(CLI::App* app, SweepArgs* a) {
  CLI::App* sweep = app->add_subcommand(
      "sweep",
      "Plan every config of a grid (cartesian product of lists) and summarise the choices");
  sweep->add_option("--grid", a->grid, "Grid file (moeplan.v1.LayerGrid JSON)")
      ->required()
      ->check(flags::NonEmpty());
  sweep->add_option("--cluster", a->cluster, "Built-in profile name or profile JSON file")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  sweep->add_option("--schedules", a->schedules, "Comma-separated subset of default,s1,s2, or all")
      ->check(flags::NonEmpty())
      ->capture_default_str();
  sweep->add_option("--out", a->out, "CSV file to write (one row per config)")
      ->required()
      ->check(flags::NonEmpty());
  sweep->add_flag("--skip-invalid", a->skip_invalid,
                  "Skip configs that fail validation (counted in the summary) instead of failing");
  return sweep;
}

// `profiles list|show|get|put` share their values; dispatch asks which one ran
// (list when none of these).
struct ProfilesCli {
  ClientOptions server;
  std::string name;  // show, get
  std::string file;  // put
  CLI::App* show = nullptr;
  CLI::App* get = nullptr;
  CLI::App* put = nullptr;
};

void AddProfiles(CLI::App* app, ProfilesCli* a) {
  CLI::App* profiles =
      app->add_subcommand("profiles", "Cluster profiles (built-in, or a server's)");
  profiles->require_subcommand(1);
  CLI::App* list = profiles->add_subcommand("list", "List the profiles");
  AddServerOptions(list, &a->server, "List a moeplan-server's profiles (host:port)");
  a->show = profiles->add_subcommand("show", "Print a profile (name or file) as JSON");
  a->show->add_option("name", a->name, "Profile name or file")
      ->required()
      ->check(flags::NonEmpty());
  AddServerOptions(a->show, &a->server, "Ask a moeplan-server (host:port)");
  a->get = profiles->add_subcommand("get", "Print a profile as JSON (same as show)");
  a->get->add_option("name", a->name, "Profile name or file")->required()->check(flags::NonEmpty());
  AddServerOptions(a->get, &a->server, "Ask a moeplan-server (host:port)");
  a->put = profiles->add_subcommand("put", "Store a profile file on a moeplan-server");
  a->put->add_option("file", a->file, "Profile JSON (moeplan.v1.ClusterProfile)")
      ->required()
      ->check(flags::NonEmpty());
  AddServerOptions(a->put, &a->server, "The moeplan-server (host:port)")->required();
}

CLI::App* AddCalibrate(CLI::App* app, CalibrateArgs* a) {
  CLI::App* calibrate = app->add_subcommand(
      "calibrate",
      "Fit a measured cluster profile (alpha-beta per collective and link, GEMM efficiency, "
      "memory bandwidth) from moeplan-profile samples and report how well each fit holds; or "
      "(--published) calibrate spec profiles to the software stack of published training runs");
  CLI::Option* samples =
      calibrate->add_option("--samples", a->samples, "Samples from moeplan-profile (JSON Lines)")
          ->check(flags::NonEmpty());
  calibrate
      ->add_option("--out", a->out,
                   "Profile JSON to write (with --from-server: a copy of the new version)")
      ->check(flags::NonEmpty());
  CLI::Option* from_server =
      calibrate
          ->add_option("--from-server", a->from_server.address,
                       "Instead of --samples: refit --profile on this moeplan-server from the "
                       "measurements jobs reported to it (in-context op corrections on top of "
                       "the profile's own fits); the server stores the next version")
          ->check(flags::NonEmpty())
          ->excludes(samples);
  calibrate->add_option("--profile", a->profile, "With --from-server: the stored profile's name")
      ->check(flags::NonEmpty())
      ->needs(from_server);
  calibrate
      ->add_option("--tls-ca", a->from_server.tls_ca_file,
                   "With --from-server: PEM of the CA that signed the server's certificate (TLS)")
      ->check(flags::NonEmpty())
      ->needs(from_server);
  calibrate
      ->add_option("--token-file", a->from_server.token_file,
                   "With --from-server: file whose first line is the server's bearer token")
      ->check(flags::NonEmpty())
      ->needs(from_server);
  calibrate->add_option("--name", a->name, "Profile name (default: the --out file's stem)")
      ->check(flags::NonEmpty());
  calibrate->add_option("--comment", a->comment, "Free text added to the profile's comment");
  calibrate
      ->add_option("--version", a->version,
                   "Profile version: bump it when re-calibrating a profile of the same name, so "
                   "servers and clients see the numbers changed")
      ->check(flags::IntInRange(1, 1000000))
      ->capture_default_str();
  calibrate
      ->add_option("--tolerance", a->tolerance_pct,
                   "Relative error (%) under which a fit counts as holding")
      ->check(flags::FiniteAbove(0.0, 1e6))
      ->capture_default_str();
  calibrate
      ->add_option("--repeat-tolerance", a->repeat_tolerance_pct,
                   "Samples of several rounds (moeplan-profile --rounds): a point whose rounds' "
                   "medians differ by more than this (%) is listed in the fit report")
      ->check(flags::FiniteInRange(0.0, 1e6))
      ->capture_default_str();
  CLI::Option* published =
      calibrate
          ->add_option("--published", a->published,
                       "Instead of --samples: calibrate the spec profiles a dataset of published "
                       "training runs names (a file or a directory of moeplan.v1.PublishedRun "
                       "JSON, e.g. calibration/published) to their software stack: GEMM "
                       "efficiency per GPU, the GEMM curve's knee and the MoE token permutation's "
                       "share of memory bandwidth, in sample and leave-one-case-out")
          ->check(flags::NonEmpty())
          ->excludes(samples)
          ->excludes(from_server);
  calibrate
      ->add_option("--out-dir", a->out_dir,
                   "With --published: directory to write the calibrated profiles into (one "
                   "<profile>.json per profile the cases name; created if missing)")
      ->check(flags::NonEmpty())
      ->needs(published);
  calibrate
      ->add_flag("--json", a->json,
                 "With --published: the report as JSON (moeplan.v1.PublishedFitReport)")
      ->needs(published);
  calibrate
      ->add_flag("--no-holdout", a->no_holdout,
                 "With --published: skip the leave-one-case-out fits (one fit per case)")
      ->needs(published);
  calibrate
      ->add_option(
          "--comm-from", a->comm_from,
          "Samples of one rank (one GPU measures no link): take the links, collective fits, "
          "in-context costs and node layout from this profile (built-in name or file) and fit only "
          "GEMM and memory")
      ->check(flags::NonEmpty());
  return calibrate;
}

CLI::App* AddValidate(CLI::App* app, ValidateArgs* a) {
  CLI::App* validate = app->add_subcommand(
      "validate",
      "Run moeplan-exec (under mpirun) on every config of a grid and schedule (or every model "
      "and overlap variant), predict the same with the planner, and report the error (Markdown "
      "+ PNG scatter plot)");
  CLI::Option* profile =
      validate->add_option("--profile", a->profile, "Profile to validate (name or file)")
          ->check(flags::NonEmpty());
  CLI::Option* layers =
      validate->add_option("--layers", a->layers, "Layer grid (moeplan.v1.LayerGrid JSON)")
          ->check(flags::NonEmpty());
  CLI::Option* models =
      validate
          ->add_option("--models", a->models,
                       "Whole models instead (moeplan.v1.ModelGrid JSON): each run with "
                       "moeplan-exec --model --variant all")
          ->check(flags::NonEmpty())
          ->excludes(layers);
  validate->add_option("--ranks", a->ranks, "Ranks to launch (default: the profile's nodes x GPUs)")
      ->check(flags::PositiveInt());
  validate
      ->add_option("--launcher", a->launcher,
                   "Shell text that launches moeplan-exec; {ranks} is replaced")
      ->capture_default_str();
  validate->add_option("--exec", a->exec, "moeplan-exec binary (default: next to moeplan)")
      ->check(flags::NonEmpty());
  validate
      ->add_option("--backend", a->backend,
                   "moeplan-exec's backend: mpi (CPU, host buffers) or nccl (GPU; the profile "
                   "should be measured with it too)")
      ->check(CLI::IsMember({"mpi", "nccl"}))
      ->capture_default_str();
  validate
      ->add_option("--mpi-wait", a->mpi_wait,
                   "moeplan-exec --mpi-wait on the mpi backend: spin or sleep (default: as the "
                   "profile was measured, spin if it does not say)")
      ->check(CLI::IsMember({"spin", "sleep"}));
  validate->add_option("--iters", a->iters, "Timed iterations per schedule or variant")
      ->check(flags::IntInRange(1, 1000000))
      ->capture_default_str();
  validate
      ->add_option("--skew", a->skew,
                   "moeplan-exec --skew: bias every config's gate by a Zipf law of this exponent "
                   "(0: none); dropless configs are predicted at their measured heaviest-rank load")
      ->check(flags::FiniteInRange(0.0, 16.0))
      ->capture_default_str();
  validate->add_option("--warmup", a->warmup, "Untimed iterations first")
      ->check(flags::IntInRange(0, 1000000))
      ->capture_default_str();
  validate
      ->add_option("--out-dir", a->out_dir,
                   "Directory for report.md, plot.png and the runs' files (default: none; the "
                   "runs' files go to a temporary directory, removed afterwards, and only the "
                   "summary is printed; --holdout needs it for refit-profile.json). With "
                   "--published: report.md, report.json and plot.png")
      ->check(flags::NonEmpty());
  validate->add_flag("--json", a->json, "Print the summary as JSON (moeplan.v1.ValidationSummary)");
  validate
      ->add_option("--html", a->html,
                   "Also write a self-contained HTML report (predicted against measured per "
                   "config, errors per op kind) to this file")
      ->check(flags::NonEmpty());
  CLI::Option* replay = validate->add_flag(
      "--replay", a->replay,
      "Also replay each run's measured op durations on the plan that ran: the composition error "
      "(replay vs measured) and the cost error (prediction vs replay) per config, and the ops "
      "that waited for what the plan does not have");
  validate
      ->add_option("--holdout", a->holdout,
                   "Hold out this fraction of the configs (of each layout): fit in-context op "
                   "corrections on the rest, report the error on both parts, and write the "
                   "refitted profile to OUT_DIR/refit-profile.json (0: no split)")
      ->check(flags::FiniteInRange(0.0, 0.9))
      ->capture_default_str();
  validate->add_option("--seed", a->seed, "Seed of the --holdout split")
      ->check(flags::IntInRange(0, INT64_MAX))
      ->capture_default_str();
  CLI::Option* published =
      validate
          ->add_option("--published", a->published,
                       "A dataset of published training runs (a moeplan.v1.PublishedRun JSON, or "
                       "a directory of them, e.g. calibration/published): predict each at its "
                       "layout on its own profile, no execution, and report the error in model "
                       "TFLOP/s per GPU")
          ->check(flags::NonEmpty());
  validate
      ->add_flag(
          "--search", a->search,
          "with --published: also search each case's model on its GPUs (the default axes and "
          "every opt-in axis its layout uses) and report the best predicted layout")
      ->needs(published);
  validate
      ->add_option("--profile-overrides", a->profile_overrides,
                   "with --published: profile files (e.g. a calibrated h100-8x8.json) used in "
                   "place of the built-in profiles of the same name the cases name; "
                   "comma-separated or repeated")
      ->delimiter(',')
      ->check(flags::NonEmpty())
      ->needs(published);
  published->excludes(profile);
  published->excludes(layers);
  published->excludes(models);
  published->excludes(replay);
  validate
      ->add_option("--from-runs", a->from_runs,
                   "Re-predict the moeplan-exec reports of an earlier --out-dir "
                   "(DIR/exec/NNN.json, same grid) "
                   "instead of running moeplan-exec")
      ->check(flags::NonEmpty());
  return validate;
}

CLI::App* AddProfileCheck(CLI::App* app, ProfileCheckArgs* a) {
  CLI::App* check = app->add_subcommand(
      "profile-check",
      "Re-measure a few points (GEMMs, memory kernels, each link level, an AlltoAll per group "
      "shape; under a minute) with moeplan-profile --check under mpirun, and report how far each "
      "cost-model term has drifted from the profile; exit 1 beyond the threshold (stale)");
  check->add_option("--profile", a->profile, "Profile to check (name or file)")
      ->required()
      ->check(flags::NonEmpty());
  check->add_option("--ranks", a->ranks, "Ranks to launch (default: the profile's nodes x GPUs)")
      ->check(flags::PositiveInt());
  check
      ->add_option("--launcher", a->launcher,
                   "Shell text that launches moeplan-profile; {ranks} is replaced")
      ->capture_default_str();
  check->add_option("--profiler", a->profiler, "moeplan-profile binary (default: next to moeplan)")
      ->check(flags::NonEmpty());
  check
      ->add_option("--samples", a->samples,
                   "Compare these moeplan-profile samples instead of measuring")
      ->check(flags::NonEmpty());
  check
      ->add_option("--out-dir", a->out_dir,
                   "Keep the samples taken here as check.jsonl (default: a temporary directory, "
                   "removed afterwards). Where rank 0 runs on another host, give a directory on a "
                   "shared filesystem")
      ->check(flags::NonEmpty());
  check
      ->add_option("--threshold-pct", a->threshold_pct,
                   "A term whose median drift exceeds this (in %) makes the profile stale")
      ->check(flags::FiniteAbove(0.0, 1e6))
      ->capture_default_str();
  return check;
}

int Main(int argc, char** argv) {
  CLI::App app{"moeplan: plan communication schedules for distributed MoE training"};
  app.require_subcommand(1);
  // MOEPLAN_VERSION: the project's version (client/CMakeLists.txt).
  app.set_version_flag("--version", "moeplan " MOEPLAN_VERSION);
  // Usage errors on one line too, like every other error.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("moeplan: error: {} (see moeplan --help)\n", e.what());
  });

  PlanLayerArgs pl;
  PlanModelArgs pm;
  SweepArgs sw;
  ProfilesCli pr;
  CalibrateArgs ca;
  ValidateArgs va;
  CLI::App* plan = AddPlanLayer(&app, &pl);
  CLI::App* plan_model = AddPlanModel(&app, &pm);
  CLI::App* sweep = AddSweep(&app, &sw);
  AddProfiles(&app, &pr);
  CLI::App* calibrate = AddCalibrate(&app, &ca);
  CLI::App* validate = AddValidate(&app, &va);
  ProfileCheckArgs pc;
  CLI::App* profile_check = AddProfileCheck(&app, &pc);
  ImportHfArgs ih;
  CLI::App* import_hf = AddImportHf(&app, &ih);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  absl::Status status;
  if (plan->parsed()) {
    status = PlanLayerCmd(pl);
  } else if (plan_model->parsed()) {
    status = PlanModelCmd(pm);
  } else if (sweep->parsed()) {
    status = SweepCmd(sw);
  } else if (calibrate->parsed()) {
    status = ca.published.empty() ? CalibrateCmd(ca) : CalibratePublishedCmd(ca);
  } else if (validate->parsed()) {
    va.out_dir_given = validate->get_option("--out-dir")->count() > 0;
    status = va.published.empty() ? ValidateCmd(va) : ValidatePublishedCmd(va);
  } else if (profile_check->parsed()) {
    status = ProfileCheckCmd(pc);
  } else if (import_hf->parsed()) {
    status = ImportHfCmd(ih);
  } else if (pr.show->parsed() || pr.get->parsed()) {
    status = ProfilesShowCmd(pr.name, pr.server);
  } else if (pr.put->parsed()) {
    status = ProfilesPutCmd(pr.file, pr.server);
  } else {
    status = ProfilesListCmd(pr.server);
  }
  return status.ok() ? 0 : Fail(status);
}

}  // namespace
}  // namespace moeplan::client

int main(int argc, char** argv) { return moeplan::client::Main(argc, argv); }
