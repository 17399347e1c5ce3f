"""Horovod's own entry points accept hvd_compress's ops: with ``hvd_compress.torch`` imported,
``hvd.DistributedOptimizer(opt, named_parameters=..., op=hc.OneBitAdam, freeze_step=...)`` and
``hvd.allreduce(t, op=hc.Adasum)`` run on hvd_compress, as DESIGN.md names this project's entry.

An op is routed here when it is one of hvd_compress's own constants (an ``hc.ReduceOp`` member) other than
``Average``/``Sum``: ``hc.Adasum`` and the optimizer algorithms. Horovod's constants (plain ints, including
``hvd.Adasum``) and ``hc.Average``/``hc.Sum`` keep Horovod's behaviour. ``HVDC_HOROVOD_ENTRY=0`` in the
environment, or ``hc.horovod_entry(False)``, leaves Horovod untouched.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
from types import ModuleType
from typing import Any

from hvd_compress.ops.constants import DENSE_OPS, ReduceOp

_originals: dict[str, Any] = {}


def _ours(op: Any) -> bool:
    return isinstance(op, ReduceOp) and op not in DENSE_OPS


def _route(original: Any, ours: Any) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def entry(*args: Any, **kwargs: Any) -> Any:
        # Horovod's parameters by name (its positional order differs from ours); the rest are our options
        # (freeze_step=...), which Horovod's own function would refuse.
        known = {k: v for k, v in kwargs.items() if k in signature.parameters}
        given = signature.bind_partial(*args, **known).arguments
        if _ours(given.get("op")):
            return ours(**given, **{k: v for k, v in kwargs.items() if k not in known})
        return original(*args, **kwargs)

    entry.__hvdc_original__ = original  # type: ignore[attr-defined]
    return entry


def _hvd() -> ModuleType | None:
    if importlib.util.find_spec("horovod") is None:
        return None
    try:
        import horovod.torch as hvd
    except ImportError:
        return None
    return hvd


def horovod_entry(enabled: bool = True) -> bool:
    """Route Horovod's entry points for hvd_compress's ops (``enabled``), or restore Horovod's own.
    Returns whether the routing is now in place (False where Horovod is not installed)."""
    hvd = _hvd()
    if hvd is None:
        return False
    import hvd_compress.torch as hc

    if not enabled:
        for name, original in _originals.items():
            setattr(hvd, name, original)
        _originals.clear()
        return False
    if not _originals:
        ours = {
            "DistributedOptimizer": hc.DistributedOptimizer,
            "allreduce": hc.allreduce,
            "allreduce_": hc.allreduce_,
            "grouped_allreduce": hc.grouped_allreduce,
        }
        for name, fn in ours.items():
            _originals[name] = getattr(hvd, name)
            setattr(hvd, name, _route(_originals[name], fn))
    return True


def install_from_environment() -> None:
    """At import of ``hvd_compress.torch``: route unless ``HVDC_HOROVOD_ENTRY=0``."""
    if os.environ.get("HVDC_HOROVOD_ENTRY", "1").strip() != "0":
        horovod_entry(True)
