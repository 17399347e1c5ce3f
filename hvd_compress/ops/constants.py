"""Reduction ops understood by hvd_compress (the values match ``hvdc::ReduceOp`` in cpp/), and the type of the
``op=`` values that name an optimizer algorithm of ``hvd_compress.algorithms`` instead.

The reductions carry Horovod's own values (``hvd.Average == 0``, ``hvd.Sum == 1``, ``hvd.Adasum == 2``,
``hvd.Min == 3``, ``hvd.Max == 4``, ``hvd.Product == 5``: horovod/common/common.h), so a Horovod constant passed
as ``op=`` means in hvd_compress what it means in Horovod.
"""

from __future__ import annotations

import dataclasses
import enum


class ReduceOp(enum.IntEnum):
    """How a collective combines the ranks' tensors."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


Sum = ReduceOp.Sum
Average = ReduceOp.Average
Adasum = ReduceOp.Adasum
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product

# Element-wise reductions of one tensor in the core's dense allreduce (floating and integer dtypes).
DENSE_OPS = (ReduceOp.Sum, ReduceOp.Average, ReduceOp.Min, ReduceOp.Max, ReduceOp.Product)


@dataclasses.dataclass(frozen=True)
class AlgorithmOp:
    """``op=`` of ``DistributedOptimizer`` naming an optimizer algorithm (``hc.OneBitAdam``, ...): not a reduction of
    one tensor, so the collectives refuse it. Each algorithm class declares its own (``hvd_compress.algorithms``);
    ``value`` is what a Keras config stores, apart from the reductions' values."""

    name: str
    value: int

    def __post_init__(self) -> None:
        if self.value in ReduceOp._value2member_map_:
            raise ValueError(f"AlgorithmOp {self.name}: value {self.value} is a reduction's")

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"hvd_compress.{self.name}"
