"""Framework-neutral calls of 1-bit LAMB's fused compression-stage passes in the core
(cpp/include/hvdc/onebit_lamb_kernels.h): paper 001 Algorithm 1 lines 14-17 (``moments_``) and 20-21
(``apply_``) of ``hvd_compress.algorithms.onebit_lamb`` on contiguous float32 CPU tensors (torch or NumPy),
one call per bucket, each a single pass over memory where the backend's tensor ops take about fourteen in
all. Scalars are cast to float32 as torch casts them, and the float32 operations keep the backend path's
order, fused multiply-adds included (see the header for the one difference: sqrt).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hvd_compress import _core
from hvd_compress.ops import runtime
from hvd_compress.ops.errors import NotInitializedError
from hvd_compress.ops.slamb_kernels import accepts  # the same float32-CPU test  # noqa: F401
from hvd_compress.ops.tensors import as_core_layers


def scalar_kernels() -> bool:
    """The portable code where ``HVDC_ONEBIT_KERNELS=scalar`` (the runtime's one configuration, read at ``init()``)
    asks for it; before ``init()`` (a kernel called on its own) the CPU's best. Both give the same bits."""
    try:
        return bool(runtime.get().scalar_kernels)
    except NotInitializedError:
        return False


def moments_(work: Any, m: Any, fresh: Any, denom: Any, sizes: Sequence[int], floors: Sequence[float],
             beta1: float, beta2: float, bc2: float, eps: float) -> list[float]:
    """Lines 14-17 over a bucket's flat buffers, per layer of ``sizes``: g = (work - beta1 m) / (1 - beta1),
    fresh = beta2 fresh + (1 - beta2) g^2, m = work; returns each layer's max of
    denom / (max(sqrt(fresh) / sqrt(bc2), floor) + eps) (``floors``: per layer, 0 for none; 1.0 for an empty
    layer, as the backend path takes)."""
    maxes = _core.onebit_lamb_moments(
        work, m, fresh, denom, [int(s) for s in sizes], [float(f) for f in floors], float(-beta1), float(1 - beta1),
        float(beta2), float(1 - beta2), float(math.sqrt(bc2)), float(eps), scalar_kernels())
    return [float(r) if size else 1.0 for r, size in zip(maxes, sizes, strict=True)]


def apply_(params: Sequence[Any], m: Any, denom: Any, sizes: Sequence[int], bc1: float, weight_decay: float,
           scales: Sequence[float]) -> None:
    """Lines 20-21 per layer: x += (m / denom / bc1 + weight_decay x) * scale, ``params`` in the flat buffers'
    order (``scales`` = -lr r c_avg per layer)."""
    _core.onebit_lamb_apply(m, denom, as_core_layers(params, sizes), float(bc1), float(weight_decay),
                            [float(s) for s in scales], scalar_kernels())
