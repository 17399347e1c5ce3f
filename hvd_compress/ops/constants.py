"""Reduction ops understood by hvd_compress; the values match ``hvdc::ReduceOp`` in cpp/."""

from __future__ import annotations

import enum


class ReduceOp(enum.IntEnum):
    """How a collective combines the ranks' tensors."""

    Sum = 0
    Average = 1
    Adasum = 2
    # Optimizer algorithms (DistributedOptimizer only): not reductions of one tensor.
    OneBitAdam = 16
    OneBitLamb = 17


Sum = ReduceOp.Sum
Average = ReduceOp.Average
Adasum = ReduceOp.Adasum
OneBitAdam = ReduceOp.OneBitAdam
OneBitLamb = ReduceOp.OneBitLamb

DENSE_OPS = (ReduceOp.Sum, ReduceOp.Average)
OPTIMIZER_OPS = (ReduceOp.OneBitAdam, ReduceOp.OneBitLamb)
