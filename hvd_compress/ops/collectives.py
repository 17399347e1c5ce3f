"""Framework-neutral collectives over the core: in-place on any DLPack tensor.

Each takes an optional ``traffic`` accumulator (``hvd_compress.ops.traffic.Traffic``) that receives the
bytes this rank sent and received for that call; calls made inside ``counting(...)`` also report there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hvd_compress.ops import call_names, runtime
from hvd_compress.ops.compression import compressed_allreduce_
from hvd_compress.ops.compression import resolve as resolve_compression
from hvd_compress.ops.constants import DENSE_OPS, AlgorithmOp, ReduceOp
from hvd_compress.ops.tensors import as_core_buffer
from hvd_compress.ops.traffic import Traffic, record


def _check_op(op: Any) -> ReduceOp:
    if isinstance(op, AlgorithmOp):
        raise ValueError(
            f"op {op.name} is an optimizer algorithm, not a reduction of one tensor: use "
            f"DistributedOptimizer(opt, op={op.name}, ...) (or compressed_allreduce for the 1-bit collective)"
        )
    try:
        op = ReduceOp(op)
    except ValueError:
        raise ValueError(f"unknown reduction op {op!r}; use one of {[o.name for o in ReduceOp]}") from None
    return op


def _hierarchical(hierarchical: bool | None) -> bool:
    """The Adasum mode: the argument, else ``HVDC_ADASUM_HIERARCHICAL`` as read at ``init()``."""
    if hierarchical is not None:
        return bool(hierarchical)
    return runtime.config().adasum_hierarchical


def check_predivide(factor: Any, op: Any) -> float:
    """Horovod's ``gradient_predivide_factor`` of a dense gradient reduction (op=Average only): a number > 0."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise ValueError(f"gradient_predivide_factor must be a number > 0, got {factor!r}")
    if factor != 1.0 and op != ReduceOp.Average:
        raise ValueError("gradient_predivide_factor is supported with op=Average only (as in Horovod)")
    return float(factor)


def allreduce_(
    tensor: Any,
    op: Any = ReduceOp.Average,
    name: str | None = None,
    traffic: Traffic | None = None,
    compression: Any = None,
    state: Any = None,
) -> Any:
    """Reduce ``tensor`` (contiguous, on the CPU) over all ranks in place and return it.

    Average, Sum, Min, Max and Product take floating and integer tensors (integer Average is Horovod's: the
    sum times 1/size, truncated toward zero). With ``op=Adasum`` (floating only) the whole tensor is one
    Adasum vector. Ranks must pass tensors of one shape.
    ``compression`` (``hvd_compress.ops.compression``; Average/Sum only) compresses what travels; top-k and
    random-k need their ``state`` (a ``CompressionState`` kept across calls).
    """
    op = _check_op(op)
    compressor = resolve_compression(compression)
    if compressor.kind != "none":
        return compressed_allreduce_(tensor, compressor, state, op=op, name=name, traffic=traffic)
    rt = runtime.get_in_order()
    if op in DENSE_OPS:
        record(rt.allreduce(as_core_buffer(tensor), int(op), name or ""), traffic)
        return tensor
    return adasum_fused_(tensor, [], name=name, traffic=traffic)  # _check_op leaves no other op


def reject_allreduce(why: str, name: str | None = None) -> None:
    """Join the coming allreduce as a rank that could not start it (``why``): every rank raises
    ``RejectedInputError`` (this one included), none waits for a peer that never arrives."""
    runtime.get_in_order().reject_allreduce(str(why), name or "")


def adasum_fused_(
    flat: Any,
    sizes: Sequence[int],
    name: str | None = None,
    hierarchical: bool | None = None,
    traffic: Traffic | None = None,
) -> Any:
    """Adasum of a contiguous fused buffer over all ranks, in place; returns ``flat``.

    ``sizes`` cuts ``flat`` into consecutive tensors (empty: one tensor); the Adasum dot products and
    coefficients are per tensor, all tensors travel in one exchange. ``hierarchical`` (default:
    ``HVDC_ADASUM_HIERARCHICAL`` at ``init()``) averages within each node and runs Adasum across nodes.
    """
    rt = runtime.get_in_order()
    sizes = [int(s) for s in sizes]
    record(rt.adasum(as_core_buffer(flat), sizes, _hierarchical(hierarchical), name or ""), traffic)
    return flat


def grouped_allreduce_(
    tensors: Sequence[Any],
    op: Any = ReduceOp.Average,
    name: str | None = None,
    hierarchical: bool | None = None,
    traffic: Traffic | None = None,
) -> list[Any]:
    """Reduce each of ``tensors`` (contiguous, one dtype) over all ranks in place; returns them.

    With ``op=Adasum`` the tensors are fused into one exchange with per-tensor coefficients (the core
    packs them into one scratch buffer). Sum/Average reduce tensor by tensor.
    """
    op = _check_op(op)
    tensors = list(tensors)
    if op == ReduceOp.Adasum:
        buffers = [as_core_buffer(t) for t in tensors]
        record(runtime.get_in_order().adasum_group(buffers, _hierarchical(hierarchical), name or ""), traffic)
        return tensors
    for i, t in enumerate(tensors):
        allreduce_(t, op=op, name=call_names.indexed(name, i) if name else None, traffic=traffic)
    return tensors


def allgather(tensor: Any, name: str | None = None, traffic: Traffic | None = None) -> tuple[Any, list[int]]:
    """Horovod's allgather of ``tensor`` (contiguous, at least one dim): its first dim may differ per rank,
    its other dims and dtype must agree. Returns (a uint8 NumPy array holding every rank's rows in rank
    order, each rank's first dim); the face views the bytes as its dtype and shape."""
    data, rows, moved = runtime.get_in_order().allgather(as_core_buffer(tensor), name or "")
    record(moved, traffic)
    return data, [int(r) for r in rows]


def join() -> None:
    """Horovod's ``join()``: returns once every rank called it. A rank in ``join()`` while another is in some
    other collective (it ran out of data first) makes every rank raise ``MismatchError`` naming it, instead of
    the others waiting for its part: Horovod fills a joined rank's part with zeros, which hvd_compress's
    algorithms (error feedback, moments, schedules) have no meaning for."""
    runtime.get_in_order().join()


def broadcast_(tensor: Any, root_rank: int = 0, name: str | None = None, traffic: Traffic | None = None) -> Any:
    """Overwrite ``tensor`` on every rank with root_rank's, in place, and return it."""
    record(runtime.get_in_order().broadcast(as_core_buffer(tensor), int(root_rank), name or ""), traffic)
    return tensor
