"""Process set-up for the TensorFlow and Keras faces: ties hvd_compress to Horovod's world, or runs without it."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from hvd_compress import ops
from hvd_compress.ops.errors import LaunchError


def horovod() -> ModuleType | None:
    """``horovod.tensorflow`` if the program imported and initialized it, else None.

    Looked up in ``sys.modules`` only: importing Horovod's TF module costs seconds, and a program that
    never imported it has not initialized it."""
    for name in ("horovod.tensorflow", "horovod.tensorflow.keras", "horovod.keras"):
        hvd = sys.modules.get(name)
        if hvd is None:
            continue
        try:
            if hvd.is_initialized():
                return hvd
        except (AttributeError, ValueError):
            continue
    return None


def init(comm: Any = None) -> None:
    """Connect hvd_compress to the MPI world of this job (implicit after ``hvd.init()``)."""
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
