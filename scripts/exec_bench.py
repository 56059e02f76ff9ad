#!/usr/bin/env python3
"""Measured vs predicted: runs moeplan-exec (all schedules) on layer configs at
several rank counts and layouts, plans the same layers with `moeplan
plan-layer`, and prints one line per (config, layout, schedule).

  python3 scripts/exec_bench.py [--profile NAME] [--iters N] [--json OUT] LAYER.json...

Layouts per rank count P: mp = esp = 2, ep = P/2 (all three schedules).
"""
import argparse, json, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("layers", nargs="+")
    ap.add_argument("--ranks", default="4,8")
    ap.add_argument("--profile", default="a100-8x8")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--json", help="also write every record here")
    a = ap.parse_args()
    exe = os.path.join(a.build, "executor", "moeplan-exec")
    cli = os.path.join(a.build, "client", "moeplan")
    records = []
    print(f"{'config':<14}{'P':>3}{'layout':>12}{'sched':>8}{'measured us':>13}{'fwd':>10}"
          f"{'comm':>10}{'predicted us':>14}")
    for path in a.layers:
        base = json.load(open(path))
        for p in [int(x) for x in a.ranks.split(",")]:
            layer = dict(base)
            layer["parallel"] = {"mp": 2, "ep": p // 2, "esp": 2}
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(layer, f)
                lp = f.name
            try:
                run = subprocess.run(["mpirun", "-np", str(p), exe, "--layer", lp, "--json",
                                      "--iters", str(a.iters), "--warmup", str(a.warmup),
                                      "--profile", a.profile],
                                     env=ENV, capture_output=True, text=True, check=True)
                plan = subprocess.run([cli, "plan-layer", "--layer", lp, "--cluster", a.profile,
                                       "--format", "json"], capture_output=True, text=True,
                                      check=True)
            finally:
                os.unlink(lp)
            measured = json.loads(run.stdout)
            predicted = {c["schedule"]: c for c in json.loads(plan.stdout)["candidates"]}
            for c in measured["candidates"]:
                pr = predicted[c["schedule"]]
                s = c["schedule"].replace("SCHEDULE_", "").lower()
                print(f"{layer['name']:<14}{p:>3}{'2x' + str(p // 2) + 'x2':>12}{s:>8}"
                      f"{c['total_us']:>13.0f}{c['forward_us']:>10.0f}{c['comm_us']:>10.0f}"
                      f"{pr['total_us']:>14.1f}")
                records.append({"config": layer["name"], "ranks": p, "schedule": s,
                                "measured": c, "predicted": pr})
    if a.json:
        json.dump(records, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
