#!/usr/bin/env python3
"""Trains a small GPT with moeplan.torch MoE layers (every other block) on a
character-level corpus, data-parallel over MPI ranks.

    mpirun -np 4 /usr/bin/python3 examples/train_gpt_moe.py --steps 60
    mpirun -np 4 /usr/bin/python3 examples/train_gpt_moe.py --server 127.0.0.1:50051 \\
        --profile cpu-testbed-2x2 --steps 100 --png loss.png

The MoE layers' schedule comes from moeplan-server (--server), else the
planner in this process on --profile, or is forced with --schedule. Dense
parameters (and the gate weights) are averaged over the ranks with
torch.distributed (gloo); expert shards are not (their gradients come out of
the layer already summed over every rank's tokens and scaled by 1/dp). The
ranks of one MP group read the same batch.

The corpus: --corpus FILE, or by default the repository's own docs/*.md
(text that ships with moeplan), read as bytes (a vocabulary of 256).
Output: a progress bar (stderr), the loss curve as a PNG (--png), the
measured per-layer op times reported to the server (with --server;
ReportMeasurement), and one JSON line on stdout: schedule, first_loss,
last_loss, tokens_per_s, and more.
"""

import argparse
import glob
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (os.environ.get("MOEPLAN_PYTHONPATH"), os.path.join(ROOT, "build", "client", "python")):
    if p and os.path.isdir(p) and p not in sys.path:
        sys.path.insert(0, p)

from moeplan.torch import MoE, Planner, PlannerUnavailable, dense_parameters  # noqa: E402
from moeplan.torch import SCHEDULES, init_process_group  # noqa: E402


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--steps", type=int, default=60, help="training steps")
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="auto",
                    help="the MoE layers' schedule; auto asks the planner")
    ap.add_argument("--server", help="moeplan-server address (host:port) for plans and reports")
    ap.add_argument("--require-server", action="store_true",
                    help="fail if the server does not answer (default: plan locally, warn)")
    ap.add_argument("--server-timeout", type=float, default=10.0,
                    help="seconds to wait for the server per call")
    ap.add_argument("--profile", default="cpu-testbed-2x2",
                    help="cluster profile to plan on (a name, or a JSON file for local plans)")
    ap.add_argument("--corpus", help="a text file (default: the repository's docs/*.md)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per MP group per step")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--model-dim", type=int, default=64)
    ap.add_argument("--hidden-dim", type=int, default=128, help="FFN / expert hidden size")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=4, help="transformer blocks (odd ones are MoE)")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--capacity-factor", type=float, default=1.25)
    ap.add_argument("--mp", type=int, default=1, help="MoE layout: MP degree")
    ap.add_argument("--ep", type=int, help="MoE layout: EP degree (default world/esp)")
    ap.add_argument("--esp", type=int, default=1, help="MoE layout: ESP degree")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3,
                    help="steps left out of tokens/s and of the reported times")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--png", help="write the loss curve here (rank 0)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = ap.parse_args(argv)
    for name in ("steps", "batch", "seq_len", "model_dim", "hidden_dim", "heads", "blocks",
                 "experts", "top_k", "mp", "esp", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: must be >= 1 (got {getattr(a, name)})")
    if a.warmup < 0 or a.warmup >= a.steps:
        ap.error(f"--warmup: must be >= 0 and below --steps ({a.steps}), got {a.warmup}")
    if a.model_dim % a.heads:
        ap.error(f"--model-dim ({a.model_dim}) must be a multiple of --heads ({a.heads})")
    if not a.server_timeout > 0:
        ap.error(f"--server-timeout: must be > 0 (got {a.server_timeout})")
    if a.require_server and not a.server:
        ap.error("--require-server needs --server")
    return a


def load_corpus(path):
    if path:
        with open(path, "rb") as f:
            data = f.read()
        source = path
    else:
        files = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
        data = b"".join(open(f, "rb").read() for f in files)
        source = f"docs/*.md ({len(files)} files)"
    if len(data) < 1024:
        raise SystemExit(f"train_gpt_moe: the corpus {source} has {len(data)} bytes; need >= 1024")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long(), source


class Block(nn.Module):
    def __init__(self, a, moe):
        super().__init__()
        self.ln1 = nn.LayerNorm(a.model_dim)
        self.attn = nn.MultiheadAttention(a.model_dim, a.heads, batch_first=True)
        self.ln2 = nn.LayerNorm(a.model_dim)
        self.ffn = moe if moe is not None else nn.Sequential(
            nn.Linear(a.model_dim, a.hidden_dim), nn.GELU(), nn.Linear(a.hidden_dim, a.model_dim))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ffn(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, a, planner):
        super().__init__()
        torch.manual_seed(a.seed)  # the dense weights: the same on every rank
        self.tok = nn.Embedding(256, a.model_dim)
        self.pos = nn.Embedding(a.seq_len, a.model_dim)
        self.moes = []
        blocks = []
        for i in range(a.blocks):
            moe = None
            if i % 2 == 1:
                moe = MoE(a.model_dim, a.hidden_dim, a.experts, top_k=a.top_k,
                          capacity_factor=a.capacity_factor, mp=a.mp, ep=a.ep, esp=a.esp,
                          schedule=a.schedule, planner=planner, seed=a.seed * 100 + i)
                self.moes.append(moe)
            blocks.append(Block(a, moe))
        self.blocks = nn.ModuleList(blocks)
        self.ln = nn.LayerNorm(a.model_dim)
        self.head = nn.Linear(a.model_dim, 256, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((a.seq_len, a.seq_len), float("-inf")),
                                                diagonal=1), persistent=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x, self.mask)
        return self.head(self.ln(x))


def progress(enabled, total):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="step", file=sys.stderr, dynamic_ncols=True)


def write_png(path, losses, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(range(1, len(losses) + 1), losses)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy, nats/byte)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp)
    os.replace(tmp, path)  # never a half-written PNG


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    rank, size = init_process_group()
    if size % a.mp:
        raise SystemExit(f"train_gpt_moe: --mp {a.mp} must divide the {size} ranks")
    dp, group = size // a.mp, rank // a.mp
    data, source = load_corpus(a.corpus)
    if len(data) <= a.seq_len + 1:
        raise SystemExit(f"train_gpt_moe: the corpus is shorter than --seq-len {a.seq_len}")

    planner = Planner(server=a.server, profile=a.profile, fallback=not a.require_server,
                      timeout_s=a.server_timeout)
    model = GPT(a, planner)
    dense = dense_parameters(model)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    bar = progress(rank == 0 and not a.no_progress, a.steps)

    losses, step_times = [], []
    for step in range(a.steps):
        # The MP group's batch: the same on its ranks, another on every group.
        g = torch.Generator().manual_seed(a.seed * 1_000_003 + step * 1009 + group)
        starts = torch.randint(0, len(data) - a.seq_len - 1, (a.batch,), generator=g)
        x = torch.stack([data[s:s + a.seq_len] for s in starts])
        y = torch.stack([data[s + 1:s + a.seq_len + 1] for s in starts])
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        # Dense gradients averaged over every rank (an MP group's ranks hold
        # the same ones, so this is the mean over the dp groups), in one
        # flattened all_reduce.
        grads = [p.grad for p in dense]
        flat = torch.cat([gr.reshape(-1) for gr in grads])
        dist.all_reduce(flat)
        flat /= size
        off = 0
        for gr in grads:
            gr.copy_(flat[off:off + gr.numel()].view_as(gr))
            off += gr.numel()
        opt.step()
        step_times.append(time.perf_counter() - t0)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(float(mean_loss) / size)
        if step >= a.warmup:
            for m in model.moes:
                m.record_timings()
        if bar is not None:
            timed = step_times[a.warmup:] if step >= a.warmup else step_times
            tps = dp * a.batch * a.seq_len * len(timed) / max(sum(timed), 1e-9)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tps:,.0f}")
            bar.update(1)
    if bar is not None:
        bar.close()

    # Wall time of the timed steps: the slowest rank's.
    timed = torch.tensor(sum(step_times[a.warmup:]), dtype=torch.float64)
    dist.all_reduce(timed, op=dist.ReduceOp.MAX)
    tokens = dp * a.batch * a.seq_len * (a.steps - a.warmup)
    tokens_per_s = tokens / float(timed)

    # Each MoE layer: measured (median over the timed steps, rank 0's view)
    # against the plan's prediction for the schedule that ran.
    layers = []
    for i, m in enumerate(model.moes):
        meas = m.measured()
        answer = planner.plan(m.last_layer)
        predicted = planner.predict(m.last_layer, meas["schedule"])
        layers.append({"layer": i, "schedule": meas["schedule"],
                       "measured_us": round(meas["total_us"], 1),
                       "predicted_us": round(predicted["total_us"], 1),
                       "planned_by": answer["source"],
                       "profile": answer["plan"]["profile_name"],
                       "profile_version": answer["plan"]["profile_version"],
                       "ops": meas["ops"], "starts": meas["starts"]})
    reported = None
    if a.server and rank == 0:
        reported = report(planner, model.moes, layers)

    schedules = sorted({m.last_schedule for m in model.moes})
    tokens_per_call = a.batch * a.seq_len
    result = {
        "schedule": schedules[0] if len(schedules) == 1 else ",".join(schedules),
        "first_loss": round(losses[0], 6), "last_loss": round(losses[-1], 6),
        "tokens_per_s": round(tokens_per_s, 1),
        # Rank 0's timed steps, wall time.
        "step_ms": {"median": round(1e3 * statistics.median(step_times[a.warmup:]), 2),
                    "max": round(1e3 * max(step_times[a.warmup:]), 2)},
        "steps": a.steps, "ranks": size, "layout": {"mp": a.mp, "ep": model.moes[0].ep,
                                                    "esp": a.esp, "dp": dp},
        "corpus": source,
        "moe_layers": [{k: v for k, v in l.items() if k not in ("ops", "starts")} for l in layers],
        # What the MoE layers alone would sustain at the measured and the
        # predicted layer times (tokens per call over the layer's time, all dp groups).
        "moe_tokens_per_s": {
            "measured": round(dp * tokens_per_call * 1e6 / max(sum(l["measured_us"] for l in layers), 1e-9), 1),
            "predicted": round(dp * tokens_per_call * 1e6 / max(sum(l["predicted_us"] for l in layers), 1e-9), 1),
        },
        "reported": reported,
        "losses": [round(v, 6) for v in losses],
    }
    if rank == 0:
        if a.png:
            write_png(a.png, losses, f"{result['schedule']}, {size} ranks, "
                                     f"{result['tokens_per_s']:,.0f} tokens/s")
        print(json.dumps(result, allow_nan=False), flush=True)
    planner.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def report(planner, moes, layers):
    """ReportMeasurement for every MoE layer: its median op times and starts;
    the server answers with their replay on its plan (composition error) and
    its prediction against the replay (cost error)."""
    import moeplan_client
    client = planner.client()
    out = []
    for m, l in zip(moes, layers):
        try:
            answer = client.report_measurement(l["profile"], l["profile_version"], m.last_layer,
                                               l["schedule"], l["ops"], l["measured_us"],
                                               starts=l["starts"], full=True)
            replay = answer.get("replay", {})
            out.append({"layer": l["layer"], "stored": answer["stored"],
                        "replayed_us": round(replay.get("replayed_us", 0.0), 1),
                        "composition_error_pct": round(replay.get("composition_error_pct", 0.0), 2),
                        "cost_error_pct": round(answer.get("cost_error_pct", 0.0), 2),
                        "longest_wait": (replay.get("waits") or [{}])[0]})
        except moeplan_client.PlannerError as e:
            print(f"train_gpt_moe: ReportMeasurement failed: {e.code}: {e.message}",
                  file=sys.stderr)
            out.append({"layer": l["layer"], "error": f"{e.code}: {e.message}"})
    return out


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except PlannerUnavailable as e:
        # Every rank has the same answer (rank 0's, broadcast): all stop here.
        if int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == 0:
            print(f"train_gpt_moe: {e}", file=sys.stderr)
        sys.exit(2)
