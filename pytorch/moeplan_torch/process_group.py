"""The ranks: `world()` (the MPI world the layers run on) and
`init_process_group()` (torch.distributed over the same ranks)."""

from __future__ import annotations

import datetime
import os
import socket
import sys
from typing import List, Tuple

from ._native import _C

__all__ = ["world", "init_process_group"]

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


def _interface_addresses() -> List[str]:
    import fcntl
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
