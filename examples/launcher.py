#!/usr/bin/python3
"""A training launcher that asks a running moeplan-server how to train.

Two modes.

One MoE layer (the default): which schedule (default, S1, S2) to use.

    /usr/bin/python3 examples/launcher.py --server 127.0.0.1:50051 \\
        [--layer examples/gpt2-moe-layer.json] [--cluster a100-8x8] [--stubs DIR]

Prints the chosen schedule, its predicted time per MoE layer (forward + backward,
microseconds), the margin over the runner-up, and the parallel flags it would pass
to a Megatron/DeepSpeed-style training script, e.g.

    training flags: --tensor-model-parallel-size 4 --expert-parallel-size 16
        --expert-slicing-size 4 --data-parallel-size 16 --moe-schedule s2

A whole model (--model): which parallel layout to train with (PlanModel's layout
search, docs/model.md).

    /usr/bin/python3 examples/launcher.py --server 127.0.0.1:50051 \\
        --model examples/models/gpt3-medium-moe.json --cluster v100-8x8 \\
        [--search] [--gpus 32] [--top 5]
    /usr/bin/python3 examples/launcher.py --server 127.0.0.1:50051 \\
        --model examples/models/gpt3-medium-moe.json --cluster v100-8x8 \\
        --layout dp=8,tp=4,pp=1,ep=8,esp=4[,cp=2,microbatches=4,zero=1,family=parm,
                 pipeline=1f1b,v=2,recompute=1|core_attn+moe_act,sp=1,a2a_overlap=1,
                 dispatcher=deepep,layout=Et|(tt|)*3L]

--model FILE is a moeplan.v1.ModelConfig JSON (examples/models/). --search (the
default with --model) ranks every layout on --gpus GPUs (default: the whole
cluster) and keeps the best --top (default 5); --layout evaluates one layout
(keys dp, tp, pp, ep, esp (or Megatron-Core's etp) required; cp (context
parallelism; printed back as --context-parallel-size), microbatches, zero, family (dpmoe, ppmoe,
parm), pipeline (gpipe, 1f1b, interleaved, dualpipe), v (virtual stages), recompute
(0/1 full, or modules such as core_attn+moe_act: selective, printed back as
--recompute-modules), sp (sequence parallelism, 0/1; printed back as --sequence-parallel),
a2a_overlap (0/1; printed back as --overlap-moe-expert-parallel-comm), overlap_param_gather
and tp_comm_overlap (0/1; printed back as --overlap-param-gather, --tp-comm-overlap), dispatcher
(alltoall or deepep; printed back as --moe-token-dispatcher-type) and,
last, layout (Megatron-Core's pipeline layout string, which may hold
commas; printed back as --pipeline-model-parallel-layout) optional). It prints the ranked table (rank, family, dp/tp/pp/ep/esp,
micro-batches m, ZeRO stage, pipeline, iteration time, tokens/s per GPU, memory
per GPU), the search's counts, and for the best candidate two lines, as the server
built them (LayoutCandidate.megatron_args and deepspeed_config):

    megatron flags: --tensor-model-parallel-size 4 --pipeline-model-parallel-size 1
        --expert-model-parallel-size 8 --expert-tensor-parallel-size 4 --num-experts 64
        --moe-router-topk 2 --micro-batch-size 4 --global-batch-size 256 ...
    deepspeed config: {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4, ...}

On failure it prints one line, `launcher: error: CODE: message` (the server's
message names the field, e.g. `layer.top_k: must be <= num_experts (...)` or
`layout.tp: ...`), on stderr and exits 1; so does a malformed --layout
(`launcher: error: --layout: unknown key 'foo' (known: ...)`), an infeasible
--layout (the reason: which memory term does not fit) and a search that finds no
feasible layout.

The generated Python stubs are looked up in --stubs DIR, else in the directories
of $MOEPLAN_PYTHONPATH, else in build/client/python under the repository root
(build them with `ninja -C build moeplan_python_stubs`), else where Python finds
an installed moeplan_client (`cmake --install`, the Debian package). Run it with Debian's
/usr/bin/python3, which sees python3-grpcio and python3-protobuf.
"""

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_LAYER = os.path.join(REPO, "examples", "gpt2-moe-layer.json")
DEFAULT_STUBS = os.path.join(REPO, "build", "client", "python")
STUB_MARKER = os.path.join("moeplan", "v1", "service_pb2_grpc.py")


def fail(message: str):
    print("launcher: error: " + " ".join(str(message).split("\n")), file=sys.stderr)
    sys.exit(1)


def stub_dirs(args) -> list:
    if args.stubs:
        return [args.stubs]
    env = [d for d in os.environ.get("MOEPLAN_PYTHONPATH", "").split(os.pathsep) if d]
    return env or [DEFAULT_STUBS]


def import_client(dirs: list):
    found = [d for d in dirs if os.path.isfile(os.path.join(d, STUB_MARKER))]
    if not found and dirs == [DEFAULT_STUBS]:
        # No build tree here: the installed client (cmake --install, the .deb).
        try:
            import moeplan_client
            return moeplan_client
        except ImportError:
            pass
    if not found:
        fail("no generated Python stubs (moeplan/v1/service_pb2_grpc.py) in "
             + ", ".join(dirs) + "; build them with `ninja -C build moeplan_python_stubs`, "
             "or pass --stubs DIR / set MOEPLAN_PYTHONPATH")
    for d in reversed(dirs):
        sys.path.insert(0, os.path.abspath(d))
    # The wrapper from this checkout (a copy also sits next to the stubs).
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    try:
        import moeplan_client
    except ImportError as e:
        fail(str(e))
    return moeplan_client


def training_flags(layer: dict, plan: dict, schedule: str) -> list:
    """Megatron/DeepSpeed-style flags for the layer's parallel layout."""
    par = layer.get("parallel", {})
    mp, ep, esp = int(par.get("mp", 1)), int(par.get("ep", 1)), int(par.get("esp", 1))
    pp = int(par.get("pp", 1))
    if "dp" in par:
        dp = int(par["dp"])
    else:
        ranks = int(plan.get("derived", {}).get("ranks", 0))
        dp = ranks // (mp * pp)  # ranks = mp * dp * pp
    flags = ["--tensor-model-parallel-size", str(mp),
             "--expert-parallel-size", str(ep),
             "--expert-slicing-size", str(esp),
             "--data-parallel-size", str(dp)]
    if "pp" in par:
        flags += ["--pipeline-model-parallel-size", str(pp)]
    return flags + ["--moe-schedule", schedule]


# --- whole-model mode -----------------------------------------------------------

# --layout keys: name -> (Layout field, kind). Kinds: "int" (>= 0), "bool", or a
# tuple of the accepted strings.
LAYOUT_KEYS = {
    "dp": ("dp", "int"),
    "tp": ("tp", "int"),
    "pp": ("pp", "int"),
    "ep": ("ep", "int"),
    "esp": ("esp", "int"),
    # Megatron-Core's name for esp (--expert-tensor-parallel-size): give one of the two.
    "etp": ("esp", "int"),
    # Megatron-Core's --context-parallel-size (unset: 1).
    "cp": ("cp", "int"),
    "microbatches": ("microbatches", "int"),
    "zero": ("zero_stage", "int"),
    "family": ("family", ("dpmoe", "ppmoe", "parm")),
    "pipeline": ("pipeline", ("gpipe", "1f1b", "interleaved", "dualpipe")),
    "v": ("virtual_stages", "int"),
    # 0/1 (full), or Megatron-Core's --recompute-modules joined by '+' (selective).
    "recompute": ("recompute", "recompute"),
    "sp": ("sequence_parallel", "bool"),
    # Megatron-Core's --overlap-moe-expert-parallel-comm (0/1).
    "a2a_overlap": ("a2a_overlap", "bool"),
    # Megatron-Core's --overlap-param-gather (0/1; zero 1-2) and --tp-comm-overlap (0/1; sp).
    "overlap_param_gather": ("overlap_param_gather", "bool"),
    "tp_comm_overlap": ("tp_comm_overlap", "bool"),
    # Megatron-Core's --moe-token-dispatcher-type (deepep: flex with the DeepEP backend).
    "dispatcher": ("dispatcher", ("alltoall", "deepep", "allgather")),
    # Megatron-Core's --pipeline-model-parallel-layout (it may hold commas: last).
    "layout": ("pipeline_model_parallel_layout", "str"),
}
LAYOUT_REQUIRED = ("dp", "tp", "pp", "ep", "esp")
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe_act", "shared_experts", "mla_up_proj")
DEFAULT_TOP = 5


def parse_layout(spec: str) -> dict:
    """`dp=8,tp=4,pp=1,ep=8,esp=4[,microbatches=..,zero=..,family=..,pipeline=..,v=..,
    recompute=..,sp=..,layout=..]` -> a moeplan.v1.Layout dict. Errors name the key."""
    known = ", ".join(LAYOUT_KEYS)
    layout = {}
    seen = set()
    head, sep, rest = spec.partition("layout=")
    if sep and (not head or head.endswith(",")):
        # layout= takes the rest of the spec: a pipeline layout may hold commas.
        items = (head[:-1].split(",") if head else []) + ["layout=" + rest]
    else:
        items = spec.split(",")
    for item in items:
        item = item.strip()
        if not item:
            fail(f"--layout: empty item in {spec!r} (want key=value,key=value,...; "
                 f"known: {known})")
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if key not in LAYOUT_KEYS:
            fail(f"--layout: unknown key {key!r} (known: {known})")
        if not eq or not value:
            fail(f"--layout: {key} needs a value ({key}=...)")
        if key in seen:
            fail(f"--layout: {key} given twice")
        if key in ("esp", "etp") and {"esp", "etp"} & seen:
            fail("--layout: esp and etp name the same degree (etp is Megatron-Core's name); "
                 "give one")
        seen.add("esp" if key == "etp" else key)
        field, kind = LAYOUT_KEYS[key]
        if kind == "int":
            try:
                number = int(value, 10)
            except ValueError:
                number = -1
            positive = key in LAYOUT_REQUIRED or key in ("etp", "cp")
            if number < 0 or (positive and number < 1):
                least = 1 if positive else 0
                fail(f"--layout: {key} must be an integer >= {least} (got {value!r})")
            layout[field] = number
        elif kind == "bool":
            lowered = value.lower()
            if lowered not in ("0", "1", "false", "true", "no", "yes"):
                fail(f"--layout: {key} must be 0 or 1 (got {value!r})")
            layout[field] = lowered in ("1", "true", "yes")
        elif kind == "str":
            layout[field] = value
        elif kind == "recompute":
            lowered = value.lower()
            if lowered in ("0", "1", "false", "true", "no", "yes"):
                layout["recompute"] = lowered in ("1", "true", "yes")
            else:
                modules = value.split("+")
                unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
                if unknown:
                    fail(f"--layout: recompute must be 0, 1 or modules joined by + "
                         f"({', '.join(RECOMPUTE_MODULES)}) (got {unknown[0]!r})")
                layout["recompute_modules"] = modules
        else:
            if value not in kind:
                fail(f"--layout: {key} must be one of {', '.join(kind)} (got {value!r})")
            layout[field] = value
    missing = [k for k in LAYOUT_REQUIRED if k not in seen]
    if missing:
        fail(f"--layout: missing {', '.join(missing)} (required: {', '.join(LAYOUT_REQUIRED)})")
    return layout


def _int(value, default=0) -> int:
    """int64 fields come back as JSON strings."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def print_candidates(candidates: list) -> None:
    print(f"{'rank':>4} {'family':<6} {'dp':>4} {'tp':>3} {'pp':>3} {'ep':>4} {'esp':>3} "
          f"{'m':>4} {'zero':>4} {'pipeline':<14} {'iter_ms':>10} {'tokens/s/GPU':>13} "
          f"{'GiB/GPU':>8}")
    for i, c in enumerate(candidates):
        lay = c["layout"]
        pipeline = lay.get("pipeline") or "-"
        v = _int(lay.get("virtual_stages"))
        if pipeline == "interleaved" and v > 1:
            pipeline += f"/v{v}"
        if lay.get("recompute"):
            pipeline += "+rc"
        elif lay.get("recompute_modules"):
            pipeline += "+rc:" + "+".join(lay["recompute_modules"])
        if lay.get("sequence_parallel"):
            pipeline += "+sp"
        if _int(lay.get("cp"), 1) > 1:
            pipeline += f"+cp{_int(lay.get('cp'))}"
        if lay.get("a2a_overlap"):
            pipeline += "+a2a"
        if lay.get("dispatcher") in ("deepep", "allgather"):
            pipeline += "+" + lay["dispatcher"]
        gib = _int(c.get("memory_bytes_per_gpu")) / float(1 << 30)
        print(f"{_int(c.get('rank'), i + 1):>4} {c.get('family') or lay.get('family') or '-':<6} "
              f"{_int(lay.get('dp')):>4} {_int(lay.get('tp')):>3} {_int(lay.get('pp')):>3} "
              f"{_int(lay.get('ep')):>4} {_int(lay.get('esp')):>3} "
              f"{_int(lay.get('microbatches')):>4} {_int(lay.get('zero_stage')):>4} "
              f"{pipeline:<14} {c.get('iteration_us', 0.0) / 1000.0:>10.2f} "
              f"{c.get('tokens_per_s_per_gpu', 0.0):>13.1f} {gib:>8.2f}")


def run_model(args, mc) -> int:
    if args.layer is not None:
        fail("--layer and --model are two modes: give one")
    if args.search and args.layout is not None:
        fail("--search and --layout: give one (--search is the default with --model)")
    if args.layout is not None and (args.gpus is not None or args.top is not None):
        fail("--gpus and --top apply to --search; a --layout has dp*tp*cp*pp GPUs")
    if args.gpus is not None and args.gpus < 1:
        fail(f"--gpus: must be >= 1 (got {args.gpus})")
    if args.top is not None and args.top < 1:
        fail(f"--top: must be >= 1 (got {args.top})")

    try:
        with open(args.model, encoding="utf-8") as f:
            model = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{args.model}: {e}")
    if not isinstance(model, dict):
        fail(f"{args.model}: must hold a JSON object (a moeplan.v1.ModelConfig)")

    search = layout = None
    if args.layout is not None:
        layout = parse_layout(args.layout)
    else:
        search = {"top": args.top if args.top is not None else DEFAULT_TOP}
        if args.gpus is not None:
            search["gpus"] = args.gpus

    try:
        with mc.PlannerClient(args.server, timeout_s=args.timeout, tls_ca=args.tls_ca,
                              token_file=args.token_file) as client:
            plan = client.plan_model(model, profile=args.cluster, search=search, layout=layout)
    except mc.PlannerError as e:
        fail(f"{e.code}: {e.message}")
    except ValueError as e:  # --tls-ca / --token-file
        fail(str(e))

    candidates = plan.get("candidates") or []
    if not candidates:
        if plan.get("variants"):
            fail(f"{args.server} answered with a variants plan and no layout candidates "
                 "(a server without the layout search?)")
        gpus = plan.get("gpus") or args.gpus or "the cluster's"
        fail(f"no feasible layout of {model.get('name') or args.model} on {gpus} GPUs of "
             f"{plan.get('profile_name', args.cluster)} (see --gpus, or the model's "
             "global_batch_size)")
    best = candidates[0]
    if not best.get("feasible", False):
        fail(f"layout {args.layout} is infeasible: {best.get('infeasible_reason') or 'no reason given'}")
    global_batch = _int(plan.get("global_batch_size"))
    if global_batch <= 0:
        lay = best["layout"]
        global_batch = (_int(lay.get("micro_batch_size")) * _int(lay.get("dp"), 1)
                        * max(_int(lay.get("microbatches"), 1), 1))

    mode = "layout" if layout is not None else "layout search"
    print(f"moeplan {mode} for {model.get('name') or os.path.basename(args.model)} on "
          f"{plan['profile_name']} (profile version {plan['profile_version']}) from "
          f"{args.server}: {_int(plan.get('gpus'))} GPUs, global batch {global_batch}")
    print_candidates(candidates)
    stats = plan.get("search_stats") or {}
    if search is not None and stats:
        print(f"search: {_int(stats.get('enumerated'))} enumerated, "
              f"{_int(stats.get('pruned_memory'))} pruned by memory, "
              f"{_int(stats.get('pruned_bound'))} by bound, "
              f"{_int(stats.get('simulated'))} simulated, "
              f"{_int(stats.get('stage_plans'))} stage plans "
              f"({_int(stats.get('stage_cache_hits'))} cache hits) in "
              f"{float(stats.get('elapsed_ms', 0.0)):.1f} ms")
        if _int(stats.get("over_limit")) > 0:
            print(f"search: {_int(stats.get('over_limit'))} candidates skipped: more pipeline "
                  f"steps than the planner simulates (lower max_microbatches)")
    lay = best["layout"]
    schedule = best.get("schedule", "SCHEDULE_UNSPECIFIED")
    try:
        schedule = mc.schedule_short_name(schedule)
    except ValueError:
        schedule = "-"
    print(f"chosen: {best.get('family') or lay.get('family') or '-'} dp={_int(lay.get('dp'))} "
          f"tp={_int(lay.get('tp'))} pp={_int(lay.get('pp'))} ep={_int(lay.get('ep'))} "
          f"esp={_int(lay.get('esp'))}, {best.get('iteration_us', 0.0) / 1000.0:.2f} ms per "
          f"iteration, {best.get('tokens_per_s_per_gpu', 0.0):.1f} tokens/s per GPU, "
          f"overlap {best.get('variant') or '-'}, MoE schedule {schedule}, bubble "
          f"{100.0 * float(best.get('bubble_fraction', 0.0)):.1f}%")
    if best["layout"].get("pipeline") == "dualpipe":
        # DeepSeek's schedule has no Megatron-LM flag: the degrees still apply.
        print("note: pipeline=dualpipe is DeepSeek's DualPipe schedule, which Megatron-LM does "
              "not run; the flags below give its degrees (each rank holds two of the pp "
              "segments)")
    # The server builds both from the layout (LayoutCandidate.megatron_args,
    # deepspeed_config), so every client prints the same.
    if not best.get("megatron_args") or not best.get("deepspeed_config"):
        fail(f"{args.server} answered without the layout's launcher arguments (a server "
             "older than this launcher?)")
    print("megatron flags: " + " ".join(best["megatron_args"]))
    print("deepspeed config: " + best["deepspeed_config"])
    return 0


# --- single-layer mode -------------------------------------------------------------

def run_layer(args, mc) -> int:
    if args.search or args.layout is not None or args.gpus is not None or args.top is not None:
        fail("--search, --layout, --gpus and --top need --model FILE")
    layer_path = args.layer if args.layer is not None else DEFAULT_LAYER
    try:
        with open(layer_path, encoding="utf-8") as f:
            layer = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{layer_path}: {e}")

    try:
        with mc.PlannerClient(args.server, timeout_s=args.timeout, tls_ca=args.tls_ca,
                              token_file=args.token_file) as client:
            plan = client.plan_layer(layer, profile=args.cluster)
    except mc.PlannerError as e:
        fail(f"{e.code}: {e.message}")
    except ValueError as e:  # --tls-ca / --token-file
        fail(str(e))

    best = plan["best_schedule"]
    schedule = mc.schedule_short_name(best)
    chosen = next(c for c in plan["candidates"] if c["schedule"] == best)
    decision = plan.get("decision", {})

    print(f"moeplan plan for {layer.get('name') or os.path.basename(layer_path)} on "
          f"{plan['profile_name']} (profile version {plan['profile_version']}) "
          f"from {args.server}")
    print(f"schedule: {schedule}")
    print(f"predicted iteration time: {chosen['total_us']:.1f} us per MoE layer "
          f"(forward {chosen['forward_us']:.1f} us + backward {chosen['backward_us']:.1f} us)")
    runner_up = decision.get("runner_up", "SCHEDULE_UNSPECIFIED")
    if runner_up != "SCHEDULE_UNSPECIFIED":
        print(f"margin: {decision['margin_us']:.1f} us ({decision['margin_pct']:.1f}%) ahead of "
              f"{mc.schedule_short_name(runner_up)}; "
              f"{decision['speedup_over_default']:.2f}x over default")
    else:
        print("margin: none (only one schedule planned)")
    if decision.get("summary"):
        print(f"why: {decision['summary']}")
    print("training flags: " + " ".join(training_flags(layer, plan, schedule)))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="launcher",
        description="Ask a moeplan-server for the MoE schedule (--layer) or the parallel "
                    "layout (--model) to train with.")
    parser.add_argument("--server", required=True, metavar="ADDR",
                        help="moeplan-server address, host:port")
    parser.add_argument("--tls-ca", default=None, metavar="PEM",
                        help="CA certificate of a server started with --tls-cert (TLS)")
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="the server's bearer token, for a server with --token-for-reads")
    parser.add_argument("--layer", default=None, metavar="FILE",
                        help="LayerConfig JSON (default: examples/gpt2-moe-layer.json)")
    parser.add_argument("--model", default=None, metavar="FILE",
                        help="ModelConfig JSON (examples/models/): plan the whole model's "
                             "parallel layout instead of one layer's schedule")
    parser.add_argument("--search", action="store_true",
                        help="with --model: rank every layout (the default)")
    parser.add_argument("--layout", default=None, metavar="SPEC",
                        help="with --model: evaluate one layout, "
                             "dp=..,tp=..,pp=..,ep=..,esp=..[,microbatches=..,zero=..,"
                             "family=..,pipeline=..,v=..,recompute=..,sp=..,layout=..]")
    parser.add_argument("--gpus", type=int, default=None, metavar="N",
                        help="with --search: GPUs to lay the model out on "
                             "(default: the whole cluster)")
    parser.add_argument("--top", type=int, default=None, metavar="N",
                        help=f"with --search: candidates to list (default: {DEFAULT_TOP})")
    parser.add_argument("--cluster", default="a100-8x8", metavar="NAME",
                        help="profile name on the server (default: a100-8x8)")
    parser.add_argument("--stubs", default=None, metavar="DIR",
                        help="directory holding the generated moeplan/ package "
                             "(default: $MOEPLAN_PYTHONPATH, else build/client/python)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="deadline of the request in seconds (default: 10; "
                             "60 with --model)")
    args = parser.parse_args()
    if args.timeout is None:
        args.timeout = 60.0 if args.model is not None else 10.0
    if args.timeout <= 0:
        fail(f"--timeout: must be > 0 (got {args.timeout})")

    mc = import_client(stub_dirs(args))
    if args.model is not None:
        return run_model(args, mc)
    return run_layer(args, mc)


if __name__ == "__main__":
    sys.exit(main())
