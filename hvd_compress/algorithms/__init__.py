"""Each optimizer algorithm written once, framework-neutral (layer 2 of DESIGN.md): options, state,
checkpoint schema and step sequencing. Imports no framework; a face finds an algorithm here by its op.

Reductions (``Sum``, ``Average``, ``Adasum``: what the core's ``ReduceOp`` knows) stay apart from the
algorithms; both are valid ``op=`` values of ``DistributedOptimizer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hvd_compress.algorithms.birder import BirderAlgorithm
from hvd_compress.algorithms.onebit import OneBitAlgorithm
from hvd_compress.algorithms.onebit_adam import OneBitAdam
from hvd_compress.algorithms.onebit_lamb import OneBitLamb
from hvd_compress.algorithms.options import BUCKET_OPTIONS, parse_options
from hvd_compress.algorithms.slamb import Slamb
from hvd_compress.algorithms.zero_one_adam import ZeroOneAdam
from hvd_compress.ops.constants import ReduceOp

#: Optimizer algorithms by op: the class that runs it over a face's segments.
REGISTRY: dict[ReduceOp, type[OneBitAlgorithm] | type[Slamb] | type[BirderAlgorithm] | type[ZeroOneAdam]] = {
    ReduceOp.OneBitAdam: OneBitAdam,
    ReduceOp.OneBitLamb: OneBitLamb,
    ReduceOp.SLAMB: Slamb,
    ReduceOp.Birder: BirderAlgorithm,
    ReduceOp.ZeroOneAdam: ZeroOneAdam,
}


def lookup(op: ReduceOp) -> type[OneBitAlgorithm] | type[Slamb] | type[BirderAlgorithm] | type[ZeroOneAdam]:
    """The algorithm registered for ``op``; ``KeyError`` if ``op`` is a plain reduction."""
    return REGISTRY[op]


def parse(op: ReduceOp, given: dict[str, Any], also: Sequence[str] = BUCKET_OPTIONS) -> Any:
    """The validated options of ``op``'s algorithm from ``DistributedOptimizer``'s keyword options (``also``: the
    face's own options, named in the error of an unknown one); every algorithm is built from such options."""
    algorithm = lookup(op)
    return parse_options(algorithm.options_cls, algorithm.name, given, also)


__all__ = ["REGISTRY", "BirderAlgorithm", "OneBitAdam", "OneBitAlgorithm", "OneBitLamb", "Slamb", "ZeroOneAdam",
           "lookup", "parse"]
