"""Horovod's allgather on torch tensors and on picklable objects."""

from __future__ import annotations

import io
from typing import Any

import torch

from hvd_compress import ops
from hvd_compress.ops import process_sets
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.functions import allreduce


def _allgather_copy(tensor: torch.Tensor, name: str | None, process_set: Any = None) -> tuple[torch.Tensor, list[int]]:
    """Every rank's ``tensor`` (of ``process_set``) concatenated on dim 0 in rank order, and each rank's first dim."""
    ensure_init()
    staged = tensor.detach() if tensor.is_contiguous() else tensor.detach().contiguous()
    with process_sets.scope(process_set):
        data, rows = ops.allgather(staged, name=name)
    out = torch.from_numpy(data).view(tensor.dtype).reshape(sum(rows), *tensor.shape[1:])
    return out, rows


class _Allgather(torch.autograd.Function):
    """As Horovod's ``HorovodAllgather``: the gradient is the average over ranks of the incoming gradient,
    cut to this rank's rows (every rank calls ``backward`` too)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: Any) -> torch.Tensor:
        out, rows = _allgather_copy(tensor, name, process_set)
        ctx.name, ctx.rows, ctx.process_set = name, rows, process_set
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        name = f"{ctx.name}.grad" if ctx.name else None
        reduced = allreduce(grad.contiguous(), op=ReduceOp.Average, name=name, process_set=ctx.process_set)
        with process_sets.scope(ctx.process_set):
            r = ops.rank()  # within the set
        start = sum(ctx.rows[:r])
        return reduced.narrow(0, start, ctx.rows[r]), None, None


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    """A new tensor: every rank's ``tensor`` concatenated on the first dim, in rank order (Horovod's allgather).

    The first dim may differ per rank; the other dims and the dtype must agree (``hc.MismatchError``, a
    ``RuntimeError``, on every rank otherwise). Floating and integer dtypes; at least one dim. Differentiable
    as Horovod's. ``process_set``: its members' tensors, in the order of their ranks."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"allgather expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Allgather.apply(tensor, name, process_set)
    return _allgather_copy(tensor, name, process_set)[0]


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every rank's ``obj`` (anything ``torch.save`` can write), as a list in rank order (Horovod's)."""
    ensure_init()
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    gathered = _allgather_copy(payload, f"{name or 'object'}.payload", process_set)
    data, sizes = gathered
    out, at = [], 0
    for n in sizes:
        out.append(torch.load(io.BytesIO(data[at : at + n].numpy().tobytes()), weights_only=False))
        at += n
    return out
