"""Process set-up for the PyTorch face: ties hvd_compress to Horovod's world, or runs without it."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from hvd_compress import ops
from hvd_compress.ops.errors import LaunchError


def horovod() -> ModuleType | None:
    """``horovod.torch`` if it is installed and initialized, else None."""
    try:
        import horovod.torch as hvd
    except ImportError:
        return None
    try:
        return hvd if hvd.is_initialized() else None
    except (AttributeError, ValueError):
        return None


def init(comm: Any = None) -> None:
    """Connect hvd_compress to the MPI world of this job.

    After ``hvd.init()`` this is implicit (the first collective calls it); where Horovod is absent
    call it yourself. ``comm`` is an mpi4py communicator (default: the world).
    """
    hvd = horovod()
    if hvd is None:
        ops.init(comm)
        return
    if not hvd.mpi_enabled():
        raise LaunchError(
            "Horovod is running on Gloo, but hvd_compress needs MPI: launch with "
            "`horovodrun --mpi ...` or `mpirun ...`"
        )
    ops.init(comm, expected_size=hvd.size(), expected_rank=hvd.rank())


def ensure_init() -> None:
    """Initialize from Horovod on first use; fail clearly if neither hvd.init() nor hc.init() ran."""
    if ops.is_initialized():
        return
    if horovod() is not None:
        init()
        return
    ops.runtime.get()  # raises NotInitializedError with the fix in its message


def rank() -> int:
    ensure_init()
    return ops.rank()


def size() -> int:
    ensure_init()
    return ops.size()
