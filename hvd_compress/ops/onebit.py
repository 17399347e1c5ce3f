"""Framework-neutral error-compensated 1-bit allreduce (paper 003, Algorithm 1, lines 7-13; paper 001,
Section 5): the call into the core's ``compressed_allreduce`` (cpp/src/compressed_allreduce.cc).

The error feedback of one buffer lives in one ``OneBitState`` (paper 003 Algorithm 1 lines 7 and 10; the
PowerSGDState idea: all mutable state of the scheme in one object that ``state_dict()`` saves and
``load_state_dict()`` restores, so a resumed run continues bit for bit). Its buffers are the face's own
tensors, made through the face's ``Backend`` on the device of the tensor they serve.
"""

from __future__ import annotations

from typing import Any

from hvd_compress import _core
from hvd_compress.ops import runtime
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.tensors import as_core_buffer
from hvd_compress.ops.traffic import Traffic, record


def padded_numel(numel: int, world_size: int) -> int:
    """``numel`` rounded up to a multiple of ``8 * world_size`` (the padded length of a 1-bit buffer)."""
    return int(_core.onebit_padded_numel(int(numel), int(world_size)))


def server_error_numel(numel: int, world_size: int) -> int:
    """Elements of the server error of one rank: the chunk of the padded buffer that rank serves."""
    return padded_numel(numel, world_size) // int(world_size)


STATE_DTYPES = ("float32", "float16", "bfloat16")  # the buffers a state may serve


class OneBitState:
    """Error feedback of one buffer of ``numel`` elements of ``dtype`` (a name) on a world of ``world_size``.

    ``worker_error`` has ``numel`` elements, ``server_error`` the chunk of the padded buffer this rank
    serves (``server_error_numel(numel, world_size)``); both are float32 whatever ``dtype`` is (``dtype``
    names the buffers the state is meant for), on the device of ``like`` (default: the CPU of the face).
    """

    def __init__(self, numel: int, dtype: str, world_size: int, xp: Backend, like: Tensor) -> None:
        if int(numel) < 0 or int(world_size) < 1:
            raise ValueError(f"OneBitState: numel {numel} and world_size {world_size} must be >= 0 and >= 1")
        if dtype not in STATE_DTYPES:
            raise ValueError(f"OneBitState: dtype {dtype} is not supported; use one of {list(STATE_DTYPES)}")
        self.numel = int(numel)
        self.dtype_name = dtype
        self.world_size = int(world_size)
        self.xp = xp
        self.worker_error = xp.float32_like(self.numel, like)
        self.server_error = xp.float32_like(server_error_numel(self.numel, self.world_size), like)

    def reset(self) -> None:
        """Forget the accumulated error (both buffers to zero)."""
        self.xp.zero_(self.worker_error)
        self.xp.zero_(self.server_error)

    def _clone(self, t: Tensor, numel: int) -> Tensor:
        return self.xp.copy_(self.xp.float32_like(numel, t), t)

    def state_dict(self) -> dict[str, Any]:
        return {
            "numel": self.numel,
            "dtype": self.dtype_name,
            "world_size": self.world_size,
            "worker_error": self._clone(self.worker_error, self.numel),
            "server_error": self._clone(self.server_error, server_error_numel(self.numel, self.world_size)),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; it must be for the same numel, dtype and world size."""
        self.check_state_dict(state)
        self.xp.copy_(self.worker_error, state["worker_error"].reshape(-1))
        self.xp.copy_(self.server_error, state["server_error"].reshape(-1))

    def check_state_dict(self, state: dict[str, Any]) -> None:
        """Raise a clear ValueError if ``state`` is not a ``state_dict()`` of a state like this one."""
        want = {"numel": self.numel, "dtype": self.dtype_name, "world_size": self.world_size}
        for key, value in want.items():
            if state.get(key) != value:
                raise ValueError(f"OneBitState.load_state_dict: {key} is {state.get(key)!r}, this state has {value!r}")
        for key, target in (("worker_error", self.worker_error), ("server_error", self.server_error)):
            got, want_t = self.xp.describe(state.get(key)), self.xp.describe(target)
            if got != want_t:
                shown = f"{got[0]} x {got[1]}" if got else type(state.get(key)).__name__
                raise ValueError(f"OneBitState.load_state_dict: {key} is {shown}, expected {want_t[0]} x {want_t[1]}")


def compressed_allreduce_(
    buffer: Any, worker_error: Any, server_error: Any, name: str | None = None, traffic: Traffic | None = None
) -> Any:
    """Replace ``buffer`` (contiguous CPU float32/float16/bfloat16) by its error-compensated 1-bit average.

    ``worker_error`` (``numel`` float32) and ``server_error`` (``server_error_numel(numel, size)``
    float32) carry the compression error between calls and are updated in place. Bad input on any rank
    (sizes, dtypes, NaN/Inf) raises ``UsageError`` on every rank with the buffers unchanged; ranks that
    pass different sizes or shapes raise ``MismatchError``. The bytes of the call go to ``traffic`` (and to
    the accumulators of ``counting``, see ``hvd_compress.ops.traffic``). Returns ``buffer``.
    """
    counts = runtime.get_in_order().compressed_allreduce(
        as_core_buffer(buffer), as_core_buffer(worker_error), as_core_buffer(server_error), name or ""
    )
    record(counts, traffic)
    return buffer
