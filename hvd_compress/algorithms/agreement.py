"""Agreeing across ranks before a step changes any state, for every algorithm alike."""

from __future__ import annotations

from collections.abc import Sequence

from hvd_compress import ops
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.traffic import CommMeter


def nonfinite_everywhere(xp: Backend, buffers: Sequence[Tensor], meter: CommMeter, name: str) -> int:
    """How many of ``buffers`` hold a NaN/Inf, summed over all ranks (one tiny allreduce).

    The core checks each collective's input on every rank, but with several buffers a later one's rejection
    would come after an earlier one's state (error feedback, moments) changed: agreeing first keeps a rejected
    step free of side effects."""
    local = sum(int(xp.any_nonfinite(b)) for b in buffers)
    flag = xp.add_(xp.float32_like(1, buffers[0]), float(local))
    meter.run(ops.allreduce_, flag, op=ReduceOp.Sum, name=f"{name}.finite")
    return int(xp.max(flag))
