"""Collectives on torch tensors: allreduce, broadcast of parameters, optimizer state and objects; join."""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import torch

from hvd_compress import ops
from hvd_compress.ops import process_sets
from hvd_compress.ops.compression import resolve as resolve_compression
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.torch.context import ensure_init


def _resolve_op(op: Any, average: bool | None) -> Any:
    """Horovod's deprecated ``average=`` (True: Average, False: Sum), or ``op`` (default Average)."""
    if average is not None:
        if op is not None:
            raise ValueError("allreduce: give op= or the deprecated average=, not both (as Horovod)")
        return ReduceOp.Average if average else ReduceOp.Sum
    return ReduceOp.Average if op is None else op


def _scale_(t: torch.Tensor, factor: float) -> None:
    """``t *= factor`` in place; integers are scaled in double and truncated toward zero, as Horovod does."""
    if t.is_floating_point():
        t.mul_(factor)
    else:
        t.copy_(t.double().mul_(factor))


def allreduce_(
    tensor: torch.Tensor,
    op: Any = None,
    name: str | None = None,
    *,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    compression: Any = None,
    state: Any = None,
) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks in place and return it. As Horovod's: ``op`` (default Average; also Sum,
    Min, Max, Product, Adasum) or the deprecated ``average=``; ``prescale_factor`` multiplies the input before
    the reduction, ``postscale_factor`` the result after it (integers: in double, truncated). Integer tensors
    take every op but Adasum; their Average is Horovod's (the sum times 1/size, truncated toward zero).
    ``process_set``: the ranks to reduce over (Average divides by its size), as Horovod's: only its members call.
    ``compression`` (``hc.Compression.*`` or Horovod's ``hvd.Compression.none``/``fp16``) compresses what travels,
    top-k/random-k with their ``state`` (``hc.CompressionState``)."""
    ensure_init()
    op = _resolve_op(op, average)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"allreduce_ expects a torch.Tensor, got {type(tensor).__name__}")
    staged = tensor.detach() if tensor.is_contiguous() else tensor.detach().contiguous()
    with process_sets.scope(process_set), torch.no_grad():
        if prescale_factor != 1.0:
            _scale_(staged, prescale_factor)
        ops.allreduce_(staged, op=op, name=name, compression=compression, state=state)
        if postscale_factor != 1.0:
            _scale_(staged, postscale_factor)
        if staged.data_ptr() != tensor.data_ptr():
            tensor.copy_(staged)
    return tensor


def _allreduce_copy(tensor: torch.Tensor, op: Any, name: str | None, scales: tuple[float, float],
                    compression: Any = None, state: Any = None, process_set: Any = None) -> torch.Tensor:
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return allreduce_(out, op=op, name=name, prescale_factor=scales[0], postscale_factor=scales[1],
                      compression=compression, state=state, process_set=process_set)


class _Allreduce(torch.autograd.Function):
    """As Horovod's ``HorovodAllreduce``: the gradient of a reduction is the same reduction (same scale
    factors, same stateless compression) of the incoming gradient (every rank must call ``backward`` too, in the
    same order)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: Any, name: str | None, scales: tuple[float, float],
                compression: Any, process_set: Any) -> torch.Tensor:
        ctx.op, ctx.name, ctx.scales, ctx.compression, ctx.process_set = op, name, scales, compression, process_set
        return _allreduce_copy(tensor, op, name, scales, compression, process_set=process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None, None]:
        name = f"{ctx.name}.grad" if ctx.name else None
        reduced = _allreduce_copy(grad, ctx.op, name, ctx.scales, ctx.compression, process_set=ctx.process_set)
        return reduced, None, None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    op: Any = None,
    name: str | None = None,
    *,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    compression: Any = None,
    state: Any = None,
) -> torch.Tensor:
    """A new tensor holding the reduction of ``tensor`` over all ranks (arguments as ``allreduce_``);
    differentiable (the gradient is the same reduction of the incoming gradient, as in Horovod), except with
    top-k/random-k compression, whose error feedback is a state, not a function."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"allreduce expects a torch.Tensor, got {type(tensor).__name__}")
    op, scales = _resolve_op(op, average), (prescale_factor, postscale_factor)
    stateless = not resolve_compression(compression).stateful
    if tensor.requires_grad and torch.is_grad_enabled() and stateless:
        return _Allreduce.apply(tensor, op, name, scales, compression, process_set)
    return _allreduce_copy(tensor, op, name, scales, compression, state, process_set)


def broadcast(
    tensor: torch.Tensor, root_rank: int = 0, name: str | None = None, process_set: Any = None
) -> torch.Tensor:
    """A new tensor holding root_rank's ``tensor`` (Horovod's out-of-place broadcast)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"broadcast expects a torch.Tensor, got {type(tensor).__name__}")
    return broadcast_(tensor.detach().clone(memory_format=torch.contiguous_format), root_rank, name, process_set)


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def broadcast_(
    tensor: torch.Tensor, root_rank: int = 0, name: str | None = None, process_set: Any = None
) -> torch.Tensor:
    """Overwrite ``tensor`` with root_rank's value, in place. Any dtype: a broadcast copies bytes, so
    integer, bool and complex tensors (BatchNorm's ``num_batches_tracked``) travel as their bytes.
    ``process_set``: its members only; ``root_rank`` is a world rank in it (as in Horovod)."""
    ensure_init()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"broadcast_ expects a torch.Tensor, got {type(tensor).__name__}")
    staged = tensor.detach() if tensor.is_contiguous() else tensor.detach().contiguous()
    with process_sets.scope(process_set) as ps:
        buffer = staged if staged.dtype in _FLOATS else staged.reshape(-1).view(torch.uint8)
        process_sets.broadcast_in_set(buffer, root_rank, name, ps)
    if staged.data_ptr() != tensor.data_ptr():
        with torch.no_grad():
            tensor.copy_(staged)
    return tensor


def join(device: int = -1) -> None:
    """Horovod's ``hvd.join``: returns once every rank called it. A rank in it while another still steps (uneven
    data) makes every rank raise ``MismatchError`` naming it (``ops.join``). ``device`` is Horovod's, where it
    makes the zero tensors it fills a joined rank's part with; nothing is filled in here."""
    ensure_init()
    ops.join()


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> Any:
    """root_rank's ``obj`` (anything ``torch.save`` can write), on every rank (of ``process_set``)."""
    ensure_init()
    with process_sets.scope(process_set) as ps:
        root = process_sets.root_in_set(ps, root_rank)  # this rank's place in the set is ops.rank() here
        if ops.rank() == root:
            buf = io.BytesIO()
            torch.save(obj, buf)
            payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            length = torch.tensor([payload.numel()], dtype=torch.float64)
        else:
            length = torch.zeros(1, dtype=torch.float64)
        process_sets.broadcast_in_set(length, root_rank, f"{name or 'object'}.length", ps)
        if ops.rank() != root:
            payload = torch.empty(int(length.item()), dtype=torch.uint8)
        process_sets.broadcast_in_set(payload, root_rank, f"{name or 'object'}.payload", ps)
        if ops.rank() == root:
            return obj
        return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)


def _named_tensors(params: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, dict):
        return sorted(params.items())
    items = list(params)
    if items and isinstance(items[0], tuple):
        return list(items)
    return [(str(i), t) for i, t in enumerate(items)]


def broadcast_parameters(params: dict[str, torch.Tensor] | Iterable[Any], root_rank: int = 0,
                         process_set: Any = None) -> None:
    """Copy root_rank's parameters (a state_dict, or named_parameters()) to every rank, in place.

    As ``hvd.broadcast_parameters``, on the hvd_compress core with or without Horovod: every dtype travels
    as its bytes, so bool buffers (which Horovod refuses) work too. ``process_set`` (not in Horovod's): to its
    members only, from ``root_rank`` (a world rank in it).
    """
    ensure_init()
    for name, t in _named_tensors(params):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name} is a {type(t).__name__}, not a tensor")
        broadcast_(t.data if isinstance(t, torch.nn.Parameter) else t, root_rank, f"param.{name}", process_set)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0, process_set: Any = None) -> None:
    """Make every rank's optimizer state (hvd_compress compression state included) root_rank's: the whole
    ``state_dict()`` travels, so a rank whose state is still empty (only the root loaded a checkpoint) takes it as
    it is, without a step. The error feedback is the exception: root's is root's residual, so each other rank keeps
    its own (zero where its state was still empty), as the Keras faces' broadcast leaves their
    ``per_rank_variables``. Where the root loaded a state dict that holds every rank's part
    (``hc.full_optimizer_state_dict``), each rank takes its own instead: an exact resume; where it loaded a plain
    one, every rank warns that its per-rank state is not restored (``hvd_compress.torch.checkpoint``).
    ``hvd.broadcast_optimizer_state`` on an hvd_compress optimizer runs this one.
    ``process_set``: to its members only, from ``root_rank`` (a world rank in it)."""
    from hvd_compress.torch import checkpoint  # the wrappers' plumbing builds on these functions
    from hvd_compress.torch.wrapping import wrapped_engine

    engine = wrapped_engine(optimizer)
    if engine is not None:
        checkpoint.broadcast(engine, optimizer, root_rank, process_set, "broadcast_optimizer_state")
        return
    state = broadcast_object(optimizer.state_dict(), root_rank, "optimizer_state", process_set)
    optimizer.load_state_dict(state)
