#!/usr/bin/env python3
"""moeplan.torch.MoE against a plain-PyTorch MoE (moeplan/torch/reference.py).

    /usr/bin/python3 tests/python/torch_moe_test.py            # one process
    mpirun -np 4 /usr/bin/python3 tests/python/torch_moe_test.py

One process: every schedule (and the switch gate, and SwiGLU experts) on a
one-rank layout, then bad use (dtype, device, shape, layout, schedule, a planner server that does
not answer) and a backward after a second forward. At 4 ranks: every layout
of 4 ranks the executor runs, every schedule it allows; each rank's output,
input gradient and gate-weight gradient, and the expert-weight gradients
gathered from every rank's shards, against the reference computed on the
gathered inputs (torch.distributed, gloo); SwiGLU experts
(gated_linear_unit) on layouts with ep and esp > 1, their w1 shards [gate | up]
put back into whole [E, M, 2H] experts. Capacity factor 0.75: every case
drops tokens (asserted). Prints "PASS" on rank 0.
"""

import sys
import warnings

import torch
import torch.distributed as dist

from moeplan.torch import MoE, Planner, PlannerUnavailable, init_process_group, world
from moeplan.torch import reference

M, H, E, K, F = 16, 32, 4, 2, 0.75
TOL = 1e-4  # of the reference tensor's max |value| (the executor's own check)


def expect_close(what, got, want):
    scale = max(1.0, float(want.abs().max()))
    diff = float((got - want).abs().max())
    if not diff <= TOL * scale:
        raise AssertionError(f"{what}: max |diff| {diff:.3g} over {TOL * scale:.3g} "
                             f"(max |ref| {scale:.3g})")


def full_weights(seed, gated=False):
    g = torch.Generator().manual_seed(seed)
    gate = (torch.rand(M, E, generator=g) * 2 - 1) / M ** 0.5
    w1 = (torch.rand(E, M, 2 * H if gated else H, generator=g) * 2 - 1) / M ** 0.5
    w2 = (torch.rand(E, H, M, generator=g) * 2 - 1) / H ** 0.5
    return gate, w1, w2


def seeded(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def make(mp, ep, esp, schedule, gate_kind="topk", seed=7, gated=False, **kw):
    top_k = 1 if gate_kind == "switch" else K
    moe = MoE(M, H, E, top_k=None if gate_kind == "switch" else top_k, capacity_factor=F,
              gate=gate_kind, mp=mp, ep=ep, esp=esp, schedule=schedule,
              gated_linear_unit=gated, **kw)
    gate, w1, w2 = full_weights(seed, gated)
    with torch.no_grad():
        moe.gate_weight.copy_(gate)
    moe.load_expert_weights(w1, w2)
    return moe, gate, w1, w2, top_k


def reference_grads(xs, dys, gate, w1, w2, top_k, groups, dp, gated=False):
    """Per MP group: y, dx, dgate of that group's loss; the experts' grads of the
    mean over the groups' losses (MoE's expert_grad="mean")."""
    gate = gate.clone().requires_grad_()
    w1 = w1.clone().requires_grad_()
    w2 = w2.clone().requires_grad_()
    out, total, dropped = [], 0.0, 0
    for x, dy in zip(xs, dys):
        x = x.clone().requires_grad_()
        y = reference.moe_forward(x, gate, w1, w2, top_k, F, gate_groups=groups,
                                  gated_linear_unit=gated)
        loss = (y * dy).sum()
        dx, dgate = torch.autograd.grad(loss, (x, gate), retain_graph=True)
        out.append((y.detach(), dx, dgate))
        total = total + loss / dp
        dropped += reference.dropped(x.detach(), gate.detach(), top_k, F, E, groups)
    dw1, dw2 = torch.autograd.grad(total, (w1, w2))
    return out, dw1, dw2, dropped


def one_process():
    tokens = 24
    x0, dy0 = seeded(1, tokens, M), seeded(2, tokens, M)
    for schedule in ("default", "s1", "s2"):
        for gate_kind, gated in (("topk", False), ("switch", False), ("topk", True)):
            moe, gate, w1, w2, top_k = make(1, 1, 1, schedule, gate_kind, gated=gated)
            assert tuple(moe.w1.shape) == (E, M, 2 * H if gated else H), moe.w1.shape
            x = x0.clone().requires_grad_()
            y = moe(x)
            y.backward(dy0)
            per_group, rw1, rw2, dropped = reference_grads([x0], [dy0], gate, w1, w2, top_k, 1, 1,
                                                           gated)
            ry, rdx, rdgate = per_group[0]
            kind = gate_kind + ("/swiglu" if gated else "")
            assert dropped > 0, f"{schedule}/{kind}: capacity dropped nothing"
            what = f"1 rank {schedule}/{kind}"
            expect_close(f"{what} y", y.detach(), ry)
            expect_close(f"{what} dx", x.grad, rdx)
            expect_close(f"{what} dgate", moe.gate_weight.grad, rdgate)
            expect_close(f"{what} dw1", moe.w1.grad, rw1)
            expect_close(f"{what} dw2", moe.w2.grad, rw2)

    # Shapes [B, T, M] and a second call accumulate like any nn.Module.
    moe, gate, w1, w2, _ = make(1, 1, 1, "s2")
    xb = x0.reshape(2, 12, M).clone().requires_grad_()
    moe(xb).backward(dy0.reshape(2, 12, M))
    moe(xb).backward(dy0.reshape(2, 12, M))
    (_, rdx, _), = reference_grads([x0], [dy0], gate, w1, w2, K, 1, 1)[0]
    expect_close("accumulated dx", xb.grad.reshape(tokens, M), 2 * rdx)

    # Two forwards, then both backwards: the first backward runs its forward again.
    moe, gate, w1, w2, _ = make(1, 1, 1, "default")
    xa, xb = x0.clone().requires_grad_(), seeded(3, tokens, M).requires_grad_()
    ya, yb = moe(xa), moe(xb)
    ya.backward(dy0)
    (_, rdx, _), = reference_grads([x0], [dy0], gate, w1, w2, K, 1, 1)[0]
    expect_close("dx of the earlier forward", xa.grad, rdx)
    yb.backward(dy0)

    # "auto" on the local planner: a plan, and a schedule that runs.
    moe, gate, w1, w2, _ = make(1, 1, 1, "auto", planner=Planner(profile="cpu-testbed-2x2"))
    moe(x0).sum().backward()
    assert moe.last_schedule in ("default", "s1", "s2"), moe.last_schedule
    assert moe.last_plan["source"] == "local profile cpu-testbed-2x2", moe.last_plan["source"]
    assert moe.last_plan["plan"]["candidates"], "the local plan has no candidates"
    # At mp = 1 the planner's own set leaves S1/S2 out (they equal the default);
    # predict() asks for them by name.
    planner = Planner(profile="cpu-testbed-2x2")
    layer = moe.layer_config(tokens)
    assert [c["schedule"] for c in planner.plan(layer)["plan"]["candidates"]] == \
        ["SCHEDULE_DEFAULT"], planner.plan(layer)["plan"]["candidates"]
    for s in ("default", "s1", "s2"):
        c = planner.predict(layer, s)
        assert c["schedule"] == "SCHEDULE_" + s.upper() and c["total_us"] > 0, c
    expect_raises(ValueError, "Planner.predict", lambda: planner.predict(layer, "s3"))

    # A server that does not answer: a warning and the local profile, or an error.
    dead = "127.0.0.1:1"
    moe, *_ = make(1, 1, 1, "auto", planner=Planner(server=dead, profile="a100-8x8",
                                                     timeout_s=2.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moe(x0)
    assert any("did not answer" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert moe.last_plan["source"] == "local profile a100-8x8", moe.last_plan
    moe, *_ = make(1, 1, 1, "auto", planner=Planner(server=dead, fallback=False, timeout_s=2.0))
    expect_raises(PlannerUnavailable, "did not answer", lambda: moe(x0))

    # Bad use: clear exceptions naming what is wrong.
    moe, *_ = make(1, 1, 1, "default")
    expect_raises(TypeError, "float32", lambda: moe(x0.double()))
    expect_raises(ValueError, "is on meta", lambda: moe(torch.empty(4, M, device="meta")))
    expect_raises(ValueError, "model_dim=16", lambda: moe(torch.zeros(4, M + 1)))
    expect_raises(TypeError, "torch.Tensor", lambda: moe([1.0] * M))
    expect_raises(ValueError, "ep*esp must equal the world size 1",
                  lambda: MoE(M, H, E, ep=2))
    expect_raises(ValueError, "MoE.mp: must divide the world size",
                  lambda: MoE(M, H, E, mp=2, esp=1, ep=1))
    expect_raises(ValueError, "MoE.schedule", lambda: MoE(M, H, E, schedule="fast"))
    expect_raises(ValueError, "MoE.top_k", lambda: MoE(M, H, E, gate="switch", top_k=2))
    expect_raises(ValueError, "MoE.capacity_factor", lambda: MoE(M, H, E, capacity_factor=0))
    expect_raises(ValueError, "MoE.gated_linear_unit", lambda: MoE(M, H, E, gated_linear_unit=1))
    glu = make(1, 1, 1, "default", gated=True)[0]
    expect_raises(ValueError, f"need w1 [{E}, {M}, {2 * H}]",
                  lambda: glu.load_expert_weights(*full_weights(7)[1:]))
    expect_raises(ValueError, "Planner.profile",
                  lambda: Planner(profile=""))
    bad = make(1, 1, 1, "auto", planner=Planner(profile="no-such-profile"))[0]
    expect_raises(ValueError, "no-such-profile", lambda: bad(x0))


def expect_raises(kind, text, fn):
    try:
        fn()
    except kind as e:
        if text not in str(e):
            raise AssertionError(f"{kind.__name__} without {text!r}: {e}") from None
        return
    raise AssertionError(f"expected {kind.__name__} ({text!r}), nothing raised")


# (mp, ep, esp) of 4 ranks, and the schedules the executor runs on each
# (s1/s2 need esp == mp).
LAYOUTS_4 = [
    (1, 4, 1, ("default", "s1", "s2")),
    (2, 2, 2, ("default", "s1", "s2")),
    (4, 1, 4, ("default", "s1", "s2")),
    (2, 4, 1, ("default",)),
    (4, 2, 2, ("default",)),
]


def gather(t):
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return out


# SwiGLU experts at 4 ranks: whole experts on every rank (esp 1), ep and esp
# both 2 under every schedule, H split 4 ways.
GATED_4 = [(1, 4, 1, "default"), (2, 2, 2, "default"), (2, 2, 2, "s1"), (2, 2, 2, "s2"),
           (4, 1, 4, "s2"), (4, 2, 2, "default")]


def many_ranks(rank, size):
    tokens = 24
    cases = [(mp, ep, esp, s, "topk", False) for mp, ep, esp, ss in LAYOUTS_4 for s in ss]
    cases.append((2, 2, 2, "s2", "switch", False))
    cases += [(mp, ep, esp, s, "topk", True) for mp, ep, esp, s in GATED_4]
    for mp, ep, esp, schedule, gate_kind, gated in cases:
        kind = gate_kind + ("/swiglu" if gated else "")
        what = f"{size} ranks mp={mp} ep={ep} esp={esp} {schedule}/{kind}"
        dp = size // mp
        moe, gate, w1, w2, top_k = make(mp, ep, esp, schedule, gate_kind, gated=gated)
        group = moe.place["mp_group"]
        # Ranks of one MP group feed the same tokens; groups differ.
        x0, dy0 = seeded(100 + group, tokens, M), seeded(200 + group, tokens, M)
        x = x0.clone().requires_grad_()
        y = moe(x)
        y.backward(dy0)
        # The reference runs on what the ranks fed, gathered.
        xs_all, dys_all = gather(x0), gather(dy0)
        xs = [xs_all[g * mp] for g in range(dp)]
        dys = [dys_all[g * mp] for g in range(dp)]
        for r in range(size):
            assert torch.equal(xs_all[r], xs[r // mp]), f"{what}: rank {r} fed other tokens"
        groups = mp if schedule == "s1" else 1
        per_group, rw1, rw2, dropped = reference_grads(xs, dys, gate, w1, w2, top_k, groups, dp,
                                                       gated)
        assert dropped > 0, f"{what}: capacity dropped nothing"
        ry, rdx, rdgate = per_group[group]
        expect_close(f"{what} rank {rank} y", y.detach(), ry)
        expect_close(f"{what} rank {rank} dx", x.grad, rdx)
        expect_close(f"{what} rank {rank} dgate", moe.gate_weight.grad, rdgate)
        # Every rank's shard gradient, put back into whole experts (SwiGLU: the
        # shard's gate half at h0, its up half at H + h0).
        dw1 = torch.zeros(E, M, 2 * H if gated else H)
        dw2 = torch.zeros(E, H, M)
        shards1, shards2 = gather(moe.w1.grad), gather(moe.w2.grad)
        hs = H // esp
        for r in range(size):
            e0, h0 = (r // esp) * (E // ep), (r % esp) * hs
            for half in range(2 if gated else 1):
                dw1[e0:e0 + E // ep, :, half * H + h0:half * H + h0 + hs] = \
                    shards1[r][:, :, half * hs:(half + 1) * hs]
            dw2[e0:e0 + E // ep, h0:h0 + hs, :] = shards2[r]
        expect_close(f"{what} dw1 (all shards)", dw1, rw1)
        expect_close(f"{what} dw2 (all shards)", dw2, rw2)
        if rank == 0:
            print(f"ok: {what} ({dropped} choices dropped)", flush=True)

    # Ranks calling with other token counts: an error on every rank, no hang.
    moe, *_ = make(1, size, 1, "default")
    expect_raises(ValueError, "tokens differs between ranks (from 8 to 11)",
                  lambda: moe(torch.zeros(8 + rank, M)))

    # A layout that does not fit the world fails on every rank alike.
    expect_raises(ValueError, f"ep*esp must equal the world size {size}",
                  lambda: MoE(M, H, E, ep=3, esp=1))
    expect_raises(ValueError, "MoE.esp: must divide mp=1",
                  lambda: MoE(M, H, E, mp=1, ep=size // 2, esp=2))
    expect_raises(ValueError, "s1 needs esp == mp",
                  lambda: MoE(M, H, E, mp=2, ep=4, esp=1, schedule="s1"))


def main():
    rank, size = world()
    if size == 1:
        one_process()
    else:
        init_process_group()
        many_ranks(rank, size)
        dist.barrier()
    if rank == 0:
        print("PASS", flush=True)


if __name__ == "__main__":
    sys.exit(main())
