"""PyTorch face of the 1-bit compressed allreduce: ``hc.OneBitState`` and ``hc.compressed_allreduce``.

The error feedback is ``hvd_compress.ops.onebit.OneBitState``; this face gives it torch buffers.
"""

from __future__ import annotations

import torch

from hvd_compress import ops
from hvd_compress.ops import onebit as onebit_ops
from hvd_compress.torch.backend import BACKEND
from hvd_compress.torch.context import ensure_init


class OneBitState(onebit_ops.OneBitState):
    """Error feedback of one buffer of ``numel`` elements of ``dtype`` on this rank's world
    (``hvd_compress.ops.onebit.OneBitState`` with torch buffers on ``device``, default the CPU).

    ``worker_error`` has ``numel`` elements, ``server_error`` the chunk of the padded buffer this rank
    serves (``padded_numel(numel, world_size) / world_size``); both are float32 whatever ``dtype`` is
    (``dtype`` names the buffers the state is meant for). ``world_size`` defaults to the job's size.
    """

    def __init__(
        self,
        numel: int,
        dtype: torch.dtype = torch.float32,
        world_size: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if world_size is None:
            ensure_init()
            world_size = ops.size()
        name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else str(dtype)
        super().__init__(numel, name, int(world_size), BACKEND, torch.empty(0, device=device))

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype_name)


def compressed_allreduce_(tensor: torch.Tensor, state: OneBitState, name: str | None = None) -> torch.Tensor:
    """In place: ``tensor`` (contiguous) becomes the error-compensated 1-bit average over all ranks."""
    ensure_init()
    if not isinstance(state, OneBitState):
        raise TypeError(f"compressed_allreduce_ expects a OneBitState, got {type(state).__name__}")
    onebit_ops.compressed_allreduce_(tensor.detach(), state.worker_error, state.server_error, name=name)
    return tensor


def compressed_allreduce(tensor: torch.Tensor, state: OneBitState, name: str | None = None) -> torch.Tensor:
    """A new tensor: the error-compensated 1-bit average of ``tensor`` over all ranks.

    Each call adds this rank's worker error before compressing and updates ``state`` (paper 003,
    Algorithm 1, lines 7-13). Sizes or dtypes of ``state`` that do not fit ``tensor``, NaN/Inf in the
    input, or sizes differing across ranks raise on every rank, with ``state`` unchanged.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"compressed_allreduce expects a torch.Tensor, got {type(tensor).__name__}")
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return compressed_allreduce_(out, state, name=name)
