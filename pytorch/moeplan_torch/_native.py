"""The extension `moeplan.torch._C`, loaded after libmpi is made global.

Open MPI loads its components with dlopen and needs libmpi's symbols global;
Python imports extensions with RTLD_LOCAL. Every module of the package takes
`_C` from here, so libmpi is loaded first whichever module is imported first.
"""

from __future__ import annotations

import ctypes


def _load_mpi_globally() -> None:
    for name in ("libmpi.so.40", "libmpi.so"):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            return
        except OSError:
            continue


_load_mpi_globally()
from . import _C  # noqa: E402  (after libmpi is global)

__all__ = ["_C"]
