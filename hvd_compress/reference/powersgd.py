"""Reference PowerSGD over n virtual ranks, in float64 (Vogels et al., NeurIPS 2019, arXiv 1905.13727).

Per step, as ``hvd_compress.algorithms.powersgd.reduce_bucket`` and torch's ``powerSGD_hook`` run it: the first
``start`` steps a dense average; then per rank M_i = g_i + e_i (Alg. 2 line 3); each parameter as a (first dim) x
(rest) matrix, compressed when (rows + cols) r min_rate < rows cols, else averaged; for the compressed ones Alg. 1:
Q from the last step (warm start) or drawn, orthogonalized (Gram-Schmidt for r <= 2, else QR); P = sum_i M_i Q
(lines 3-4); P orthogonalized (line 5); Q = mean_i M_i^T P (lines 6-7); result P Q^T (line 8); e_i = M_i - result
(Alg. 2 line 5); a step whose result holds an inf or NaN changes none of them (nor the seed stream), a column of
norm zero stays zero in the orthogonalization, and a matrix whose new Q has a zero column keeps the Q it started
from, as ``reduce_bucket``. The random first Q comes from ``draw(seed, shapes)`` (the test gives torch's generator),
the seeds from ``np.random.RandomState(random_seed).randint(10**9)``, one per draw. Over several buckets
(``Buckets``) each keeps its own error, P and Q, and they share that generator: each bucket draws a seed when it has
no Q yet (or at every step without warm start), in bucket order, also a bucket with nothing to compress, as torch's
hook does over DDP's buckets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def orthogonalize(m: np.ndarray, eps: float) -> np.ndarray:
    """Orthonormal columns of ``m``: Gram-Schmidt with ``eps`` added to each norm for r <= 2, else QR."""
    m = m.copy()
    r = m.shape[1]
    if r > 2:
        return np.linalg.qr(m)[0]
    for i in range(r):  # a zero column stays zero
        norm = np.linalg.norm(m[:, i])
        m[:, i] /= norm + eps if eps else max(norm, np.finfo(m.dtype).tiny)
        for j in range(i + 1, r):
            m[:, j] -= np.dot(m[:, i], m[:, j]) * m[:, i]
    return m


class PowerSGD:
    """One bucket of parameters of ``shapes`` on ``n`` virtual ranks; ``step`` reduces one step's gradients."""

    def __init__(self, n: int, shapes: Sequence[tuple[int, ...]], rank: int, start: int, min_rate: float = 2,
                 error_feedback: bool = True, warm_start: bool = True, eps: float = 0.0, random_seed: int = 0,
                 draw: Callable[[int, list[tuple[int, int]]], list[np.ndarray]] | None = None,
                 rng: np.random.RandomState | None = None) -> None:
        self.n, self.shapes, self.start, self.eps = n, [tuple(s) for s in shapes], start, eps
        self.error_feedback, self.warm_start = error_feedback, warm_start
        self.draw = draw
        self.rng = np.random.RandomState(random_seed) if rng is None else rng
        self.iter = 0
        self.errors: list[list[np.ndarray]] | None = None
        self.qs: list[np.ndarray] | None = None
        self.ps: list[np.ndarray] = []
        self.compressed, self.dense = [], []
        groups: dict[tuple[int, int], list[int]] = {}
        for i, s in enumerate(self.shapes):
            rows = s[0] if s else 1
            cols = int(np.prod(s)) // rows
            r = min(rows, cols, rank)
            if (rows + cols) * r * min_rate < rows * cols:
                groups.setdefault((rows, cols), []).append(i)
            else:
                self.dense.append(i)
        for (rows, cols), members in groups.items():  # the order the random Q are drawn in
            self.compressed += [(i, rows, cols, min(rows, cols, rank)) for i in members]

    def step(self, grads: list[list[np.ndarray]]) -> list[np.ndarray]:
        """``grads[rank][param]``: the reduced gradient of each parameter (alike on every rank)."""
        ms = [[np.asarray(g, dtype=np.float64).copy() for g in rank] for rank in grads]
        if self.iter < self.start:
            self.iter += 1
            return [sum(m[i] for m in ms) / self.n for i in range(len(self.shapes))]
        if self.error_feedback and self.errors is not None:
            ms = [[m + e for m, e in zip(rank, errs, strict=True)] for rank, errs in zip(ms, self.errors, strict=True)]
        out: list[np.ndarray] = [np.empty(0)] * len(self.shapes)
        for i in self.dense:
            out[i] = sum(m[i] for m in ms) / self.n
        rng_state, qs = self.rng.get_state(), self.qs
        if qs is None or not self.warm_start:
            seed = int(self.rng.randint(1_000_000_000))
            qs = [np.asarray(q, dtype=np.float64) for q in self.draw(seed, [(c, r) for _, _, c, r in self.compressed])]
        ps, qs = [], list(qs)
        with np.errstate(invalid="ignore", over="ignore"):  # an inf in a gradient spreads as inf and NaN
            for k, (i, rows, cols, _) in enumerate(self.compressed):
                q = orthogonalize(qs[k], self.eps)
                p = orthogonalize(sum(m[i].reshape(rows, cols) @ q for m in ms), self.eps)
                q = sum(m[i].reshape(rows, cols).T @ p for m in ms) / self.n
                ps.append(p)
                out[i] = (p @ q.T).reshape(self.shapes[i])
                if not (q == 0).all(axis=0).any():  # else the Q this step started from stays
                    qs[k] = q
        self.iter += 1
        if not all(np.isfinite(o).all() for o in out):  # handed on; the error, P, Q and seed stream stay
            self.rng.set_state(rng_state)
            return out
        self.ps, self.qs = ps, qs
        if self.error_feedback:
            self.errors = [[m - o for m, o in zip(rank, out, strict=True)] for rank in ms]
        return out


class Buckets:
    """PowerSGD over buckets holding the parameters of ``spans`` (indices into ``shapes``, bucket order), one
    ``PowerSGD`` each, sharing one generator; ``step`` takes and returns every parameter, as ``PowerSGD.step``."""

    def __init__(self, n: int, shapes: Sequence[tuple[int, ...]], spans: Sequence[Sequence[int]], rank: int,
                 start: int, random_seed: int = 0, **options) -> None:
        self.spans = [list(span) for span in spans]
        rng = np.random.RandomState(random_seed)
        self.buckets = [PowerSGD(n, [shapes[i] for i in span], rank, start, rng=rng, **options)
                        for span in self.spans]

    def step(self, grads: list[list[np.ndarray]]) -> list[np.ndarray]:
        out: list[np.ndarray] = [np.empty(0)] * len(grads[0])
        for bucket, span in zip(self.buckets, self.spans, strict=True):
            for i, reduced in zip(span, bucket.step([[g[i] for i in span] for g in grads]), strict=True):
                out[i] = reduced
        return out
