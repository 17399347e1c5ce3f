"""Framework-neutral calls of 1-bit Adam's fused compression-stage passes in the core
(cpp/include/hvdc/onebit_adam_kernels.h) on contiguous float32 CPU tensors (torch or NumPy), one call per bucket:
paper 003 Algorithm 1 line 6 (``local_momentum_``, ``OneBitAlgorithm.local_momentum``, which 1-bit LAMB shares) and
lines 12-13 (``apply_``, ``hvd_compress.algorithms.onebit_adam``), each a single pass over memory where the backend's
tensor ops take three or four. Scalars are cast to float32 as torch casts them, and the float32 operations keep the
backend path's order, fused multiply-adds included: the results are the backend's, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hvd_compress import _core
from hvd_compress.ops.onebit_lamb_kernels import accepts, scalar_kernels  # noqa: F401  (accepts: the same test)
from hvd_compress.ops.tensors import as_core_layers


def local_momentum_(work: Any, g: Any, m: Any, beta1: float, l2: float | None = None,
                    params: Sequence[Any] = (), sizes: Sequence[int] = ()) -> Any:
    """Line 6: work = beta1 m + (l2 x + (1 - beta1) g), with Adam's L2 term (``l2`` = (1 - beta1) weight_decay, x
    the bucket's ``params`` of ``sizes``) only when ``l2`` is not None; returns ``work``."""
    layers = None if l2 is None else as_core_layers(params, sizes)
    _core.onebit_local_momentum(g, m, work, layers, float(1 - beta1), float(0.0 if l2 is None else l2), float(beta1),
                                scalar_kernels())
    return work


def apply_(params: Sequence[Any], work: Any, m: Any, denom: Any, sizes: Sequence[int], decay: float,
           value: float, floor_denoms: Sequence[float] | None = None, cap: float = 1.0) -> None:
    """Lines 12-13 per layer: m = work (the compressed average), then x = x * decay (AdamW's 1 - lr weight_decay;
    1.0: none), d = ``denom`` (the frozen one) raised to |m| * cap where d <= the layer's ``floor_denoms`` entry
    (the variance floor's cap; None: nowhere), and x += m * value / d (value = -lr / (1 - beta1^t)), ``params`` in
    the flat buffers' order."""
    floors = None if floor_denoms is None else [float(f) for f in floor_denoms]
    _core.onebit_adam_apply(work, m, denom, as_core_layers(params, sizes), float(decay), float(value), floors,
                            float(cap), scalar_kernels())
