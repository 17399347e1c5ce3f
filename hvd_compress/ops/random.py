"""The core's counter-based random numbers (Philox4x32-10, cpp/include/hvdc/philox.h) as NumPy arrays.

The same (seed, step, stream, index) gives the same number on every rank and device, and no framework's
global generator is read or advanced. ``stream`` separates independent uses at one step.
"""

from __future__ import annotations

import numpy as np

from hvd_compress import _core

_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1


def _check(n: int, seed: int, step: int, stream: int, offset: int) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0 <= seed <= _U64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    if not 0 <= stream <= _U32:
        raise ValueError(f"stream must be in [0, 2**32), got {stream}")
    if offset < 0 or offset + n > _U64:
        raise ValueError(f"offset must be in [0, 2**64 - n), got {offset}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")


def words(n: int, seed: int, step: int, stream: int = 0, offset: int = 0) -> np.ndarray:
    """Words [offset, offset + n) of the sequence of (seed, step mod 2**32, stream), uint32."""
    _check(n, seed, step, stream, offset)
    out = np.empty(n, dtype=np.uint32)
    _core.philox_fill_u32(out, seed, step & _U32, stream, offset)
    return out


def uniform(n: int, seed: int, step: int, stream: int = 0, offset: int = 0) -> np.ndarray:
    """Uniforms in [0, 1) with 24 random bits (float32) of the same words."""
    _check(n, seed, step, stream, offset)
    out = np.empty(n, dtype=np.float32)
    _core.philox_fill_uniform(out, seed, step & _U32, stream, offset)
    return out
