"""NumPy simulation of the compressed reductions of the dense path (cpp/include/hvdc/sparse_allreduce.h,
hvd_compress/ops/compression.py) over n virtual ranks: the oracle of the multi-rank tests.

Same names for the same steps as the core: ``sparse_k``, ``topk_sends_dense``, ``topk_select``, ``randomk_select``,
``half_wire_allreduce`` and ``sparse_allreduce`` (its top-k branch with DGC momentum:
``topk_momentum_allreduce``); the same float32 arithmetic in the same order (sums in
rank order, one division by n for Average), so top-k and the 16-bit kinds match the core bit for bit.
Random-k's k values go through MPI's allreduce, whose summation order MPI picks: equal to a few float32
ulps at n >= 3.
"""

from __future__ import annotations

import math

import numpy as np

from hvd_compress.reference import philox
from hvd_compress.reference.dtypes import round_to

RANDOMK_STREAM = 0x524B5031  # hvdc::kRandomKStream
WIRE = {"fp16": "float16", "bf16": "bfloat16"}


def sparse_k(numel: int, ratio: float) -> int:
    """floor(ratio * numel + 0.5) in [1, numel] (0 for an empty buffer)."""
    if numel <= 0:
        return 0
    return min(max(math.floor(ratio * numel + 0.5), 1), numel)


def _smallest(keys: np.ndarray, k: int) -> np.ndarray:
    """Ascending indices of the k smallest keys, ties to the lower index."""
    order = np.lexsort((np.arange(keys.size), keys))
    return np.sort(order[:k]).astype(np.int64)


def topk_select(c: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k elements of largest |c| (float32), ties to the lower index, ascending."""
    return _smallest(-np.abs(np.asarray(c, dtype=np.float32)), k)


def randomk_select(numel: int, k: int, seed: int, step: int, offset: int = 0) -> np.ndarray:
    """Indices of the k smallest Philox words [offset, offset + numel) of (seed, step, RANDOMK_STREAM), counted
    from 0, ascending: every rank's."""
    return _smallest(philox.words(numel, seed, step, RANDOMK_STREAM, offset), k)


def sparse_select(c: np.ndarray, kind: str, ratio: float, seed: int, step: int, sizes: list[int]) -> np.ndarray:
    """The ascending indices every tensor (``sizes`` cut the buffer) sends: its own k of its own elements."""
    out, offset = [], 0
    for m in sizes:
        k = sparse_k(m, ratio)
        if kind == "topk":
            out.append(topk_select(c[offset : offset + m], k) + offset)
        else:
            out.append(randomk_select(m, k, seed, step, offset) + offset)
        offset += m
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def topk_sends_dense(numel: int, ratio: float, sizes: list[int], n: int) -> bool:
    """Whether top-k sends every element (n * k >= numel, k summed over the tensors): the n ranks' pairs
    would cost at least the dense reduction's bytes. Summed in rank order all the same."""
    return n * sum(sparse_k(m, ratio) for m in sizes) >= numel


def _to_float32(x: np.ndarray, dtype: str) -> np.ndarray:
    """The buffer as the core reads it: float32 (float64 rounded once; half values are exact)."""
    return round_to(x, dtype).astype(np.float32)


def half_wire_allreduce(xs: list[np.ndarray], dtype: str, kind: str, op: str) -> np.ndarray:
    """fp16/bf16: each rank's values rounded to the 16-bit type, summed in float32 in rank order (/ n for
    Average), rounded to 16 bits once, widened into ``dtype``. The same result on every rank (float64)."""
    wire = WIRE[kind]
    total = np.zeros(xs[0].size, dtype=np.float32)
    for x in xs:
        total = (total + round_to(_to_float32(x, dtype), wire).astype(np.float32)).astype(np.float32)
    if op == "Average":
        total = (total / np.float32(len(xs))).astype(np.float32)
    return round_to(round_to(total, wire), dtype)


def _compensated(xs: list[np.ndarray], errors: list[np.ndarray], dtype: str) -> list[np.ndarray]:
    """c = float32(x) + e per rank: what top-k/random-k select from and send."""
    return [
        (_to_float32(x, dtype) + np.asarray(e, dtype=np.float32)).astype(np.float32)
        for x, e in zip(xs, errors, strict=True)
    ]


def _send(
    cs: list[np.ndarray], kind: str, op: str, ratio: float, seed: int, step: int, sizes: list[int]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The float32 reduction of what every rank sends from its ``cs``, and each rank's selected indices."""
    n, numel = len(cs), cs[0].size
    out = np.zeros(numel, dtype=np.float32)
    if kind == "topk":
        dense = topk_sends_dense(numel, ratio, sizes, n)
        chosen = [np.arange(numel) if dense else sparse_select(c, kind, ratio, seed, step, sizes) for c in cs]
        for c, idx in zip(cs, chosen, strict=True):  # rank order; one rank's indices are distinct
            out[idx] = (out[idx] + c[idx]).astype(np.float32)
    elif kind == "randomk":
        idx = sparse_select(cs[0], kind, ratio, seed, step, sizes)
        chosen = [idx] * n
        vals = np.zeros(idx.size, dtype=np.float32)
        for c in cs:
            vals = (vals + c[idx]).astype(np.float32)
        out[idx] = vals
    else:
        raise ValueError(f"unknown sparse kind {kind!r}")
    if op == "Average" and n > 1:
        out = (out / np.float32(n)).astype(np.float32)
    return out, chosen


def _cut(values: list[np.ndarray], chosen: list[np.ndarray]) -> list[np.ndarray]:
    """Each rank's ``values`` with the elements it sent set to 0."""
    out = []
    for v, idx in zip(values, chosen, strict=True):
        cut = v.copy()
        cut[idx] = 0.0
        out.append(cut)
    return out


def sparse_allreduce(
    xs: list[np.ndarray],
    errors: list[np.ndarray],
    kind: str,
    op: str,
    ratio: float,
    seed: int,
    step: int,
    dtype: str,
    sizes: list[int] | None = None,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Top-k / random-k with error feedback: (the result on every rank as float64, each rank's new float32
    error). c = x + e; each tensor (``sizes``, default one) sends k of its elements of c; e becomes c with the
    sent elements set to 0."""
    sizes = [xs[0].size] if sizes is None else sizes
    cs = _compensated(xs, errors, dtype)
    out, chosen = _send(cs, kind, op, ratio, seed, step, sizes)
    return round_to(out, dtype), _cut(cs, chosen)


def topk_momentum_allreduce(
    xs: list[np.ndarray],
    errors: list[np.ndarray],
    velocities: list[np.ndarray],
    op: str,
    ratio: float,
    momentum: float,
    dtype: str,
    sizes: list[int] | None = None,
    momentum_masking: bool = True,
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Top-k with Deep Gradient Compression's momentum correction and momentum factor masking (Lin et al.,
    ICLR 2018, Section 3.2; the core's sparse_allreduce with momentum > 0): (the result as float64, each rank's
    new float32 accumulator ``errors`` (DGC's v), each rank's new float32 velocity u). Per rank:
    u = float32(float32(mu) * u) + x, v = v + u, top-k of v is sent, and v and (``momentum_masking``) u are 0
    where the rank sent."""
    sizes = [xs[0].size] if sizes is None else sizes
    mu = np.float32(momentum)
    us = [
        ((mu * np.asarray(u, dtype=np.float32)).astype(np.float32) + _to_float32(x, dtype)).astype(np.float32)
        for x, u in zip(xs, velocities, strict=True)
    ]
    cs = _compensated(us, errors, "float32")
    out, chosen = _send(cs, "topk", op, ratio, 0, 0, sizes)
    return round_to(out, dtype), _cut(cs, chosen), _cut(us, chosen) if momentum_masking else us
