"""Horovod's asynchronous collectives: ``*_async`` return a handle at once, ``poll(handle)`` says whether it
finished, ``synchronize(handle)`` waits and returns the result (or raises what the collective raised).

The collectives run one at a time on the process's one async thread (``hvd_compress.ops.runtime.submit``),
in submission order, so ranks that submit in the same order issue them in the same order; the optimizers'
overlapped bucket reductions run there too. A synchronous hc collective issued meanwhile first waits for what
was submitted before it (``runtime.get_in_order``), so it keeps its place in that order on every rank. Do not
issue hc collectives from further threads of your own at the same time.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

import torch

from hvd_compress.ops import process_sets, runtime
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.functions import allreduce, allreduce_, broadcast, broadcast_
from hvd_compress.torch.gather import allgather
from hvd_compress.torch.grouped import grouped_allreduce, grouped_allreduce_

Handle = concurrent.futures.Future


def _submit(fn: Any, *args: Any, **kwargs: Any) -> Handle:
    ensure_init()
    process_sets.require_member(kwargs.get("process_set"))  # raised here, as Horovod raises at enqueue
    return runtime.submit(fn, *args, **kwargs)


def allreduce_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Handle:
    """``allreduce`` started in the background; ``synchronize(handle)`` gives the new tensor."""
    return _submit(allreduce, tensor.detach(), *args, **kwargs)


def allreduce_async_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Handle:
    """``allreduce_`` (in place) started in the background; ``synchronize(handle)`` gives ``tensor``."""
    return _submit(allreduce_, tensor, *args, **kwargs)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> Handle:
    return _submit(grouped_allreduce, [t.detach() for t in tensors], *args, **kwargs)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> Handle:
    return _submit(grouped_allreduce_, list(tensors), *args, **kwargs)


def broadcast_async(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None, **kwargs: Any) -> Handle:
    return _submit(broadcast, tensor.detach(), root_rank, name, **kwargs)


def broadcast_async_(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None, **kwargs: Any) -> Handle:
    return _submit(broadcast_, tensor, root_rank, name, **kwargs)


def allgather_async(tensor: torch.Tensor, name: str | None = None, **kwargs: Any) -> Handle:
    """``allgather`` started in the background; ``synchronize(handle)`` gives the gathered tensor."""
    return _submit(allgather, tensor.detach(), name, **kwargs)


def poll(handle: Handle) -> bool:
    """True once the collective of ``handle`` has finished (successfully or not)."""
    if not isinstance(handle, concurrent.futures.Future):
        raise TypeError(f"poll expects a handle from an hc *_async call, got {type(handle).__name__}")
    return handle.done()


def synchronize(handle: Handle) -> Any:
    """Wait for ``handle``'s collective and return its result; re-raises its exception on this rank."""
    if not isinstance(handle, concurrent.futures.Future):
        raise TypeError(f"synchronize expects a handle from an hc *_async call, got {type(handle).__name__}")
    return handle.result()
