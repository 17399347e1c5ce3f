"""Framework-neutral error-compensated 1-bit allreduce (paper 003, Algorithm 1, lines 7-13; paper 001,
Section 5): the call into the core's ``compressed_allreduce`` (cpp/src/compressed_allreduce.cc).

The caller owns the error buffers (float32, see ``padded_numel`` for the server error's size); the
PyTorch face keeps them in ``hvd_compress.torch.onebit.OneBitState``.
"""

from __future__ import annotations

from typing import Any

from hvd_compress import _core
from hvd_compress.ops import runtime
from hvd_compress.ops.tensors import as_core_buffer
from hvd_compress.ops.traffic import Traffic, record


def padded_numel(numel: int, world_size: int) -> int:
    """``numel`` rounded up to a multiple of ``8 * world_size`` (the padded length of a 1-bit buffer)."""
    return int(_core.onebit_padded_numel(int(numel), int(world_size)))


def server_error_numel(numel: int, world_size: int) -> int:
    """Elements of the server error of one rank: the chunk of the padded buffer that rank serves."""
    return padded_numel(numel, world_size) // int(world_size)


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
    counts = runtime.get().compressed_allreduce(
        as_core_buffer(buffer), as_core_buffer(worker_error), as_core_buffer(server_error), name or ""
    )
    record(counts, traffic)
    return buffer
