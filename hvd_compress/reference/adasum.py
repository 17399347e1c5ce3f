"""Reference Adasum (cpp/src/adasum.cc, cpp/src/adasum_kernels.cc), n virtual ranks in one process.

Paper 002 (shared/papers/002_*.txt), Algorithm 1, ADASUMRVH (lines 1-25 of its algorithm box), and
DESIGN.md's rule for rank counts that are not a power of two. The steps carry the C++ names:

- fold-in: with p the largest power of two <= n, rank r >= p is folded into rank r - p as Adasum(g[r-p], g[r]).
- levels (lines 2-20): at distance d = 1, 2, ... < p, rank r and r ^ d split their common slice, the lower rank
  keeping the first floor(len/2) elements (lines 2-13); per tensor, partial dot product and squared norms (line
  15) are summed over the 2d ranks that share the slice (lines 16-17), then combine (line 18):
  x' = (1 - dot/(2|a|^2)) a + (1 - dot/(2|b|^2)) b, a the lower rank's half; a squared norm below sqrt(DBL_MIN)
  gives that side the coefficient 1.
- allgather (lines 22-24): halves are swapped back, last level first; fold-out: rank r >= p gets r - p's result.

Arithmetic is float64 (dot products and the combine), rounded to the storage dtype after every combine, exactly
where the core stores to its buffer; only the order of the float64 sums differs. ``adasum_hierarchical`` mirrors
the C++'s: node average, Adasum across the node leaders, result shared within the node.
"""

from __future__ import annotations

import sys

import numpy as np

from hvd_compress.reference.dtypes import round_to, ulp

_TINY = float(np.sqrt(sys.float_info.min))  # sqrt(DBL_MIN)


def coefficient(dot: float, norm_sq: float) -> float:
    """The weight 1 - dot / (2 |x|^2) of one side; 1 for a (near-)zero vector."""
    if norm_sq < _TINY:
        return 1.0
    with np.errstate(all="ignore"):
        return float(1.0 - np.float64(dot) / np.float64(norm_sq) * 0.5)


def _offsets(sizes: list[int], numel: int) -> np.ndarray:
    off = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))]).astype(np.int64)
    if (np.asarray(sizes) < 0).any() or off[-1] != numel:
        raise ValueError(f"reference adasum: tensor sizes {sizes} do not cut {numel} elements")
    return off


def _dot_norms(offsets: np.ndarray, lo: int, hi: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Partial [dot, |left|^2, |right|^2] per tensor over the slice [lo, hi) (line 15)."""
    out = np.zeros((len(offsets) - 1, 3))
    with np.errstate(all="ignore"):
        for i in range(len(offsets) - 1):
            a, b = max(lo, offsets[i]), min(hi, offsets[i + 1])
            if a >= b:
                continue
            x, y = left[a - lo : b - lo], right[a - lo : b - lo]
            out[i] = (np.dot(x, y), np.dot(x, x), np.dot(y, y))
    return out


def _combine(
    offsets: np.ndarray, lo: int, hi: int, left: np.ndarray, right: np.ndarray, *, dots: np.ndarray, dtype: str
) -> np.ndarray:
    """The combined slice [lo, hi) from the group's summed dots (line 18), rounded to ``dtype``."""
    out = np.empty(hi - lo)
    with np.errstate(all="ignore"):
        for i in range(len(offsets) - 1):
            a, b = max(lo, offsets[i]), min(hi, offsets[i + 1])
            if a >= b:
                continue
            cl = coefficient(dots[i, 0], dots[i, 1])
            cr = coefficient(dots[i, 0], dots[i, 2])
            out[a - lo : b - lo] = cl * left[a - lo : b - lo] + cr * right[a - lo : b - lo]
    return round_to(out, dtype)


def adasum(inputs: list[np.ndarray], sizes: list[int] | None = None, dtype: str = "float32") -> list[np.ndarray]:
    """Each virtual rank's result of the core's Adasum over ``inputs`` (flat fused buffers, one per rank).

    ``sizes`` cuts the fused buffer into tensors (default: one tensor); coefficients are per tensor.
    """
    x = [round_to(np.asarray(g, dtype=np.float64).ravel(), dtype) for g in inputs]
    n = len(x)
    if len({v.size for v in x}) > 1:
        raise ValueError("reference adasum: ranks have different sizes")
    numel = x[0].size if n else 0
    offsets = _offsets([numel] if sizes is None else list(sizes), numel)
    if numel == 0 or n == 1:
        return [v.copy() for v in x]
    p = 1
    while p * 2 <= n:
        p *= 2

    # fold-in
    for r in range(p, n):
        dots = _dot_norms(offsets, 0, numel, x[r - p], x[r])
        x[r - p] = _combine(offsets, 0, numel, x[r - p], x[r], dots=dots, dtype=dtype)

    # levels: rank r holds the slice [lo[r], lo[r] + ln[r]).
    lo, ln = [0] * p, [numel] * p
    before: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    d = 1
    while d < p:
        halves = []
        for r in range(p):
            peer, lower, first = r ^ d, (r & d) == 0, ln[r] // 2
            keep_lo = lo[r] if lower else lo[r] + first
            keep_len = first if lower else ln[r] - first
            own = x[r][keep_lo : keep_lo + keep_len]
            recv = x[peer][keep_lo : keep_lo + keep_len]  # the exchange (lines 5-11)
            left, right = (own, recv) if lower else (recv, own)
            partial = _dot_norms(offsets, keep_lo, keep_lo + keep_len, left, right)
            halves.append((keep_lo, keep_len, left, right, partial))
        group_sums = {}
        for r in range(p):  # ALLREDUCE within the 2d ranks of r's group (line 17)
            g = r // (2 * d)
            group_sums[g] = group_sums.get(g, 0.0) + halves[r][4]
        new_x = [v.copy() for v in x[:p]]
        for r in range(p):
            keep_lo, keep_len, left, right, _ = halves[r]
            before[r].append((lo[r], ln[r]))
            new_x[r][keep_lo : keep_lo + keep_len] = _combine(
                offsets, keep_lo, keep_lo + keep_len, left, right, dots=group_sums[r // (2 * d)], dtype=dtype
            )
            lo[r], ln[r] = keep_lo, keep_len
        x[:p] = new_x
        d *= 2

    # allgather
    for k in reversed(range(len(before[0]) if p > 1 else 0)):
        new_x = [v.copy() for v in x[:p]]
        for r in range(p):
            peer, lower = r ^ (1 << k), (r & (1 << k)) == 0
            s_lo, s_len = before[r][k]
            first = s_len // 2
            o_lo, o_len = (s_lo + first, s_len - first) if lower else (s_lo, first)
            new_x[r][o_lo : o_lo + o_len] = x[peer][o_lo : o_lo + o_len]
        for r in range(p):
            lo[r], ln[r] = before[r][k]
        x[:p] = new_x

    # fold-out
    for r in range(p, n):
        x[r] = x[r - p].copy()
    return x


def combine_steps(n: int) -> int:
    """Combine steps on the longest path at n ranks: the fold-in (n not a power of two) and log2(p) levels."""
    p = 1 << (n.bit_length() - 1)
    return p.bit_length() - 1 + (n > p)


def core_tolerance(inputs: list[np.ndarray], dtype: str, steps: int) -> np.ndarray:
    """How far the core's Adasum of ``inputs`` may be from ``adasum``'s, element by element.

    The core and this reference do the same float64 operations on the same stored values in the same order,
    except the order of the float64 sums of the dot products (8 lanes, MPI's allreduce, NumPy's pairwise sum):
    the coefficients agree to about 1e-13 relative. A value stored to the dtype can therefore round the other
    way, 1 ulp per combine step, carried by the later steps (coefficients stay near 1 for random inputs):
    (steps + 1) ulps of sum_i |g_i|, which bounds every intermediate value. float64 also carries the
    coefficient difference itself (1e-12 * sum_i |g_i|). ``steps``: ``combine_steps`` (+1 for the node average
    of hierarchical mode). Used by tests/test_adasum.py (MPI) and cpp/tests (threads) alike.
    """
    abs_sum = np.sum([np.abs(round_to(g, dtype)) for g in inputs], axis=0)
    rel = 1e-12 if dtype == "float64" else 0.0
    return (steps + 1) * ulp(abs_sum, dtype) + rel * abs_sum


def adasum_hierarchical(
    inputs: list[np.ndarray], local_size: int, sizes: list[int] | None = None, dtype: str = "float32"
) -> list[np.ndarray]:
    """Hierarchical Adasum with nodes of ``local_size`` consecutive ranks (the last may be smaller)."""
    x = [round_to(np.asarray(g, dtype=np.float64).ravel(), dtype) for g in inputs]
    nodes = [list(range(s, min(s + local_size, len(x)))) for s in range(0, len(x), local_size)]
    averages = [round_to(np.sum([x[r] for r in node], axis=0) / len(node), dtype) for node in nodes]
    across = adasum(averages, sizes, dtype)
    return [across[r // local_size].copy() for r in range(len(x))]
