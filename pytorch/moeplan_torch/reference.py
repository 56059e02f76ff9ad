"""A plain-PyTorch MoE layer with the executor's semantics (docs/executor.md
"Semantics the layer's ops fix"), for checking moeplan.torch.MoE against
PyTorch's own autograd. No moeplan code runs here.

    fp32 logits x @ Wg, softmax, top-k by probability (ties: the lower expert);
    capacity handed out choice-major (every token's first choice in token
    order, then every second choice, ...), an expert keeps its first T;
    y[s] = sum over kept choices of p * GELU_tanh(x[s] W1[e]) W2[e], or with
    gated_linear_unit (SwiGLU) p * (silu(x[s] W1g[e]) * (x[s] W1u[e])) W2[e]
    where W1[e] = [W1g[e] | W1u[e]] is [M, 2H];
    gradients flow through the kept probabilities, not the choice.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.nn.functional as F


def capacity(top_k: int, capacity_factor: float, tokens: int, num_experts: int) -> int:
    """ceil(k f S / E), exact for factors with at most 6 decimals (the planner's rule)."""
    f = round(capacity_factor * 1_000_000)
    if f / 1_000_000 == capacity_factor:
        return -(-(top_k * f * tokens) // (num_experts * 1_000_000))
    return math.ceil(top_k * capacity_factor * tokens / num_experts)


def route(probs: torch.Tensor, top_k: int, cap: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(expert [S, k], kept [S, k] bool) for one gating group of S tokens."""
    S, E = probs.shape
    # A stable descending sort puts the lower expert first among equals.
    order = torch.sort(probs.detach(), dim=1, descending=True, stable=True).indices
    expert = order[:, :top_k]
    kept = torch.zeros(S, top_k, dtype=torch.bool)
    used = torch.zeros(E, dtype=torch.long)
    for j in range(top_k):
        onehot = F.one_hot(expert[:, j], E)                     # [S, E]
        slot = used + torch.cumsum(onehot, dim=0) - onehot      # the slot it would take
        slot = (slot * onehot).sum(dim=1)
        kept[:, j] = slot < cap
        used = used + (onehot * kept[:, j:j + 1]).sum(dim=0)
    return expert, kept


def expert_ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
               gated_linear_unit: bool = False) -> torch.Tensor:
    """One expert on rows x [n, M]: GELU_tanh(x w1) w2, or SwiGLU's
    (silu(x w1[:, :H]) * (x w1[:, H:])) w2 with w1 [M, 2H] = [gate | up]."""
    if gated_linear_unit:
        gate, up = (x @ w1).chunk(2, dim=1)
        return (F.silu(gate) * up) @ w2
    return F.gelu(x @ w1, approximate="tanh") @ w2


def moe_forward(x: torch.Tensor, gate_weight: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                top_k: int, capacity_factor: float, gate_groups: int = 1,
                gated_linear_unit: bool = False) -> torch.Tensor:
    """y for x [S, M] with whole experts w1 [E, M, H] (gated_linear_unit:
    [E, M, 2H], [gate | up]), w2 [E, H, M].

    gate_groups > 1 gates S / gate_groups tokens at a time with capacity of
    its own (the s1 schedule, one group per MP rank); the default and s2 gate
    the S tokens as one group.
    """
    S, M = x.shape
    E = w1.shape[0]
    if S % gate_groups != 0:
        raise ValueError(f"tokens ({S}) must be a multiple of gate_groups ({gate_groups})")
    probs = torch.softmax(x @ gate_weight, dim=1)
    n = S // gate_groups
    cap = capacity(top_k, capacity_factor, n, E)
    experts, keeps = [], []
    for g in range(gate_groups):
        e, k = route(probs[g * n:(g + 1) * n], top_k, cap)
        experts.append(e)
        keeps.append(k)
    expert, kept = torch.cat(experts), torch.cat(keeps)
    p = torch.gather(probs, 1, expert)                          # [S, k], differentiable
    y = torch.zeros_like(x)
    for e in range(E):
        rows, choice = torch.nonzero((expert == e) & kept, as_tuple=True)
        if rows.numel() == 0:
            continue
        out = expert_ffn(x[rows], w1[e], w2[e], gated_linear_unit)
        y = y.index_add(0, rows, p[rows, choice].unsqueeze(1) * out)
    return y


def dropped(x: torch.Tensor, gate_weight: torch.Tensor, top_k: int, capacity_factor: float,
            num_experts: int, gate_groups: int = 1) -> int:
    """How many routed choices capacity drops (for tests that must drop some)."""
    with torch.no_grad():
        probs = torch.softmax(x @ gate_weight, dim=1)
        n = x.shape[0] // gate_groups
        cap = capacity(top_k, capacity_factor, n, num_experts)
        return sum(int((~route(probs[g * n:(g + 1) * n], top_k, cap)[1]).sum())
                   for g in range(gate_groups))
