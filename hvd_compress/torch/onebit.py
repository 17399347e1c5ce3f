"""PyTorch face of the 1-bit compressed allreduce: ``hc.OneBitState`` and ``hc.compressed_allreduce``.

All mutable state of the compressor (worker and server error, paper 003 Algorithm 1 lines 7 and 10)
sits in one explicit ``OneBitState`` that ``state_dict()`` saves and ``load_state_dict()`` restores, so a
resumed run continues bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from hvd_compress import ops
from hvd_compress.ops import onebit as onebit_ops
from hvd_compress.torch.context import ensure_init

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16)}


class OneBitState:
    """Error feedback of one buffer of ``numel`` elements of ``dtype`` on this rank's world.

    ``worker_error`` has ``numel`` elements, ``server_error`` the chunk of the padded buffer this rank
    serves (``padded_numel(numel, world_size) / world_size``); both are float32 whatever ``dtype`` is
    (``dtype`` names the buffers the state is meant for). ``world_size`` defaults to the job's size.
    """

    def __init__(self, numel: int, dtype: torch.dtype = torch.float32, world_size: int | None = None) -> None:
        if world_size is None:
            ensure_init()
            world_size = ops.size()
        if int(numel) < 0 or int(world_size) < 1:
            raise ValueError(f"OneBitState: numel {numel} and world_size {world_size} must be >= 0 and >= 1")
        if dtype not in _DTYPES.values():
            raise ValueError(f"OneBitState: dtype {dtype} is not supported; use one of {list(_DTYPES)}")
        self.numel = int(numel)
        self.dtype = dtype
        self.world_size = int(world_size)
        self.worker_error = torch.zeros(self.numel, dtype=torch.float32)
        self.server_error = torch.zeros(onebit_ops.server_error_numel(self.numel, self.world_size), dtype=torch.float32)

    def reset(self) -> None:
        """Forget the accumulated error (both buffers to zero)."""
        self.worker_error.zero_()
        self.server_error.zero_()

    def state_dict(self) -> dict[str, Any]:
        return {
            "numel": self.numel,
            "dtype": str(self.dtype).removeprefix("torch."),
            "world_size": self.world_size,
            "worker_error": self.worker_error.clone(),
            "server_error": self.server_error.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; it must be for the same numel, dtype and world size."""
        self.check_state_dict(state)
        with torch.no_grad():
            self.worker_error.copy_(state["worker_error"].reshape(-1))
            self.server_error.copy_(state["server_error"].reshape(-1))

    def check_state_dict(self, state: dict[str, Any]) -> None:
        """Raise a clear ValueError if ``state`` is not a ``state_dict()`` of a state like this one."""
        want = {"numel": self.numel, "dtype": str(self.dtype).removeprefix("torch."), "world_size": self.world_size}
        for key, value in want.items():
            if state.get(key) != value:
                raise ValueError(f"OneBitState.load_state_dict: {key} is {state.get(key)!r}, this state has {value!r}")
        for key, target in (("worker_error", self.worker_error), ("server_error", self.server_error)):
            t = state.get(key)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != target.numel():
                got = f"{t.dtype} x {t.numel()}" if isinstance(t, torch.Tensor) else type(t).__name__
                want_t = f"torch.float32 x {target.numel()}"
                raise ValueError(f"OneBitState.load_state_dict: {key} is {got}, expected {want_t}")


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
