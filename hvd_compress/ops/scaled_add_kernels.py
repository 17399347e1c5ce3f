"""The core's float32 scaled add (cpp/include/hvdc/scaled_add_kernels.h): out = fma(p, q, base), one rounding per
element as torch's CPU ``fmadd`` (``add_(p, alpha=q)``), for the NumPy backend, in one pass without temporaries."""

from __future__ import annotations

import numpy as np

from hvd_compress import _core
from hvd_compress.ops.onebit_lamb_kernels import scalar_kernels


def accepts(*arrays: np.ndarray) -> bool:
    """Whether the arrays are C-contiguous float32 NumPy arrays of one size, which ``scaled_add_`` takes."""
    first = arrays[0]
    return all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous and a.size == first.size
               for a in arrays) and first.size > 0


def scaled_add_(out: np.ndarray, base: np.ndarray, p: np.ndarray, q: float) -> np.ndarray:
    """out = fma(p, q, base) (``q`` cast to float32); ``out`` may be ``base``; returns ``out``."""
    _core.scaled_add(base.reshape(-1), p.reshape(-1), float(np.float32(q)), out.reshape(-1), scalar_kernels())
    return out
