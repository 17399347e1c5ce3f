"""Each optimizer algorithm written once, framework-neutral (layer 2 of DESIGN.md): options, state,
checkpoint schema and step sequencing. Imports no framework; a face finds an algorithm here by its op.

Adding an algorithm: one module whose class declares what ``contract`` asks (``name``, ``options_cls``, ``op``,
``buffers``, ``wraps``), and its name in ``REGISTRY`` below. The faces export every ``OPS`` entry as
``hc.<name>`` and build the wrapper from the declaration; no face names an algorithm.

Reductions (``Sum``, ``Average``, ``Adasum``: ``ops.constants.ReduceOp``) stay apart from the algorithms; both
are valid ``op=`` values of ``DistributedOptimizer`` (``resolve_op``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hvd_compress.algorithms.birder import BirderAlgorithm
from hvd_compress.algorithms.contract import check_declared
from hvd_compress.algorithms.diloco import DiLoCo
from hvd_compress.algorithms.onebit import OneBitAlgorithm
from hvd_compress.algorithms.onebit_adam import OneBitAdam
from hvd_compress.algorithms.onebit_lamb import OneBitLamb
from hvd_compress.algorithms.options import BUCKET_OPTIONS, parse_options
from hvd_compress.algorithms.powersgd import PowerSGD
from hvd_compress.algorithms.signsgd import SignSGD
from hvd_compress.algorithms.slamb import Slamb
from hvd_compress.algorithms.zero_one_adam import ZeroOneAdam
from hvd_compress.ops.constants import AlgorithmOp, ReduceOp


def _registry(*classes: type) -> dict[AlgorithmOp, type]:
    for algorithm in classes:
        check_declared(algorithm)
    values = [algorithm.op.value for algorithm in classes]
    if len(set(values)) != len(values):  # a Keras config stores the value: two algorithms may not share one
        raise TypeError(f"two registered algorithms share an AlgorithmOp value: {sorted(values)}")
    return {algorithm.op: algorithm for algorithm in classes}


#: Optimizer algorithms by op: the class that runs it over a face's buckets.
REGISTRY: dict[AlgorithmOp, type[Any]] = _registry(OneBitAdam, OneBitLamb, Slamb, BirderAlgorithm, SignSGD,
                                              ZeroOneAdam, PowerSGD, DiLoCo)

#: The ``op=`` constants the faces export, by name (``hc.OneBitAdam``, ...).
OPS: dict[str, AlgorithmOp] = {op.name: op for op in REGISTRY}
_BY_VALUE = {op.value: op for op in REGISTRY}
#: The reductions an optimizer wrapper takes (Min, Max and Product reduce one tensor: ``allreduce`` only).
_OPTIMIZER_REDUCTIONS = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum)
_BY_NAME: dict[str, ReduceOp | AlgorithmOp] = {op.name.lower(): op for op in (*ReduceOp, *REGISTRY)}


def resolve_op(op: Any) -> ReduceOp | AlgorithmOp:
    """``op=`` of ``DistributedOptimizer`` as a reduction or a registered algorithm: a ``ReduceOp`` or its value
    (Horovod's constants), an ``AlgorithmOp`` or its value (a Keras config), or an optimizer class that names its
    algorithm (``hc.Birder``: its ``hvdc_op``), or the name of any of these as the error lists it (``"OneBitAdam"``,
    ``"Average"``; in any case). ValueError naming every op otherwise."""
    if isinstance(op, str):
        op = _BY_NAME.get(op.lower(), op)
    op = getattr(op, "hvdc_op", op)
    if isinstance(op, AlgorithmOp) and op in REGISTRY:
        return op
    if not isinstance(op, (AlgorithmOp, bool)) and isinstance(op, int):
        if op in _BY_VALUE:
            return _BY_VALUE[op]
        try:
            op = ReduceOp(op)
        except ValueError:
            pass
        else:
            if op in _OPTIMIZER_REDUCTIONS:
                return op
    names = [o.name for o in _OPTIMIZER_REDUCTIONS] + list(OPS)
    if isinstance(op, ReduceOp):
        raise ValueError(f"op={op.name} reduces one tensor (allreduce), it is no optimizer's op; use one of {names}")
    raise ValueError(f"unknown op {op!r}; use one of {names}")


def lookup(op: AlgorithmOp) -> type[Any]:
    """The algorithm registered for ``op``; ``KeyError`` if ``op`` is a plain reduction."""
    return REGISTRY[op]


def parse(op: AlgorithmOp, given: dict[str, Any], also: Sequence[str] = BUCKET_OPTIONS) -> Any:
    """The validated options of ``op``'s algorithm from ``DistributedOptimizer``'s keyword options (``also``: the
    face's own options, named in the error of an unknown one); every algorithm is built from such options."""
    algorithm = lookup(op)
    return parse_options(algorithm.options_cls, algorithm.name, given, also)


__all__ = [
    "OPS", "REGISTRY", "BirderAlgorithm", "DiLoCo", "OneBitAdam", "OneBitAlgorithm", "OneBitLamb", "PowerSGD",
    "SignSGD", "Slamb", "ZeroOneAdam", "lookup", "parse", "resolve_op",
]
