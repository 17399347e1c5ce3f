"""NumPy reference of Birder (paper 004, Algorithm 1 and Section 4; specs/birder.md), the oracle of
the core's ``stochastic_kernels`` and ``hierarchical_allreduce`` (cpp/include/hvdc/), with the same
names for the same steps and the same float32 rounding points (all listed in stochastic_kernels.h).

- ``quantize``: Q(y) = +1 if u < (y + 1) / 2 else -1 (spec 2, B1), and the new error y - Q(y).
- ``hierarchical_1bit_allreduce``: the five stages of spec 4 over explicit shards of N = n x m_loc
  virtual ranks, optionally with Birder's moments in "grad" mode (spec B5).
- ``hierarchical_scaled_allreduce``: the same stages carrying 1-bit Adam/LAMB's scaled payload (the
  ``kScaled`` branch of the core): node mean of C_l, then ``reference.onebit.compressed_allreduce`` among
  the ranks with the same local index.
- ``parameter_server_step``: Alg. 1's element-wise parameter-server form (workers = nodes), which the
  sharded simulation equals exactly given the same uniforms (spec 4, last paragraph).
- ``draw_uniforms``: the uniforms the core draws from Philox when none are injected (``bucket_seed``: the key
  of each of the optimizer's buckets).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hvd_compress.reference import onebit, philox

SERVER_STREAM = 0xFFFFFFFF  # hvdc::kServerStream; worker j draws from stream j
F32 = np.float32


def padded_numel(numel: int, world_size: int) -> int:
    """``numel`` rounded up to a multiple of 8 * world_size (spec B7, whole bytes per piece)."""
    unit = 8 * world_size
    return (numel + unit - 1) // unit * unit


def quantize(y: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Q(y) as float32 +/-1, y - Q(y)) for uniforms ``u`` (Alg. 1 lines 8-9 / 11-12)."""
    y = np.asarray(y, dtype=F32)
    p = (y + F32(1)) * F32(0.5)
    q = np.where(np.asarray(u, dtype=F32) < p, F32(1), F32(-1)).astype(F32)
    return q, (y - q).astype(F32)


def bucket_seed(seed: int, bucket: int) -> int:
    """The Philox key of the optimizer's bucket ``bucket`` under ``seed``: seed XOR (bucket << 32)
    (``ops.hierarchical_onebit.bucket_seed``: every call counts elements from 0, so each bucket needs a key)."""
    return seed ^ (bucket << 32)


def draw_uniforms(seed: int, step: int, n_nodes: int, dpad: int) -> tuple[np.ndarray, np.ndarray]:
    """(UW (n_nodes, dpad), US (dpad,)): worker j's draws from stream j, the server's from SERVER_STREAM."""
    uw = np.stack([philox.uniform(dpad, seed, step, stream=j) for j in range(n_nodes)]) if dpad else np.zeros(
        (n_nodes, 0), F32
    )
    us = philox.uniform(dpad, seed, step, stream=SERVER_STREAM) if dpad else np.zeros(0, F32)
    return uw.astype(F32), us.astype(F32)


@dataclasses.dataclass
class Moments:
    """Birder's moments of one rank's chunk (c1 entries each), m and b, with beta and eps (spec 3.2-3.4)."""

    m: np.ndarray
    b: np.ndarray
    beta: float = 0.95
    eps: float = 1e-8

    def ratio(self, a: np.ndarray) -> np.ndarray:
        """Updates the first len(a) entries of m, b from the gradient ``a`` (the real elements; padding
        entries stay 0) and returns r = m / (b + eps) of them, float32 as the core."""
        beta, omb, eps = F32(self.beta), F32(1.0 - self.beta), F32(self.eps)
        k = len(a)
        self.m[:k] = beta * self.m[:k] + omb * a
        self.b[:k] = beta * self.b[:k] + omb * np.abs(a)
        return (self.m[:k] / (self.b[:k] + eps)).astype(F32)


def node_mean(padded: np.ndarray, j: int, loc: int, m_loc: int, c1: int) -> np.ndarray:
    """Stage 1, the intra-node reduce-scatter with MEAN (spec 4.1, B6): chunk C_loc of node j's mean of the
    zero-padded rows ``padded`` (N, dpad), float32 sum in local-rank order and one division."""
    acc = padded[j * m_loc, loc * c1 : (loc + 1) * c1].copy()
    for lp in range(1, m_loc):
        acc = (acc + padded[j * m_loc + lp, loc * c1 : (loc + 1) * c1]).astype(F32)
    return (acc / F32(m_loc)).astype(F32)


def hierarchical_1bit_allreduce(
    xs: np.ndarray,
    worker_errors: list[np.ndarray],
    server_errors: list[np.ndarray],
    m_loc: int,
    uniforms: tuple[np.ndarray, np.ndarray],
    moments: list[Moments] | None = None,
) -> np.ndarray:
    """Spec 4 over N = len(xs) ranks, rank r = j m_loc + l; errors (and moments) updated in place.

    ``worker_errors[r]`` has c1 = dpad / m_loc entries, ``server_errors[r]`` c2 = dpad / N; ``uniforms`` is
    (UW (n, dpad), US (dpad,)). Returns u (d,) float32 +/-1, the same on every rank.
    """
    xs = np.asarray(xs, dtype=F32)
    big_n, d = xs.shape
    n = big_n // m_loc
    dpad = padded_numel(d, big_n)
    c1, c2 = dpad // m_loc, dpad // big_n
    uw, us = uniforms
    padded = np.zeros((big_n, dpad), F32)
    padded[:, :d] = xs
    u_bar = np.zeros(dpad, F32)
    wbits = np.zeros((big_n, c1), F32)  # q as +/-1 (padding -1: a clear bit)
    for r in range(big_n):
        j, loc = divmod(r, m_loc)
        real1 = int(np.clip(d - loc * c1, 0, c1))
        a = node_mean(padded, j, loc, m_loc, c1)[:real1]
        # 2. worker: y = a + e_w (or the ratio of the updated moments + e_w); q = Q(y)
        base = moments[r].ratio(a) if moments is not None else a
        y = (base + worker_errors[r][:real1]).astype(F32)
        q, worker_errors[r][:real1] = quantize(y, uw[j, loc * c1 : loc * c1 + real1])
        wbits[r, :real1] = q
        wbits[r, real1:] = F32(-1)
    for r in range(big_n):
        j, loc = divmod(r, m_loc)
        # 3. inter-node alltoall: piece j of every node's C_l; 4. server average + error + Q
        start = loc * c1 + j * c2
        real2 = int(np.clip(d - start, 0, c2))
        ones = sum((wbits[jp * m_loc + loc, j * c2 : j * c2 + real2] > 0).astype(np.int64) for jp in range(n))
        s = (np.asarray(2 * ones - n, dtype=F32) / F32(n) + server_errors[r][:real2]).astype(F32)
        q, server_errors[r][:real2] = quantize(s, us[start : start + real2])
        u_bar[start : start + real2] = q
    # 4'. inter-node allgather and 5. intra-node allgather: every rank gets u; drop the padding
    return u_bar[:d].copy()


def hierarchical_scaled_allreduce(
    xs: np.ndarray, worker_errors: list[np.ndarray], server_errors: list[np.ndarray], m_loc: int
) -> np.ndarray:
    """The scaled 1-bit payload (paper 003 Alg. 1 lines 7-13) through spec 4's stages, over N = len(xs) ranks.

    Rank r = j m_loc + l: node mean of C_l (``node_mean``), then ``onebit.compressed_allreduce`` among the n
    ranks with local index l on the real part of C_l (real1 elements), then the intra-node allgather. Errors
    are updated in place: ``worker_errors[r]`` (c1 entries, the first real1 used) and ``server_errors[r]`` (c2
    entries, the first onebit.padded_numel(real1, n) / n used); the rest is padding and stays as it was.
    Returns the result (d,) as float64 values of float32, the same on every rank.
    """
    xs = np.asarray(xs, dtype=F32)
    big_n, d = xs.shape
    n = big_n // m_loc
    dpad = padded_numel(d, big_n)
    c1 = dpad // m_loc
    padded = np.zeros((big_n, dpad), F32)
    padded[:, :d] = xs
    out = np.zeros(d)
    for loc in range(m_loc):
        real1 = int(np.clip(d - loc * c1, 0, c1))
        if real1 == 0:
            continue
        ranks = [j * m_loc + loc for j in range(n)]
        served = onebit.padded_numel(real1, n) // n
        outs, werr, serr = onebit.compressed_allreduce(
            [node_mean(padded, j, loc, m_loc, c1)[:real1] for j in range(n)],
            [worker_errors[r][:real1] for r in ranks],
            [server_errors[r][:served] for r in ranks],
        )
        for k, r in enumerate(ranks):
            worker_errors[r][:real1] = werr[k]
            server_errors[r][:served] = serr[k]
        out[loc * c1 : loc * c1 + real1] = outs[0]
    return out


def parameter_server_step(
    grads: np.ndarray, worker_errors: np.ndarray, server_error: np.ndarray, uniforms: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """Alg. 1 lines 8-12 element-wise, unsharded: W = len(grads) workers with inputs ``grads`` (W, d) (the
    ratios r), ``worker_errors`` (W, d), ``server_error`` (d,), uniforms (UW (W, >= d), US (>= d)). Returns u."""
    w, d = grads.shape
    uw, us = uniforms
    qs = np.zeros((w, d), F32)
    for k in range(w):
        qs[k], worker_errors[k] = quantize(grads[k] + worker_errors[k], uw[k, :d])
    ones = (qs > 0).sum(axis=0)
    s = (np.asarray(2 * ones - w, dtype=F32) / F32(w) + server_error).astype(F32)
    u, server_error[:] = quantize(s, us[:d])
    return u
