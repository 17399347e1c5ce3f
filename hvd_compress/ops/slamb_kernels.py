"""Framework-neutral calls of SLAMB's fused element-wise passes in the core (cpp/include/hvdc/slamb_kernels.h):
steps 3, 5, 7 and 8 of ``hvd_compress.algorithms.slamb`` on contiguous float32 CPU tensors (torch or NumPy),
each a single pass over memory where the backend's tensor ops take several. Scalars are cast to float32 as
torch casts them, and the float32 operations keep the backend path's order.
"""

from __future__ import annotations

import math
from typing import Any

from hvd_compress import _core
from hvd_compress.ops.tensors import as_core_buffer


def accepts(*tensors: Any) -> bool:
    """Whether every tensor is a contiguous float32 CPU tensor that these kernels take."""
    return all(_core.slamb_float32_cpu(as_core_buffer(t)) for t in tensors)


def momentum_(work: Any, m: Any, g: Any, beta1: float) -> Any:
    """work = beta1 m + (1 - beta1) g (SLAMB step 3); returns ``work``."""
    if work.shape[0]:  # an empty tensor's strides may not read as contiguous
        _core.slamb_momentum(m, g, float(beta1), work)
    return work


def momentum_gather_(out: Any, m: Any, g: Any, mask: Any, beta1: float) -> int:
    """out[:count] = beta1 m[mask] + (1 - beta1) g[mask] in index order (SLAMB step 3 on the selected elements,
    gathered for their average; ``out`` has room for them); returns count."""
    if not mask.shape[0]:
        return 0
    return int(_core.slamb_momentum_gather(m, g, mask, float(beta1), out))


def moments_(m: Any, v: Any, work: Any, g: Any, beta2: float) -> float:
    """m = work and v = beta2 v + (1 - beta2) g^2 (SLAMB step 5) in one pass; returns the mean of the new v
    (0 for an empty slice)."""
    n = work.shape[0]
    return _core.slamb_moments(work, g, float(beta2), m, v) / n if n else 0.0


def local_moments_(m: Any, v: Any, g: Any, mask: Any, beta1: float, beta2: float) -> float:
    """m = beta1 m + (1 - beta1) g where ``mask`` is unset (SLAMB step 3 on the elements kept local) and
    v = beta2 v + (1 - beta2) g^2 everywhere (step 5), in one pass; returns the mean of the new v (0 when empty)."""
    n = g.shape[0]
    return _core.slamb_local_moments(g, mask, float(beta1), float(beta2), m, v) / n if n else 0.0


def direction_(u: Any, m: Any, v: Any, x: Any, mask: Any, bc1: float, bc2: float, floor: float, eps: float,
               weight_decay: float, local: bool = False) -> tuple[float, float, float, float, int]:
    """One layer (flat views): u = m / (max(sqrt(v) / sqrt(bc2), floor) + eps) / bc1 + weight_decay x (SLAMB step
    7; ``floor`` <= 0: no floor). Returns (||x[M]||, ||x[~M]||, ||u[M]||, ||u[~M]||, |M|) from the same pass.
    ``local``: while m[M] is still
    on the wire, u[M] = 1 / (max(sqrt(v) / sqrt(bc2), floor) + eps) instead, finished by ``masked_direction_``
    (||u[M]|| then not meaningful)."""
    if not u.shape[0]:
        return 0.0, 0.0, 0.0, 0.0, 0
    xs, xo, us, uo, count = _core.slamb_direction(m, v, as_core_buffer(x), mask, float(math.sqrt(bc2)),
                                                  float(floor), float(eps), float(bc1), float(weight_decay), u,
                                                  bool(local))
    return math.sqrt(xs), math.sqrt(xo), math.sqrt(us), math.sqrt(uo), int(count)


def masked_direction_(u: Any, m: Any, m_avg: Any, x: Any, mask: Any, bc1: float, weight_decay: float) -> float:
    """One layer's selected elements once their averaged momentum ``m_avg`` is in (compact: the j-th selected
    element's is m_avg[j]), u[M] holding ``direction_(local=True)``'s factor: m[M] = m_avg and u[M] as ``direction_``
    computes it, the other elements of m and u left alone. Returns ||u[M]||. ``m_avg`` must hold exactly as many
    values as ``mask`` selects (UsageError)."""
    if not m_avg.shape[0]:
        return 0.0
    return math.sqrt(_core.slamb_masked_direction(m_avg, as_core_buffer(x), mask, float(bc1), float(weight_decay),
                                                  m, u))


def apply_(x: Any, u: Any, c: Any, phi_max: float, phi_min: float, clip_min: float, clip_max: float, lr: float,
           lr_min: float) -> Any:
    """One layer: x -= (u clip(c phi_max + (1 - c) phi_min)) (c lr + (1 - c) lr_min) (SLAMB step 8), the blends
    computed as c (a - b) + b like the backend path; returns ``x``."""
    if u.shape[0]:
        _core.slamb_apply(u, c, float(phi_max - phi_min), float(phi_min), float(clip_min), float(clip_max),
                          float(lr - lr_min), float(lr_min), as_core_buffer(x))
    return x
