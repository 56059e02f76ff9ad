"""moeplan.torch: an MoE layer for PyTorch whose schedule comes from moeplan's
planner and runs on moeplan's executor (pytorch/README.md).

    from moeplan.torch import MoE, Planner, init_process_group
    init_process_group()                 # gloo over the mpirun (or torchrun-style) ranks
    moe = MoE(model_dim=512, hidden_dim=2048, num_experts=8, top_k=2,
              capacity_factor=1.25, ep=4, schedule="auto",
              planner=Planner(server="127.0.0.1:50051", profile="cpu-testbed-2x2"))
    y = moe(x)                           # x: [..., model_dim] float32 CPU tensor

The layer's forward and backward are the planner's op graph for the chosen
schedule (default, s1 or s2), run by the executor's CPU kernels over MPI
inside a torch.autograd.Function; gradients land in the module's parameters
(the gate weight, replicated, and this rank's expert shards) and the input.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import statistics
import sys
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn


def _load_mpi_globally() -> None:
    # Open MPI loads its components with dlopen and needs libmpi's symbols
    # global; Python imports extensions with RTLD_LOCAL.
    for name in ("libmpi.so.40", "libmpi.so"):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            return
        except OSError:
            continue


_load_mpi_globally()
from . import _C  # noqa: E402  (after libmpi is global)

__all__ = ["MoE", "Planner", "PlannerUnavailable", "init_process_group", "world",
           "SCHEDULES"]

SCHEDULES = ("default", "s1", "s2", "auto")
GATES = ("topk", "switch")


_hook_installed = False


def _abort_on_uncaught(kind, value, tb):
    # One rank dying of an exception would leave the others waiting in the
    # next collective: print it, then end the whole job.
    sys.__excepthook__(kind, value, tb)
    sys.stderr.flush()
    _C.abort(1)


def world() -> Tuple[int, int]:
    """(rank, size) of the MPI world the layer runs on (initialises MPI once).

    With more than one rank, an uncaught exception on any rank ends the whole
    job (MPI_Abort after the traceback) instead of leaving the others hanging;
    MOEPLAN_TORCH_NO_ABORT=1 turns that off.
    """
    global _hook_installed
    rank, size = _C.init_mpi()
    if size > 1 and not _hook_installed and os.environ.get("MOEPLAN_TORCH_NO_ABORT") != "1":
        if sys.excepthook is sys.__excepthook__:
            sys.excepthook = _abort_on_uncaught
        _hook_installed = True
    return rank, size


class PlannerUnavailable(ConnectionError):
    """The planner server did not answer and the Planner was told not to fall back."""


def _canonical(layer: Dict[str, Any]) -> str:
    return json.dumps(layer, sort_keys=True, separators=(",", ":"))


class Planner:
    """Answers `schedule="auto"`: which schedule is fastest for a layer.

    Rank 0 asks — moeplan-server at `server` if given, else the planner in
    this process on `profile` (a built-in profile name or a profile JSON
    file) — once per layer shape, and broadcasts the answer, so every rank
    runs the same schedule. If the server does not answer, the local profile
    plans instead with a warning, or PlannerUnavailable is raised when
    `fallback` is False.
    """

    def __init__(self, server: Optional[str] = None, profile: str = "a100-8x8",
                 fallback: bool = True, timeout_s: float = 10.0,
                 tls_ca: Optional[str] = None, token_file: Optional[str] = None):
        if not isinstance(profile, str) or not profile:
            raise ValueError("Planner.profile: must be a profile name or a profile file path")
        if timeout_s <= 0:
            raise ValueError(f"Planner.timeout_s: must be > 0 (got {timeout_s})")
        self.server = server
        self.profile = profile
        self.fallback = bool(fallback)
        self.timeout_s = float(timeout_s)
        self.tls_ca = tls_ca
        self.token_file = token_file
        self._cache: Dict[str, Dict[str, Any]] = {}
        self._client = None

    def client(self):
        """A moeplan_client.PlannerClient on `server` (None without one)."""
        if self.server is None:
            return None
        if self._client is None:
            import moeplan_client  # the Python client, next to this package
            self._client = moeplan_client.PlannerClient(self.server, timeout_s=self.timeout_s,
                                                         tls_ca=self.tls_ca, token_file=self.token_file)
        return self._client

    def _ask(self, layer: Dict[str, Any], schedules: Tuple[str, ...]) -> Dict[str, Any]:
        """This rank's answer: {"plan": PlanLayerResponse dict, "source": ...}."""
        if self.server is not None:
            try:
                import moeplan_client
                plan = self.client().plan_layer(layer, self.profile, schedules=list(schedules))
                return {"plan": plan, "source": f"server {self.server}"}
            except moeplan_client.PlannerError as e:
                if e.code != "UNAVAILABLE" and e.code != "DEADLINE_EXCEEDED":
                    # The server answered: the request is wrong, not the link.
                    return {"error": f"{e.code}: {e.message}", "kind": "value"}
                if not self.fallback:
                    return {"error": f"moeplan.torch: the planner server {self.server} did not "
                                     f"answer ({e.code}: {e.message})", "kind": "unavailable"}
                warnings.warn(f"moeplan.torch: the planner server {self.server} did not answer "
                              f"({e.code}); planning with the local profile {self.profile!r}",
                              RuntimeWarning, stacklevel=4)
        try:
            plan = json.loads(_C.plan_layer(_canonical(layer), self.profile, list(schedules)))
        except (ValueError, KeyError) as e:
            return {"error": str(e), "kind": "value"}
        return {"plan": plan, "source": f"local profile {self.profile}"}

    def plan(self, layer: Dict[str, Any], schedules: Tuple[str, ...] = ()) -> Dict[str, Any]:
        """The plan for `layer` under `schedules` (empty: the planner's own
        set, which leaves out S1/S2 where they equal the default, mp = 1);
        collective over the MPI world: rank 0 asks, every rank gets its
        answer: {"schedule" (the fastest), "plan", "source"}."""
        schedules = tuple(schedules)
        key = _canonical(layer) + "|" + ",".join(schedules)
        if key not in self._cache:
            rank, _ = world()
            mine = ""
            if rank == 0:
                try:
                    mine = json.dumps(self._ask(layer, schedules))
                except Exception as e:  # noqa: BLE001  (every rank must hear about it)
                    mine = json.dumps({"error": f"{type(e).__name__}: {e}", "kind": "value"})
            answer = json.loads(_C.broadcast(mine.encode(), 0).decode())
            if "error" in answer:
                if answer["kind"] == "unavailable":
                    raise PlannerUnavailable(answer["error"])
                raise ValueError(f"moeplan.torch: planning failed: {answer['error']}")
            best = answer["plan"]["best_schedule"]
            answer["schedule"] = best.replace("SCHEDULE_", "").lower()
            self._cache[key] = answer
        return self._cache[key]

    def predict(self, layer: Dict[str, Any], schedule: str) -> Dict[str, Any]:
        """The planner's candidate for `schedule` on `layer` (a CandidatePlan
        dict: total_us, forward_us, ...), asked for by name where the plan of
        the planner's own set does not hold it (collective, like plan)."""
        if schedule not in ("default", "s1", "s2"):
            raise ValueError(f"Planner.predict: schedule must be default, s1 or s2 "
                             f"(got {schedule!r})")
        want = "SCHEDULE_" + schedule.upper()
        for schedules in ((), (schedule,)):
            for c in self.plan(layer, schedules)["plan"]["candidates"]:
                if c["schedule"] == want:
                    return c
        raise ValueError(f"Planner.predict: the planner has no {schedule} plan for the layer")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class _MoEFunction(torch.autograd.Function):
    """One MoE layer on the executor: forward runs the plan's forward ops,
    backward its backward ops on what the forward left in the buffers."""

    @staticmethod
    def forward(ctx, x, gate_weight, w1, w2, layer, expert_scale):
        y = layer.forward(x, gate_weight, w1, w2)
        ctx.layer = layer
        ctx.expert_scale = expert_scale
        ctx.generation = layer.forwards
        ctx.save_for_backward(x, gate_weight, w1, w2)
        return y

    @staticmethod
    def backward(ctx, dy):
        layer = ctx.layer
        x, gate_weight, w1, w2 = ctx.saved_tensors
        if layer.forwards != ctx.generation:
            # Another forward of this shape ran since (gradient accumulation
            # over several forwards, or checkpointing): its buffers hold that
            # one, so this forward is run again first.
            layer.forward(x, gate_weight, w1, w2)
        dx, dgate, dw1, dw2 = layer.backward(dy.contiguous())
        if ctx.expert_scale != 1.0:
            dw1.mul_(ctx.expert_scale)
            dw2.mul_(ctx.expert_scale)
        return dx, dgate, dw1, dw2, None, None


class MoE(nn.Module):
    """A Mixture-of-Experts FFN layer run by moeplan's executor.

    Args:
        model_dim, hidden_dim: M and H (each expert is GELU(x W1) W2, no biases).
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

    Parameters: gate_weight [M, E] (replicated: average its gradient with the
    dense ones), w1 [E/ep, M, H/esp] and w2 [E/ep, H/esp, M] (this rank's expert
    shards, marked `moeplan_expert = True`: leave them out of data-parallel
    reductions; `dense_parameters(model)` lists the others).
    """

    def __init__(self, model_dim: int, hidden_dim: int, num_experts: int,
                 top_k: Optional[int] = None,
                 capacity_factor: float = 1.0, gate: str = "topk", mp: int = 1,
                 ep: Optional[int] = None, esp: int = 1, schedule: str = "default",
                 planner: Optional[Planner] = None, seed: int = 0, expert_grad: str = "mean"):
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
        if schedule in ("s1", "s2") and esp != mp:
            raise ValueError(f"MoE.schedule: {schedule} needs esp == mp (the ESP group is the "
                             f"MP group); got mp={mp}, esp={esp}")
        if expert_grad not in ("mean", "sum"):
            raise ValueError(f"MoE.expert_grad: must be 'mean' or 'sum' (got {expert_grad!r})")
        self.model_dim, self.hidden_dim, self.num_experts = model_dim, hidden_dim, num_experts
        self.top_k, self.capacity_factor, self.gate = top_k, float(capacity_factor), gate
        self.mp, self.ep, self.esp, self.dp = mp, ep, esp, size // mp
        self.schedule = schedule
        self.planner = planner if planner is not None else (Planner() if schedule == "auto"
                                                            else None)
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
        w1 = torch.empty(self.local_experts, model_dim, self.hidden_shard)
        w2 = torch.empty(self.local_experts, self.hidden_shard, model_dim)
        e0, h0 = self.place["ep_rank"] * self.local_experts, self.place["esp_rank"] * self.hidden_shard
        for l in range(self.local_experts):
            ge = torch.Generator().manual_seed(seed * 1_000_003 + e0 + l + 1)
            full1 = (torch.rand(model_dim, hidden_dim, generator=ge) * 2 - 1) / math.sqrt(model_dim)
            full2 = (torch.rand(hidden_dim, model_dim, generator=ge) * 2 - 1) / math.sqrt(hidden_dim)
            w1[l] = full1[:, h0:h0 + self.hidden_shard]
            w2[l] = full2[h0:h0 + self.hidden_shard, :]
        self.w1 = nn.Parameter(w1)
        self.w2 = nn.Parameter(w2)
        self.w1.moeplan_expert = True
        self.w2.moeplan_expert = True

        # Per (tokens, batch): the runner, its schedule, its LayerConfig and the
        # "auto" answer; a forward of a known shape looks nothing else up.
        self._shapes: Dict[Tuple[int, int], Tuple[Any, str, Dict[str, Any], Any]] = {}
        self._last_runner = None
        self.last_plan: Optional[Dict[str, Any]] = None  # the "auto" answer of the last shape
        self.last_schedule: Optional[str] = None
        self.last_layer: Optional[Dict[str, Any]] = None
        self._times: Dict[str, List[float]] = {}
        self._totals: List[float] = []

    def extra_repr(self) -> str:
        return (f"model_dim={self.model_dim}, hidden_dim={self.hidden_dim}, "
                f"num_experts={self.num_experts}, top_k={self.top_k}, "
                f"capacity_factor={self.capacity_factor}, mp={self.mp}, ep={self.ep}, "
                f"esp={self.esp}, schedule={self.schedule!r}")

    @torch.no_grad()
    def load_expert_weights(self, w1: torch.Tensor, w2: torch.Tensor) -> None:
        """Sets this rank's shards from the whole experts: w1 [E, M, H], w2 [E, H, M]."""
        E, M, H = self.num_experts, self.model_dim, self.hidden_dim
        if tuple(w1.shape) != (E, M, H) or tuple(w2.shape) != (E, H, M):
            raise ValueError(f"MoE.load_expert_weights: need w1 [{E}, {M}, {H}] and "
                             f"w2 [{E}, {H}, {M}], got {list(w1.shape)} and {list(w2.shape)}")
        e0, h0 = self.place["ep_rank"] * self.local_experts, self.place["esp_rank"] * self.hidden_shard
        e1, h1 = e0 + self.local_experts, h0 + self.hidden_shard
        self.w1.copy_(w1[e0:e1, :, h0:h1])
        self.w2.copy_(w2[e0:e1, h0:h1, :])

    def layer_config(self, tokens: int, batch: int = 1) -> Dict[str, Any]:
        """The LayerConfig (the planner's and the server's) of `tokens` tokens per MP group."""
        seq = tokens // batch
        return {"batch_size": batch, "seq_len": seq, "model_dim": self.model_dim,
                "hidden_dim": self.hidden_dim, "num_experts": self.num_experts,
                "top_k": self.top_k, "capacity_factor": self.capacity_factor,
                "bytes_per_element": 4,
                "parallel": {"mp": self.mp, "ep": self.ep, "esp": self.esp}}

    def _layer_for(self, tokens: int, batch: int):
        entry = self._shapes.get((tokens, batch))
        if entry is None:
            config = self.layer_config(tokens, batch)
            schedule, answer = self.schedule, None
            if schedule == "auto":
                answer = self.planner.plan(config)
                schedule = answer["schedule"]
            entry = (_C.Layer(_canonical(config), schedule), schedule, config, answer)
            self._shapes[(tokens, batch)] = entry
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
        if self.world_size > 1:
            # A rank with another shape would wait in another collective.
            _C.agree([tokens, batch], ["tokens", "batch"], "moeplan.torch.MoE forward")
        layer = self._layer_for(tokens, batch)
        scale = 1.0 / self.dp if self.expert_grad == "mean" else 1.0
        y = _MoEFunction.apply(x.reshape(tokens, self.model_dim), self.gate_weight, self.w1,
                               self.w2, layer, scale)
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
        for name, _phase, start, end in layer.timings(over_ranks=True):
            self._times.setdefault(name, []).append(end - start)
            total = max(total, end)
        self._totals.append(total)

    def measured(self) -> Dict[str, Any]:
        """Median op durations and layer time (µs) over the recorded steps."""
        if not self._totals:
            return {}
        return {"schedule": self.last_schedule, "layer": self.last_layer,
                "steps": len(self._totals),
                "ops": {n: statistics.median(v) for n, v in self._times.items()},
                "total_us": statistics.median(self._totals)}


def dense_parameters(module: nn.Module) -> List[nn.Parameter]:
    """The parameters to average over data-parallel ranks: all but expert shards."""
    return [p for p in module.parameters() if not getattr(p, "moeplan_expert", False)]


def _interface_addresses() -> List[str]:
    import fcntl
    import socket
    import struct
    out = []
    for _, name in socket.if_nameindex():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                 struct.pack("256s", name.encode()[:15]))
            out.append(socket.inet_ntoa(packed[20:24]))
        except OSError:
            pass
        finally:
            s.close()
    return [a for a in out if not a.startswith("127.")]


def init_process_group(backend: str = "gloo", timeout_s: float = 120.0) -> Tuple[int, int]:
    """torch.distributed over the same ranks as the MoE layers' MPI world.

    Under mpirun: rank and size from MPI; rank 0 picks the rendezvous address
    (MASTER_ADDR/MASTER_PORT if set; else 127.0.0.1 when every rank is on one
    host, or its first non-loopback IPv4 address) and a free port, and tells
    the others. With torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT) they are used as they are, and must name the MPI ranks: the
    layers' executor still runs over MPI, so launch with mpirun.
    Returns (rank, world size).
    """
    import datetime
    import socket
    import torch.distributed as dist
    rank, size = world()
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() != size or dist.get_rank() != rank:
            raise RuntimeError(f"moeplan.torch: torch.distributed is rank {dist.get_rank()} of "
                               f"{dist.get_world_size()}, MPI rank {rank} of {size}")
        return rank, size
    env_rank, env_size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if env_size is not None and int(env_size) != size:
        raise RuntimeError(f"moeplan.torch: WORLD_SIZE={env_size} but MPI has {size} rank(s): "
                           f"the MoE layers run over MPI, so launch with mpirun -np {env_size}")
    if env_rank is not None and int(env_rank) != rank:
        raise RuntimeError(f"moeplan.torch: RANK={env_rank} but this is MPI rank {rank}")
    # Every rank takes part in both broadcasts, whatever its environment says.
    host = socket.gethostname()
    same = _C.all_true(_C.broadcast(host.encode() if rank == 0 else b"", 0).decode() == host)
    message = b""
    if rank == 0:
        addr = os.environ.get("MASTER_ADDR")
        if addr is None:
            addrs = _interface_addresses()
            addr = "127.0.0.1" if same or not addrs else addrs[0]
        port = os.environ.get("MASTER_PORT")
        if port is None:
            with socket.socket() as s:
                s.bind(("", 0))
                port = str(s.getsockname()[1])
        message = f"{addr} {port}".encode()
    addr, port = _C.broadcast(message, 0).decode().split()
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=timeout_s))
    return rank, size
