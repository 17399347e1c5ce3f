"""Framework-neutral collectives over the core: in-place on any DLPack tensor."""

from __future__ import annotations

from typing import Any

from hvd_compress.ops import runtime
from hvd_compress.ops.constants import DENSE_OPS, ReduceOp
from hvd_compress.ops.tensors import as_core_buffer


def _check_op(op: Any) -> ReduceOp:
    try:
        op = ReduceOp(op)
    except ValueError:
        raise ValueError(f"unknown reduction op {op!r}; use one of {[o.name for o in ReduceOp]}") from None
    return op


def allreduce_(tensor: Any, op: Any = ReduceOp.Average, name: str | None = None) -> Any:
    """Reduce ``tensor`` (contiguous, on the CPU) over all ranks in place and return it."""
    op = _check_op(op)
    rt = runtime.get()
    if op in DENSE_OPS:
        rt.allreduce(as_core_buffer(tensor), int(op), name or "")
        return tensor
    raise NotImplementedError(f"op {op.name} is not available in allreduce yet")


def broadcast_(tensor: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """Overwrite ``tensor`` on every rank with root_rank's, in place, and return it."""
    runtime.get().broadcast(as_core_buffer(tensor), int(root_rank), name or "")
    return tensor
