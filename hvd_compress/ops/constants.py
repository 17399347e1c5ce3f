"""Reduction ops understood by hvd_compress; the values match ``hvdc::ReduceOp`` in cpp/.

The reductions carry Horovod's own values (``hvd.Average == 0``, ``hvd.Sum == 1``, ``hvd.Adasum == 2``,
``hvd.Min == 3``, ``hvd.Max == 4``, ``hvd.Product == 5``: horovod/common/common.h), so a Horovod constant passed
as ``op=`` means in hvd_compress what it means in Horovod.
"""

from __future__ import annotations

import enum


class ReduceOp(enum.IntEnum):
    """How a collective combines the ranks' tensors."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5
    # Optimizer algorithms (DistributedOptimizer only): not reductions of one tensor.
    OneBitAdam = 16
    OneBitLamb = 17
    SLAMB = 18
    Birder = 19
    ZeroOneAdam = 20


Sum = ReduceOp.Sum
Average = ReduceOp.Average
Adasum = ReduceOp.Adasum
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product
OneBitAdam = ReduceOp.OneBitAdam
OneBitLamb = ReduceOp.OneBitLamb
SLAMB = ReduceOp.SLAMB
Birder = ReduceOp.Birder
ZeroOneAdam = ReduceOp.ZeroOneAdam

# Element-wise reductions of one tensor in the core's dense allreduce (floating and integer dtypes).
DENSE_OPS = (ReduceOp.Sum, ReduceOp.Average, ReduceOp.Min, ReduceOp.Max, ReduceOp.Product)
OPTIMIZER_OPS = (ReduceOp.OneBitAdam, ReduceOp.OneBitLamb, ReduceOp.SLAMB, ReduceOp.Birder,
                 ReduceOp.ZeroOneAdam)
