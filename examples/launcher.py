#!/usr/bin/python3
"""A training launcher that asks a running moeplan-server which schedule to use.

    /usr/bin/python3 examples/launcher.py --server 127.0.0.1:50051 \\
        [--layer examples/gpt2-moe-layer.json] [--cluster a100-8x8] [--stubs DIR]

Prints the chosen schedule, its predicted time per MoE layer (forward + backward,
microseconds), the margin over the runner-up, and the parallel flags it would pass
to a Megatron/DeepSpeed-style training script, e.g.

    training flags: --tensor-model-parallel-size 4 --expert-parallel-size 16
        --expert-slicing-size 4 --data-parallel-size 16 --moe-schedule s2

On failure it prints one line, `launcher: error: CODE: message` (the server's
message names the field, e.g. `layer.top_k: must be <= num_experts (...)`), on
stderr and exits 1.

The generated Python stubs are looked up in --stubs DIR, else in the directories
of $MOEPLAN_PYTHONPATH, else in build/client/python under the repository root
(build them with `ninja -C build moeplan_python_stubs`). Run it with Debian's
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


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="launcher", description="Ask a moeplan-server for the MoE schedule to train with.")
    parser.add_argument("--server", required=True, metavar="ADDR",
                        help="moeplan-server address, host:port")
    parser.add_argument("--layer", default=DEFAULT_LAYER, metavar="FILE",
                        help="LayerConfig JSON (default: examples/gpt2-moe-layer.json)")
    parser.add_argument("--cluster", default="a100-8x8", metavar="NAME",
                        help="profile name on the server (default: a100-8x8)")
    parser.add_argument("--stubs", default=None, metavar="DIR",
                        help="directory holding the generated moeplan/ package "
                             "(default: $MOEPLAN_PYTHONPATH, else build/client/python)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="S",
                        help="deadline of the request in seconds (default: 10)")
    args = parser.parse_args()

    mc = import_client(stub_dirs(args))

    try:
        with open(args.layer, encoding="utf-8") as f:
            layer = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{args.layer}: {e}")

    try:
        with mc.PlannerClient(args.server, timeout_s=args.timeout) as client:
            plan = client.plan_layer(layer, profile=args.cluster)
    except mc.PlannerError as e:
        fail(f"{e.code}: {e.message}")

    best = plan["best_schedule"]
    schedule = mc.schedule_short_name(best)
    chosen = next(c for c in plan["candidates"] if c["schedule"] == best)
    decision = plan.get("decision", {})

    print(f"moeplan plan for {layer.get('name') or os.path.basename(args.layer)} on "
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


if __name__ == "__main__":
    sys.exit(main())
