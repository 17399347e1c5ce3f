"""NumPy reference of EF-signSGD with majority vote (docs/algorithms/signsgd.md), written from the papers: the
worker rule of Karimireddy et al. (ICML 2019, Alg. 1) on each rank, the majority vote of Bernstein et
al. (ICLR 2019, Alg. 1) across ranks, float32 as the optimizer computes it.

Per parameter k (d_k elements), rank r: p = lr g + e; s = sign(p) with sign(0) = +1; c_r = ||p||_1 / d_k;
e = p - c_r s; v = sign(sum_r s) with a tie +1; c = mean_r c_r (float32, summed in rank order); x = x - c v.
At an lr change e, made at the lr ``error_lr`` of the step before, is first brought to the current lr
(``error_to_lr``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

F32 = np.float32


def sign(x: np.ndarray) -> np.ndarray:
    """+1 where ``x >= 0`` (a zero included), else -1, float32."""
    return np.where(x >= 0, F32(1), F32(-1))


def majority_vote(signs: Sequence[np.ndarray]) -> np.ndarray:
    """sign(sum_r s_r) of the ranks' +/-1 vectors (Bernstein Alg. 1), a tie +1."""
    return sign(np.sum(np.stack(signs).astype(np.int64), axis=0))


def error_to_lr(e: np.ndarray, error_lr: float, lr: float) -> np.ndarray:
    """e, made at ``error_lr``, in the units of ``lr`` (docs/algorithms/signsgd.md, "The rule", step 1: Karimireddy
    et al. 2019, Alg. 1, p_t = gamma g_t + e_t): unchanged where the lrs are equal or ``error_lr`` is unknown (NaN),
    times lr / error_lr rounded to float32 where both are > 0, zero where either is 0."""
    if lr == error_lr or math.isnan(error_lr):
        return e
    if lr > 0 and error_lr > 0:
        return (e.astype(F32) * F32(lr / error_lr)).astype(F32)
    return np.zeros_like(e)


def worker(g: np.ndarray, e: np.ndarray, lr: float) -> tuple[np.ndarray, float, np.ndarray]:
    """One rank's (s, c_r, new e) for one parameter (steps 1-4 of docs/algorithms/signsgd.md)."""
    p = (g.astype(F32) * F32(lr)).astype(F32) + e.astype(F32)
    s = sign(p)
    c = float(np.abs(p).astype(np.float64).mean()) if p.size else 0.0
    return s, c, (p - F32(c) * s).astype(F32)


def step(x: Sequence[np.ndarray], grads: Sequence[Sequence[np.ndarray]], errors: Sequence[Sequence[np.ndarray]],
         lr: float, error_lr: float = math.nan) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """One step: ``x[k]`` the parameters (alike on every rank), ``grads[r][k]`` and ``errors[r][k]`` rank r's,
    made at ``error_lr`` (the previous step's lr; NaN: taken as this one's); returns the new parameters and each
    rank's new errors (made at ``lr``)."""
    n = len(grads)
    new_x, new_e = [], [[] for _ in range(n)]
    for k, xk in enumerate(x):
        outs = [worker(grads[r][k], error_to_lr(errors[r][k], error_lr, lr), lr) for r in range(n)]
        total = F32(0)
        for _, c, _ in outs:
            total = F32(total + F32(c))
        mean = F32(total / F32(n))
        v = majority_vote([s for s, _, _ in outs])
        new_x.append((xk.astype(F32) - mean * v).astype(F32))
        for r, (_, _, e) in enumerate(outs):
            new_e[r].append(e)
    return new_x, new_e
