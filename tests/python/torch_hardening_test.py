#!/usr/bin/env python3
"""moeplan.torch under hostile use (issue 35, class 3): threads, ranks that
disagree, and many token counts.

    /usr/bin/python3 tests/python/torch_hardening_test.py              # threads, runners
    mpirun -np 2 /usr/bin/python3 tests/python/torch_hardening_test.py   # a rank skips backward
    MOEPLAN_TORCH_TIMEOUT_S=5 mpirun -np 2 /usr/bin/python3 \
        tests/python/torch_hardening_test.py stall                       # a rank stops calling

One process: four threads calling one layer get the single-threaded answers
(the layer serializes them); 200 distinct token counts keep at most
`max_runners` runners and no more OS threads than a full cache. Two ranks: a
rank that skips backward() and calls the next forward makes both ranks raise
ValueError naming the rule. `stall`: a rank that skips backward() and calls
nothing more ends the job within MOEPLAN_TORCH_TIMEOUT_S, naming the step
(ctest matches the message). Every mode arms an alarm, so a hang fails the
test instead of blocking it. Prints "PASS" on rank 0.
"""

import os
import time
import signal
import sys
import threading

import torch

from moeplan.torch import MoE, world

M, H, E = 16, 32, 4
HANG_S = 120  # a hang ends the process (SIGALRM: non-zero exit) after this


def seeded(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def step(moe, x, dy):
    x = x.clone().requires_grad_()
    y = moe(x)
    y.backward(dy)
    return y.detach(), x.grad


def threads_share_one_layer():
    moe = MoE(M, H, E, capacity_factor=0.75)
    inputs = [(seeded(i, 8 + 4 * (i % 2), M), seeded(50 + i, 8 + 4 * (i % 2), M))
              for i in range(4)]
    want = []
    for x, dy in inputs:
        moe.zero_grad()
        want.append(step(moe, x, dy))
    got, errors = {}, []

    def worker(i):
        try:
            x, dy = inputs[i]
            for _ in range(5):
                got[i] = step(moe, x, dy)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    stuck = [i for i, t in enumerate(threads) if t.is_alive()]
    if stuck:
        print(f"FAIL: threads {stuck} still inside the layer after 60 s (deadlock)", flush=True)
        os._exit(1)
    assert not errors, errors
    for i, (y, dx) in enumerate(want):
        assert torch.equal(got[i][0], y), f"thread {i}: y differs from the single-threaded run"
        assert torch.equal(got[i][1], dx), f"thread {i}: dx differs from the single-threaded run"
    print("ok: 4 threads x 5 steps on one layer match the single-threaded answers", flush=True)


def os_threads():
    return len(os.listdir("/proc/self/task"))


def os_threads_settled(at_most, seconds=2.0):
    """The thread count once it is at most `at_most`, or after `seconds`: a
    thread that was just joined or a pool thread winding down can linger for a
    moment, a leaked one never goes."""
    deadline = time.monotonic() + seconds
    n = os_threads()
    while n > at_most and time.monotonic() < deadline:
        time.sleep(0.01)
        n = os_threads()
    return n


def runners_are_bounded():
    cap = 4
    os.environ["MOEPLAN_TORCH_MAX_RUNNERS"] = str(cap)  # what max_runners defaults to
    moe = MoE(M, H, E, capacity_factor=1.0)
    del os.environ["MOEPLAN_TORCH_MAX_RUNNERS"]
    full = None
    for n, tokens in enumerate(range(1, 201)):
        x = seeded(tokens, tokens, M)
        y, _ = step(moe, x, torch.ones(tokens, M))
        assert y.shape == (tokens, M)
        if n + 1 == cap:
            full = os_threads()
        elif n + 1 > cap:
            now = os_threads_settled(full)
            assert now <= full, (f"{now} OS threads after {n + 1} token "
                                 f"counts, {full} with the cache full: runners leak")
        assert len(moe._shapes) <= cap, f"{len(moe._shapes)} runners kept (cap {cap})"
    # An evicted shape comes back (rebuilt) and still computes.
    step(moe, seeded(1, 1, M), torch.ones(1, M))
    print(f"ok: 200 token counts, {len(moe._shapes)} runners kept, {os_threads()} OS threads",
          flush=True)
    for bad in (0, -1, 1.5, True):
        try:
            MoE(M, H, E, max_runners=bad)
        except ValueError as e:
            assert "MoE.max_runners: must be an integer >= 1" in str(e), e
        else:
            raise AssertionError(f"max_runners={bad!r} accepted")
    os.environ["MOEPLAN_TORCH_MAX_RUNNERS"] = "zero"
    try:
        MoE(M, H, E)
    except ValueError as e:
        assert "MOEPLAN_TORCH_MAX_RUNNERS: must be an integer >= 1 (got 'zero')" in str(e), e
    else:
        raise AssertionError("MOEPLAN_TORCH_MAX_RUNNERS=zero accepted")
    finally:
        del os.environ["MOEPLAN_TORCH_MAX_RUNNERS"]


def rank_skips_backward(rank):
    moe = MoE(M, H, E, capacity_factor=1.0)
    x, dy = seeded(1, 8, M), seeded(2, 8, M)
    step(moe, x, dy)  # both ranks in step
    try:
        xg = x.clone().requires_grad_()
        y = moe(xg)
        if rank == 0:
            y.backward(dy)
        else:
            moe(x)  # rank 1 skips that backward and goes on to the next forward
    except ValueError as e:
        want = "every rank must run the same forwards and backwards"
        assert want in str(e), f"rank {rank}: {e}"
        assert "phase" in str(e), f"rank {rank}: {e}"
        print(f"ok: rank {rank}: {e}", flush=True)
        return
    raise AssertionError(f"rank {rank}: no error although rank 1 skipped a backward")


def rank_stalls(rank):
    moe = MoE(M, H, E, capacity_factor=1.0)
    x, dy = seeded(1, 8, M), seeded(2, 8, M)
    step(moe, x, dy)
    y = moe(x.clone().requires_grad_())
    if rank == 0:
        y.backward(dy)  # ends the job: rank 1 never begins this backward
        print("FAIL: rank 0 came back from a backward rank 1 never began", flush=True)
        os._exit(1)
    signal.pause()  # rank 1 calls nothing more; the job must still end


def main():
    signal.alarm(HANG_S)
    rank, size = world()
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "stall":
        rank_stalls(rank)
    elif size == 1:
        threads_share_one_layer()
        runners_are_bounded()
    else:
        rank_skips_backward(rank)
    if rank == 0:
        print("PASS", flush=True)


if __name__ == "__main__":
    sys.exit(main())
