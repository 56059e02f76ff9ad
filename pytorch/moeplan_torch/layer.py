"""`MoE`, the layer: an nn.Module whose forward and backward are the planner's
op graph for one MoE layer, run by the executor inside a torch.autograd.Function;
and `dense_parameters`, the parameters to average over data-parallel ranks."""

from __future__ import annotations

import collections
import itertools
import math
import os
import statistics
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

import moeplan_schedules

from ._native import _C
from .planner import Planner, canonical_json
from .process_group import world

__all__ = ["MoE", "dense_parameters", "SCHEDULES", "GATES"]

# What MoE(schedule=...) takes: ("default", "s1", "s2", "auto").
SCHEDULES = moeplan_schedules.SCHEDULES + (moeplan_schedules.AUTO,)
GATES = ("topk", "switch")

# Runners kept per layer (token shapes), least recently used evicted first.
DEFAULT_MAX_RUNNERS = 8
# Seconds a rank waits for the others to begin the same forward or backward.
DEFAULT_TIMEOUT_S = 300.0

# One lock for every MoE layer of the process: a layer's calls share its
# buffers, and every layer's steps begin with a collective on MPI_COMM_WORLD,
# which two threads must not enter at once. Calls from several threads are
# serialized, not ordered: see "Threads" in pytorch/README.md.
_LOCK = threading.RLock()
_LAYER_IDS = itertools.count()  # construction order: the same on every rank
_FORWARD, _BACKWARD = 0, 1
_ORDER_RULE = ("every rank must run the same forwards and backwards of the same layers in the "
               "same order (did a rank skip a backward(), or call the layers in another order, "
               "e.g. from threads?)")
_SHAPE_RULE = "every rank must call it with the same shape"
_ENV_RULES = {"an integer >= 1": lambda v: v >= 1,
              "a number of seconds >= 0 (0: no limit)": lambda v: math.isfinite(v) and v >= 0}


def _positive_int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1 (got {value!r})")
    return value


def _env_number(name: str, default: Any, parse, rule: str) -> Any:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not _ENV_RULES[rule](value):
        raise ValueError(f"{name}: must be {rule} (got {text!r})")
    return value


class _MoEFunction(torch.autograd.Function):
    """One MoE layer on the executor: forward runs the plan's forward ops,
    backward its backward ops on what the forward left in the buffers."""

    @staticmethod
    def forward(ctx, x, gate_weight, w1, w2, layer, expert_scale, moe, batch):
        y = layer.forward(x, gate_weight, w1, w2)
        ctx.layer = layer
        ctx.moe, ctx.batch = moe, batch
        ctx.expert_scale = expert_scale
        ctx.generation = layer.forwards
        ctx.save_for_backward(x, gate_weight, w1, w2)
        return y

    @staticmethod
    def backward(ctx, dy):
        layer = ctx.layer
        x, gate_weight, w1, w2 = ctx.saved_tensors
        with _LOCK:
            ctx.moe._agree_step(_BACKWARD, x.shape[0], ctx.batch)
            if layer.forwards != ctx.generation:
                # Another forward of this shape ran since (gradient accumulation
                # over several forwards, checkpointing, or another thread): its
                # buffers hold that one, so this forward is run again first.
                layer.forward(x, gate_weight, w1, w2)
            dx, dgate, dw1, dw2 = layer.backward(dy.contiguous())
        if ctx.expert_scale != 1.0:
            dw1.mul_(ctx.expert_scale)
            dw2.mul_(ctx.expert_scale)
        return dx, dgate, dw1, dw2, None, None, None, None


class MoE(nn.Module):
    """A Mixture-of-Experts FFN layer run by moeplan's executor.

    Args:
        model_dim, hidden_dim: M and H (each expert is GELU(x W1) W2, no biases).
        gated_linear_unit: SwiGLU experts (Megatron-Core's name): each expert is
            (silu(x W1_gate) * (x W1_up)) W2, W1 = [W1_gate | W1_up] of 2H columns
            (the gate's H first, then the up projection's H).
        num_experts: E, a multiple of ep.
        top_k: experts per token (default 2; gate="switch" is top_k 1).
        capacity_factor: f; each expert keeps ceil(k f S / E) tokens of the S an
            MP group routes (s1: per MP rank), first choices first; the rest are
            dropped (they add nothing; keep the residual outside the layer).
        mp, ep, esp: the layout over the MPI world (docs/notation.md): ep*esp
            ranks hold the experts (E/ep experts per rank, H/esp columns of each),
            mp ranks share one token batch (they must be given the same x), so
            mp*dp = ep*esp = world size. ep defaults to world/esp.
        schedule: "default", "s1", "s2" (s1/s2 need esp == mp) or "auto" (the
            planner's choice, per token shape, from `planner`).
        planner: a Planner for "auto" (default: Planner() on the local profile).
        seed: initialises the weights; the same global weights for every layout.
        expert_grad: "mean" (default) scales the expert weights' gradients by
            1/dp, so they match dense gradients averaged over the data-parallel
            ranks (DistributedDataParallel, or an all_reduce divided by the world
            size); "sum" leaves the sum over the dp groups' losses.
        max_runners: runners (one per token shape, each with its buffers, lane
            threads and communicators) kept; the least recently used is freed
            when a new shape would exceed it. Default: $MOEPLAN_TORCH_MAX_RUNNERS,
            else 8.
        timeout_s: how long a rank waits, at the start of each forward and
            backward, for the other ranks to begin the same one before it ends
            the job naming the call (0: no limit). Default:
            $MOEPLAN_TORCH_TIMEOUT_S, else 300.

    Parameters: gate_weight [M, E] (replicated: average its gradient with the
    dense ones), w1 [E/ep, M, H/esp] and w2 [E/ep, H/esp, M] (this rank's expert
    shards, marked `moeplan_expert = True`: leave them out of data-parallel
    reductions; `dense_parameters(model)` lists the others). With
    gated_linear_unit, w1 is [E/ep, M, 2H/esp]: this rank's H/esp gate columns,
    then the same H/esp columns of the up projection.
    """

    def __init__(self, model_dim: int, hidden_dim: int, num_experts: int,
                 top_k: Optional[int] = None,
                 capacity_factor: float = 1.0, gate: str = "topk", mp: int = 1,
                 ep: Optional[int] = None, esp: int = 1, schedule: str = "default",
                 planner: Optional[Planner] = None, seed: int = 0, expert_grad: str = "mean",
                 max_runners: Optional[int] = None, timeout_s: Optional[float] = None,
                 gated_linear_unit: bool = False):
        super().__init__()
        rank, size = world()
        if gate not in GATES:
            raise ValueError(f"MoE.gate: must be one of {', '.join(GATES)} (got {gate!r})")
        if gate == "switch" and top_k not in (None, 1):
            raise ValueError(f"MoE.top_k: the switch gate routes each token to one expert "
                             f"(top_k 1), got {top_k}")
        if top_k is None:
            top_k = 1 if gate == "switch" else 2
        for name, v in (("model_dim", model_dim), ("hidden_dim", hidden_dim),
                        ("num_experts", num_experts), ("top_k", top_k), ("mp", mp),
                        ("esp", esp)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"MoE.{name}: must be an integer >= 1 (got {v!r})")
        if top_k > num_experts:
            raise ValueError(f"MoE.top_k: must be <= num_experts ({num_experts}), got {top_k}")
        if not (isinstance(capacity_factor, (int, float)) and capacity_factor > 0
                and math.isfinite(capacity_factor)):
            raise ValueError(f"MoE.capacity_factor: must be a finite number > 0 "
                             f"(got {capacity_factor!r})")
        if ep is None:
            if size % esp != 0:
                raise ValueError(f"MoE.esp: must divide the world size {size} (got {esp})")
            ep = size // esp
        if not isinstance(ep, int) or ep < 1:
            raise ValueError(f"MoE.ep: must be an integer >= 1 (got {ep!r})")
        if ep * esp != size:
            raise ValueError(f"MoE layout: ep*esp must equal the world size {size} "
                             f"(got ep={ep}, esp={esp}: {ep * esp} ranks)")
        if size % mp != 0:
            raise ValueError(f"MoE.mp: must divide the world size {size} (got {mp})")
        if mp % esp != 0:
            raise ValueError(f"MoE.esp: must divide mp={mp} (an ESP group inside an MP group; "
                             f"got esp={esp})")
        if num_experts % ep != 0:
            raise ValueError(f"MoE.num_experts: must be a multiple of ep={ep} "
                             f"(got {num_experts})")
        if hidden_dim % esp != 0:
            raise ValueError(f"MoE.hidden_dim: must be a multiple of esp={esp} "
                             f"(got {hidden_dim})")
        if schedule not in SCHEDULES:
            raise ValueError(f"MoE.schedule: must be one of {', '.join(SCHEDULES)} "
                             f"(got {schedule!r})")
        if schedule in moeplan_schedules.ESP_IS_MP and esp != mp:
            raise ValueError(f"MoE.schedule: {schedule} needs esp == mp (the ESP group is the "
                             f"MP group); got mp={mp}, esp={esp}")
        if not isinstance(gated_linear_unit, bool):
            raise ValueError(f"MoE.gated_linear_unit: must be True or False "
                             f"(got {gated_linear_unit!r})")
        if expert_grad not in ("mean", "sum"):
            raise ValueError(f"MoE.expert_grad: must be 'mean' or 'sum' (got {expert_grad!r})")
        if max_runners is None:
            max_runners = _env_number("MOEPLAN_TORCH_MAX_RUNNERS", DEFAULT_MAX_RUNNERS, int,
                                      "an integer >= 1")
        self.max_runners = _positive_int(max_runners, "MoE.max_runners")
        if timeout_s is None:
            timeout_s = _env_number("MOEPLAN_TORCH_TIMEOUT_S", DEFAULT_TIMEOUT_S, float,
                                    "a number of seconds >= 0 (0: no limit)")
        if (not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool)
                or not math.isfinite(timeout_s) or timeout_s < 0):
            raise ValueError(f"MoE.timeout_s: must be a number of seconds >= 0 (0: no limit) "
                             f"(got {timeout_s!r})")
        self.timeout_s = float(timeout_s)
        self.model_dim, self.hidden_dim, self.num_experts = model_dim, hidden_dim, num_experts
        self.top_k, self.capacity_factor, self.gate = top_k, float(capacity_factor), gate
        self.gated_linear_unit = gated_linear_unit
        self.mp, self.ep, self.esp, self.dp = mp, ep, esp, size // mp
        self.schedule = schedule
        self.planner = planner if planner is not None else (
            Planner() if schedule == moeplan_schedules.AUTO else None)
        self.expert_grad = expert_grad
        self.rank, self.world_size = rank, size
        self.place = _C.place_of(mp, ep, esp, rank)
        self.local_experts = num_experts // ep
        self.hidden_shard = hidden_dim // esp

        # Seeded so that every layout holds the same global weights.
        g = torch.Generator().manual_seed(seed)
        bound = 1.0 / math.sqrt(model_dim)
        self.gate_weight = nn.Parameter(
            (torch.rand(model_dim, num_experts, generator=g) * 2 - 1) * bound)
        # A gated expert's whole W1 is [M, 2H], [gate | up].
        halves = 2 if gated_linear_unit else 1
        w1 = torch.empty(self.local_experts, model_dim, halves * self.hidden_shard)
        w2 = torch.empty(self.local_experts, self.hidden_shard, model_dim)
        e0 = self.place["ep_rank"] * self.local_experts
        for l in range(self.local_experts):
            ge = torch.Generator().manual_seed(seed * 1_000_003 + e0 + l + 1)
            full1 = ((torch.rand(model_dim, halves * hidden_dim, generator=ge) * 2 - 1)
                     / math.sqrt(model_dim))
            full2 = (torch.rand(hidden_dim, model_dim, generator=ge) * 2 - 1) / math.sqrt(hidden_dim)
            w1[l] = self._w1_shard(full1)
            w2[l] = self._hidden_shard(full2, 0)
        self.w1 = nn.Parameter(w1)
        self.w2 = nn.Parameter(w2)
        self.w1.moeplan_expert = True
        self.w2.moeplan_expert = True

        # Per (tokens, batch): the runner, its schedule, its LayerConfig and the
        # "auto" answer; a forward of a known shape looks nothing else up. At
        # most max_runners, least recently used first (an evicted runner's
        # threads and memory go when the last autograd graph holding it does).
        self._shapes: Dict[Tuple[int, int], Tuple[Any, str, Dict[str, Any], Any]] = \
            collections.OrderedDict()
        self._layer_id = next(_LAYER_IDS)
        self._calls = 0  # forwards and backwards begun, checked against the other ranks
        self._last_runner = None
        self.last_plan: Optional[Dict[str, Any]] = None  # the "auto" answer of the last shape
        self.last_schedule: Optional[str] = None
        self.last_layer: Optional[Dict[str, Any]] = None
        self._times: Dict[str, List[float]] = {}
        self._starts: Dict[str, List[float]] = {}
        self._totals: List[float] = []

    def extra_repr(self) -> str:
        return (f"model_dim={self.model_dim}, hidden_dim={self.hidden_dim}, "
                f"num_experts={self.num_experts}, top_k={self.top_k}, "
                f"capacity_factor={self.capacity_factor}, mp={self.mp}, ep={self.ep}, "
                f"esp={self.esp}, schedule={self.schedule!r}"
                + (", gated_linear_unit=True" if self.gated_linear_unit else ""))

    def _hidden_shard(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's H/esp slice of dimension `dim` (of size H)."""
        h0 = self.place["esp_rank"] * self.hidden_shard
        return t.narrow(dim, h0, self.hidden_shard)

    def _w1_shard(self, w1: torch.Tensor) -> torch.Tensor:
        """This rank's columns of whole W1s (last dimension H, or 2H = [gate | up])."""
        if not self.gated_linear_unit:
            return self._hidden_shard(w1, -1)
        gate, up = w1.split(self.hidden_dim, dim=-1)
        return torch.cat((self._hidden_shard(gate, -1), self._hidden_shard(up, -1)), dim=-1)

    @torch.no_grad()
    def load_expert_weights(self, w1: torch.Tensor, w2: torch.Tensor) -> None:
        """Sets this rank's shards from the whole experts: w1 [E, M, H] (gated:
        [E, M, 2H], the gate's H columns, then the up projection's), w2 [E, H, M]."""
        E, M, H = self.num_experts, self.model_dim, self.hidden_dim
        F = 2 * H if self.gated_linear_unit else H
        if tuple(w1.shape) != (E, M, F) or tuple(w2.shape) != (E, H, M):
            raise ValueError(f"MoE.load_expert_weights: need w1 [{E}, {M}, {F}] and "
                             f"w2 [{E}, {H}, {M}], got {list(w1.shape)} and {list(w2.shape)}")
        e0 = self.place["ep_rank"] * self.local_experts
        e1 = e0 + self.local_experts
        self.w1.copy_(self._w1_shard(w1[e0:e1]))
        self.w2.copy_(self._hidden_shard(w2[e0:e1], 1))

    def layer_config(self, tokens: int, batch: int = 1) -> Dict[str, Any]:
        """The LayerConfig (the planner's and the server's) of `tokens` tokens per MP group."""
        seq = tokens // batch
        config = {"batch_size": batch, "seq_len": seq, "model_dim": self.model_dim,
                  "hidden_dim": self.hidden_dim, "num_experts": self.num_experts,
                  "top_k": self.top_k, "capacity_factor": self.capacity_factor,
                  "bytes_per_element": 4,
                  "parallel": {"mp": self.mp, "ep": self.ep, "esp": self.esp}}
        if self.gated_linear_unit:  # absent otherwise: GELU layers' configs stay as they were
            config["gated_linear_unit"] = True
        return config

    def _agree_step(self, phase: int, tokens: int, batch: int) -> None:
        """Every rank begins the same call of this layer (collective; under _LOCK)."""
        call = self._calls
        self._calls += 1
        if self.world_size == 1:
            return
        what = (f"moeplan.torch.MoE layer {self._layer_id} "
                f"{'backward' if phase == _BACKWARD else 'forward'} (call {call} on rank "
                f"{self.rank})")
        _C.agree([self._layer_id, call, phase, tokens, batch],
                 ["layer (construction order)", "call", "phase (0 forward, 1 backward)",
                  "tokens", "batch"], what,
                 rules=[_ORDER_RULE] * 3 + [_SHAPE_RULE] * 2, timeout_s=self.timeout_s)

    def _layer_for(self, tokens: int, batch: int):
        entry = self._shapes.get((tokens, batch))
        if entry is not None:
            self._shapes.move_to_end((tokens, batch))
        else:
            config = self.layer_config(tokens, batch)
            schedule, answer = self.schedule, None
            if schedule == moeplan_schedules.AUTO:
                answer = self.planner.plan(config)
                schedule = answer["schedule"]
            entry = (_C.Layer(canonical_json(config), schedule), schedule, config, answer)
            self._shapes[(tokens, batch)] = entry
            while len(self._shapes) > self.max_runners:
                self._shapes.popitem(last=False)
        runner, self.last_schedule, self.last_layer, answer = entry
        if answer is not None:
            self.last_plan = answer
        self._last_runner = runner
        return runner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"MoE: the input must be a torch.Tensor, got {type(x).__name__}")
        if x.device.type != "cpu":
            raise ValueError(f"MoE: the input is on {x.device}; this build of moeplan.torch runs "
                             f"CPU tensors (the CPU kernels over MPI; CUDA built: "
                             f"{_C.cuda_built()}, but Debian's libtorch has no CUDA)")
        if x.dtype != torch.float32:
            raise TypeError(f"MoE: the input must be float32, got {x.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.model_dim:
            raise ValueError(f"MoE: the input's last dimension must be model_dim="
                             f"{self.model_dim}, got shape {list(x.shape)}")
        tokens = x.numel() // self.model_dim
        if tokens == 0:
            raise ValueError("MoE: the input has no tokens")
        batch = x.shape[0] if x.dim() >= 3 else 1
        for p in (self.gate_weight, self.w1, self.w2):
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise TypeError(f"MoE: parameters must stay float32 on the CPU, got {p.dtype} "
                                f"on {p.device}")
        scale = 1.0 / self.dp if self.expert_grad == "mean" else 1.0
        with _LOCK:
            # A rank with another shape, or in another call, would wait in
            # another collective: every rank checks first.
            self._agree_step(_FORWARD, tokens, batch)
            layer = self._layer_for(tokens, batch)
            y = _MoEFunction.apply(x.reshape(tokens, self.model_dim), self.gate_weight, self.w1,
                                   self.w2, layer, scale, self, batch)
        return y.reshape(x.shape)

    # ---- measured times -------------------------------------------------------------

    def record_timings(self) -> None:
        """Keeps the last forward + backward's op durations, each op's latest
        start and end over the ranks (collective: call it on every rank, after
        backward)."""
        if self._last_runner is None:
            return
        layer = self._last_runner
        total = 0.0
        with _LOCK:
            timings = layer.timings(over_ranks=True)
        for name, _phase, start, end in timings:
            self._times.setdefault(name, []).append(end - start)
            self._starts.setdefault(name, []).append(start)
            total = max(total, end)
        self._totals.append(total)

    def measured(self) -> Dict[str, Any]:
        """Median op durations, starts and layer time (µs) over the recorded steps."""
        if not self._totals:
            return {}
        return {"schedule": self.last_schedule, "layer": self.last_layer,
                "steps": len(self._totals),
                "ops": {n: statistics.median(v) for n, v in self._times.items()},
                "starts": {n: statistics.median(v) for n, v in self._starts.items()},
                "total_us": statistics.median(self._totals)}


def dense_parameters(module: nn.Module) -> List[nn.Parameter]:
    """The parameters to average over data-parallel ranks: all but expert shards."""
    return [p for p in module.parameters() if not getattr(p, "moeplan_expert", False)]
