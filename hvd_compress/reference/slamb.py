"""NumPy simulation of SLAMB over n virtual ranks, written from the spec (shared/specs/slamb.md section 2, steps
1-9, ambiguities S1-S13; paper 000 Alg. 1 + App. E), independently of ``algorithms/slamb.py``; float64.

The step names follow the spec and ``algorithms/slamb.py`` one to one. One param group; the gradients are
given (``grads[t][r]``: rank r's flat gradient at step t + 1), so a test can replay what the real ranks saw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hvd_compress.reference.masks import random_mask


def always_ranges(shapes: Sequence[tuple[int, ...]], threshold: int) -> list[int]:
    """(offset, length) of every tensor with ndim <= 1 or numel < threshold (spec step 2, S9)."""
    out, at = [], 0
    for shape in shapes:
        size = math.prod(shape)
        if size and (len(shape) <= 1 or size < threshold):
            out += [at, size]
        at += size
    return out


def _r(a: float, b: float) -> float:
    return a / b if a > 0 and b > 0 else 1.0  # S5


def slamb(
    x0: np.ndarray,
    grads: Sequence[Sequence[np.ndarray]],
    shapes: Sequence[tuple[int, ...]],
    lr: float | Sequence[float],
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    compress_ratio: float = 0.1,
    sync_interval: int = 100,
    beta3: float = 0.95,
    seed: int = 0,
    mask: str = "cyclic",
    grad_size_thr: int = 9000,
    clip_min: float = 0.01,
    clip_max: float = 1000.0,
    sync_grad: bool = False,
    variance_floor: float = 0.01,
) -> dict[str, list]:
    """Every rank's parameters after every step (``params[t][r]``), with the masks and freshness of each step."""
    n = len(grads[0])
    d = x0.size
    x = [x0.astype(np.float64).copy() for _ in range(n)]
    m = [np.zeros(d) for _ in range(n)]
    v = [np.zeros(d) for _ in range(n)]
    c = np.ones(d)
    always = always_ranges(shapes, grad_size_thr)
    b1, b2 = betas
    out: dict[str, list] = {"params": [], "masks": [], "freshness": [], "momentum": []}
    for t0, step_grads in enumerate(grads):
        t = t0 + 1
        eta = lr[t0] if isinstance(lr, Sequence) else lr
        g = [np.asarray(gr, dtype=np.float64).copy() for gr in step_grads]  # step 1
        mk = random_mask(d, compress_ratio, seed, t, mask, always)  # step 2
        if sync_grad:
            avg = sum(gr[mk] for gr in g) / n
            for gr in g:
                gr[mk] = avg
        for r in range(n):
            m[r] = b1 * m[r] + (1 - b1) * g[r]  # step 3
        avg = sum(mr[mk] for mr in m) / n  # step 4 (S1: over all ranks)
        for r in range(n):
            m[r][mk] = avg
            v[r] = b2 * v[r] + (1 - b2) * g[r] ** 2  # step 5
        c = np.where(mk, 1.0, beta3 * c)  # step 6
        for r in range(n):
            root = np.sqrt(v[r] / (1 - b2**t))
            at = 0
            for shape in shapes:  # the per-layer variance floor (hvd_compress.algorithms.slamb, step 7)
                sl = slice(at, at + math.prod(shape))
                at = sl.stop
                if variance_floor > 0 and sl.stop > sl.start:  # no gradient on this rank yet: no step on m
                    mean = np.mean(v[r][sl])
                    floor = math.sqrt(variance_floor * mean / (1 - b2**t)) if mean > 0 else math.inf
                    root[sl] = np.maximum(root[sl], floor)
            u = (m[r] / (1 - b1**t)) / (root + eps) + weight_decay * x[r]  # step 7, S2
            at = 0
            for shape in shapes:  # step 8
                size = math.prod(shape)
                sl = slice(at, at + size)
                at += size
                xs, us, ms, cs = x[r][sl], u[sl], mk[sl], c[sl]
                if len(shape) <= 1:
                    xs -= eta * _r(np.linalg.norm(xs), np.linalg.norm(us)) * us
                    continue
                phi_max = _r(np.linalg.norm(xs[ms]), np.linalg.norm(us[ms]))
                phi_min = _r(np.linalg.norm(xs[~ms]), np.linalg.norm(us[~ms]))
                phi = np.clip(cs * phi_max + (1 - cs) * phi_min, clip_min, clip_max)
                eta_t = cs * eta + (1 - cs) * eta / math.sqrt(n)
                xs -= phi * eta_t * us
        if t % sync_interval == 0:  # step 9 (S7: the paper's schedule)
            mean = sum(x) / n
            x = [mean.copy() for _ in range(n)]
        out["params"].append([xr.copy() for xr in x])
        out["masks"].append(mk)
        out["freshness"].append(c.copy())
        out["momentum"].append([mr.copy() for mr in m])
    return out
