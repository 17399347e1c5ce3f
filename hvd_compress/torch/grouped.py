"""Grouped allreduce on torch tensors: one fused exchange for many tensors (Adasum: per-tensor coefficients)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hvd_compress import ops
from hvd_compress.ops import process_sets
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.functions import _resolve_op


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    op: Any = ReduceOp.Average,
    name: str | None = None,
    hierarchical: bool | None = None,
    process_set: Any = None,
    *,
    average: bool | None = None,
) -> list[torch.Tensor]:
    """Reduce every tensor of ``tensors`` (one dtype) over all ranks in place and return them (``op`` or
    Horovod's deprecated ``average=``; ``process_set``: over its members only)."""
    ensure_init()
    op = _resolve_op(None if average is not None and op is ReduceOp.Average else op, average)
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"grouped_allreduce_: item {i} is a {type(t).__name__}, not a torch.Tensor")
    staged = [t.detach() if t.is_contiguous() else t.detach().contiguous() for t in tensors]
    with process_sets.scope(process_set):
        ops.grouped_allreduce_(staged, op=op, name=name, hierarchical=hierarchical)
    with torch.no_grad():
        for t, s in zip(tensors, staged, strict=True):
            if s.data_ptr() != t.data_ptr() or not t.is_contiguous():
                t.copy_(s)
    return tensors


def _grouped_copy(tensors: Sequence[torch.Tensor], op: Any, name: str | None, hierarchical: bool | None,
                  process_set: Any = None) -> list:
    outs = [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]
    return grouped_allreduce_(outs, op=op, name=name, hierarchical=hierarchical, process_set=process_set)


class _GroupedAllreduce(torch.autograd.Function):
    """As Horovod's ``HorovodGroupedAllreduce``: the gradients are the same grouped reduction of the
    incoming gradients (every rank calls ``backward`` too)."""

    @staticmethod
    def forward(ctx: Any, op: Any, name: str | None, hierarchical: bool | None, process_set: Any,
                *tensors: torch.Tensor) -> tuple:
        ctx.op, ctx.name, ctx.hierarchical, ctx.process_set = op, name, hierarchical, process_set
        return tuple(_grouped_copy(tensors, op, name, hierarchical, process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        name = f"{ctx.name}.grad" if ctx.name else None
        return (None, None, None, None, *_grouped_copy(grads, ctx.op, name, ctx.hierarchical, ctx.process_set))


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    op: Any = ReduceOp.Average,
    name: str | None = None,
    hierarchical: bool | None = None,
    process_set: Any = None,
    *,
    average: bool | None = None,
) -> list[torch.Tensor]:
    """New tensors holding the reduction of each of ``tensors`` over all ranks (one fused exchange);
    differentiable as Horovod's. ``average=``: Horovod's deprecated form of ``op``."""
    op = _resolve_op(None if average is not None and op is ReduceOp.Average else op, average)
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"grouped_allreduce: item {i} is a {type(t).__name__}, not a torch.Tensor")
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return list(_GroupedAllreduce.apply(op, name, hierarchical, process_set, *tensors))
    return _grouped_copy(tensors, op, name, hierarchical, process_set)
