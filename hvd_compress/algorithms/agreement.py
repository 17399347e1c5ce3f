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
    return counts_everywhere(xp, buffers[0], [local], meter, f"{name}.finite")[0]


def counts_everywhere(xp: Backend, like: Tensor, counts: Sequence[int], meter: CommMeter, name: str) -> list[int]:
    """Each of this rank's ``counts`` summed over all ranks (one tiny allreduce; ``like``: a tensor of the
    backend's kind and device)."""
    flags = xp.float32_like(len(counts), like)
    for i, c in enumerate(counts):
        xp.add_(flags[i:i + 1], float(c))
    meter.run(ops.allreduce_, flags, op=ReduceOp.Sum, name=name)
    return [int(xp.max(flags[i:i + 1])) for i in range(len(counts))]
