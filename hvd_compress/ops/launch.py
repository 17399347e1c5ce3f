"""Starting the core in a job that Horovod may already run, the same for every face: each face only says
how to find its own initialized Horovod module (``horovod.torch``, ``horovod.tensorflow``, ...)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from hvd_compress.ops import runtime
from hvd_compress.ops.errors import LaunchError

FindHorovod = Callable[[], "ModuleType | None"]


def init_with(hvd: ModuleType | None, comm: Any = None) -> None:
    """``runtime.init(comm)``; after ``hvd.init()`` also checked against Horovod's world (size, rank, MPI)."""
    if hvd is None:
        runtime.init(comm)
        return
    if not hvd.mpi_enabled():
        raise LaunchError(
            "Horovod is running on Gloo, but hvd_compress needs MPI: launch with "
            "`horovodrun --mpi ...` or `mpirun ...`"
        )
    runtime.init(comm, expected_size=hvd.size(), expected_rank=hvd.rank())


def ensure_init_with(find_horovod: FindHorovod) -> None:
    """Initialize from Horovod on first use; fail clearly if neither hvd.init() nor hc.init() ran."""
    if runtime.is_initialized():
        return
    hvd = find_horovod()
    if hvd is not None:
        init_with(hvd)
        return
    runtime.get()  # raises NotInitializedError with the fix in its message


class FaceContext:
    """``ensure_init``, ``rank`` and ``size`` of one face, which finds its own initialized Horovod with
    ``find_horovod``: every face's first collective initializes from Horovod the same way."""

    def __init__(self, find_horovod: FindHorovod) -> None:
        self._find_horovod = find_horovod

    def ensure_init(self) -> None:
        """Initialize from Horovod on first use; fail clearly if neither hvd.init() nor hc.init() ran."""
        ensure_init_with(self._find_horovod)

    def rank(self) -> int:
        self.ensure_init()
        return runtime.rank()

    def size(self) -> int:
        self.ensure_init()
        return runtime.size()
