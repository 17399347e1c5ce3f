"""Process set-up for the PyTorch face: ties hvd_compress to Horovod's world, or runs without it."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from hvd_compress.ops import launch
from hvd_compress.ops.process_sets import add_process_set


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


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Connect hvd_compress to the MPI world of this job.

    After ``hvd.init()`` this is implicit (the first collective calls it); where Horovod is absent
    call it yourself. ``comm`` is an mpi4py communicator (default: the world). ``process_sets``, as Horovod's:
    a list of ``hc.ProcessSet`` to add now (on every rank, in one order), or "dynamic" (sets are added later with
    ``hc.add_process_set``, which hvd_compress allows either way).
    """
    launch.init_with(horovod(), comm)
    if process_sets is None or (isinstance(process_sets, str) and process_sets.lower() == "dynamic"):
        return
    for ps in process_sets:
        add_process_set(ps)


_CONTEXT = launch.FaceContext(horovod)
ensure_init, rank, size = _CONTEXT.ensure_init, _CONTEXT.rank, _CONTEXT.size
