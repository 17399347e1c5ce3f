"""Horovod's Keras entry point accepts hvd_compress's ops: with ``hvd_compress.keras`` imported,
``horovod.tensorflow.keras.DistributedOptimizer(opt, op=hc.OneBitAdam, freeze_step=...)`` (and
``horovod.keras.DistributedOptimizer``) return ``hvd_compress.keras.DistributedOptimizer``.

Which ops are routed and the switch (``HVDC_HOROVOD_ENTRY=0``, ``hck.horovod_entry(False)``) are shared with the
torch face: ``hvd_compress.ops.horovod_entry``. Horovod's Keras wrapper takes arguments ours does not; a routed
call keeps ``optimizer``, ``op``, ``name``, ``backward_passes_per_step`` (Horovod's default sums the k
gradients, as ours) and ``average_aggregated_gradients`` (averages them instead, in both), drops
``sparse_as_dense`` (the Keras face densifies ``IndexedSlices`` either way), accepts the global ``process_set``,
drops any other argument at Horovod's default and refuses one set otherwise.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Iterator
from typing import Any

from hvd_compress.ops.horovod_entry import Target, horovod_entry, register
from hvd_compress.ops.process_sets import check_process_set

__all__ = ["horovod_entry", "install_from_environment"]

_KEPT = ("optimizer", "op", "name", "backward_passes_per_step", "average_aggregated_gradients")


def _arguments(signature: inspect.Signature, given: dict[str, Any]) -> dict[str, Any]:
    """Horovod's Keras ``DistributedOptimizer`` arguments as ``hck.DistributedOptimizer`` keyword arguments."""
    kept = {}
    for key, value in given.items():
        default = signature.parameters[key].default
        if key in _KEPT:
            kept[key] = value
        elif key == "process_set":
            check_process_set(value)
        elif key != "sparse_as_dense" and not (value is default or value == default):
            raise TypeError(
                f"hvd.DistributedOptimizer(op=hc.{given['op'].name}) runs hvd_compress.keras.DistributedOptimizer, "
                f"which has no {key}= (given {value!r}; Horovod's default {default!r}); leave it out"
            )
    return kept


def _targets() -> Iterator[Target]:
    if importlib.util.find_spec("horovod") is None:
        return
    from hvd_compress.keras.optimizer import DistributedOptimizer

    for name in ("horovod.tensorflow.keras", "horovod.keras"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        yield module, {"DistributedOptimizer": DistributedOptimizer}


def install_from_environment() -> None:
    """At import of ``hvd_compress.keras``: route unless ``HVDC_HOROVOD_ENTRY=0`` or ``horovod_entry(False)``."""
    register("keras", _targets, _arguments)
