"""Process set-up for the TensorFlow and Keras faces: ties hvd_compress to Horovod's world, or runs without it."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from hvd_compress.ops import launch


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
    launch.init_with(horovod(), comm)


_CONTEXT = launch.FaceContext(horovod)
ensure_init, rank, size = _CONTEXT.ensure_init, _CONTEXT.rank, _CONTEXT.size
