"""Horovod's own entry points accept hvd_compress's ops: with ``hvd_compress.torch`` imported,
``hvd.DistributedOptimizer(opt, named_parameters=..., op=hc.OneBitAdam, freeze_step=...)`` and
``hvd.allreduce(t, op=hc.Adasum)`` run on hvd_compress, as DESIGN.md names this project's entry; and
``hvd.broadcast_optimizer_state(opt, root_rank=0)`` on an optimizer that hvd_compress wrapped is
``hc.broadcast_optimizer_state``; ``hvd.join()`` runs ``hc.join()`` first once hvd_compress's runtime runs
(``ops.horovod_entry.join_first``). Horovod's own broadcast cannot serve it: it broadcasts only the wrapped torch
optimizer's per-parameter tensors (not the compression state), and on a rank whose state is still empty (a resume
where only the root loaded the checkpoint) it calls ``step()`` to create the state, which runs a collective the root
never joins.

Which ops are routed and the switch (``HVDC_HOROVOD_ENTRY=0``, ``hc.horovod_entry(False)``) are shared with the
Keras face: ``hvd_compress.ops.horovod_entry``. This module names what the torch face takes over.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

from hvd_compress.ops.horovod_entry import Routed, Target, horovod_entry, join_first, register

__all__ = ["horovod_entry", "install_from_environment"]


def _targets() -> Iterator[Target]:
    if importlib.util.find_spec("horovod") is None:
        return
    try:
        import horovod.torch as hvd
    except ImportError:
        return
    import hvd_compress.torch as hc

    yield hvd, {
        "DistributedOptimizer": hc.DistributedOptimizer,
        "allreduce": hc.allreduce,
        "allreduce_": hc.allreduce_,
        "grouped_allreduce": hc.grouped_allreduce,
        "broadcast_optimizer_state": Routed(hc.broadcast_optimizer_state, _wrapped_by_us),
        "join": join_first(getattr(hvd.join, "__hvdc_original__", hvd.join)),
    }


def _wrapped_by_us(given: dict[str, Any]) -> bool:
    """Whether Horovod's ``broadcast_optimizer_state`` was given an optimizer that hvd_compress wrapped."""
    from hvd_compress.torch.wrapping import wrapped_engine

    return wrapped_engine(given.get("optimizer")) is not None


def install_from_environment() -> None:
    """At import of ``hvd_compress.torch``: route unless ``HVDC_HOROVOD_ENTRY=0`` or ``horovod_entry(False)``."""
    register("torch", _targets)
