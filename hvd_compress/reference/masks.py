"""NumPy mirror of the core's random-k masks and masked allreduce (cpp/include/hvdc/masks.h,
cpp/src/masked_allreduce.cc): SLAMB's mask (paper 000 Alg. 1 line 6; spec shared/specs/slamb.md sections
2 step 4 and 3), written from the spec with the reference Philox (``reference/philox.py``).

- cyclic: pi = argsort(words(numel, seed, step 0, PERMUTATION_STREAM), stable); nc = int(1 / ratio),
  cs = ceil(numel / nc); step t selects pi[c cs : (c + 1) cs] with c = t mod nc (empty past the end).
- bernoulli: with T = ceil(float32(ratio) 2^32), element i is selected iff (hi_i << 16 | lo_i) < T (all when
  T >= 2^32), hi_i and lo_i the 16-bit half i & 1 (0: the low half) of word i >> 1 of (seed, t mod 2^32,
  BERNOULLI_STREAM) and of (seed, t mod 2^32, BERNOULLI_TIE_STREAM). The core reads the tie stream only where
  hi_i == T >> 16; the mirror draws both streams whole and compares the 32-bit numbers.
- ``always``: (offset, length) pairs selected on every step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hvd_compress.reference import philox

PERMUTATION_STREAM = 0x4D41534B  # "MASK"
BERNOULLI_STREAM = 0x4D41534C  # "MASL": hi_i
BERNOULLI_TIE_STREAM = 0x4D41534D  # "MASM": lo_i
KINDS = ("cyclic", "bernoulli")


def cyclic_permutation(numel: int, seed: int) -> np.ndarray:
    """pi: the elements sorted by their Philox word, ties in index order."""
    return np.argsort(philox.words(numel, seed, 0, PERMUTATION_STREAM), kind="stable")


def bernoulli_threshold(ratio: float) -> int:
    """T = ceil(float32(ratio) 2^32): float32 has 24 significant bits, so the product is exact in double."""
    return math.ceil(float(np.float32(ratio)) * 2.0**32)


def bernoulli_halves(numel: int, seed: int, step: int, stream: int, offset: int = 0) -> np.ndarray:
    """Halves [offset, offset + numel): half i & 1 of word i >> 1 of (seed, step mod 2^32, stream), uint64."""
    first, end = offset >> 1, (offset + numel + 1) >> 1
    words = philox.words(end - first, seed, step & 0xFFFFFFFF, stream, first).astype(np.uint64)
    i = np.arange(offset, offset + numel, dtype=np.uint64)
    return (words[(i >> np.uint64(1)) - np.uint64(first)] >> ((i & np.uint64(1)) * np.uint64(16))) & np.uint64(0xFFFF)


def bernoulli_mask(numel: int, ratio: float, seed: int, step: int, offset: int = 0) -> np.ndarray:
    """Elements [offset, offset + numel) of the Bernoulli draw of (ratio, seed, step), bool."""
    t = bernoulli_threshold(ratio)
    if t >= 2**32:
        return np.ones(numel, dtype=bool)
    hi = bernoulli_halves(numel, seed, step, BERNOULLI_STREAM, offset)
    lo = bernoulli_halves(numel, seed, step, BERNOULLI_TIE_STREAM, offset)
    return ((hi << np.uint64(16)) | lo) < np.uint64(t)


def random_mask(numel: int, ratio: float, seed: int, step: int, kind: str = "cyclic",
                always: Sequence[int] = ()) -> np.ndarray:
    """The bool mask of (numel, ratio, seed, step, kind) with the ``always`` (offset, length) pairs set."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio must be in (0, 1], got {ratio}")
    mask = np.zeros(numel, dtype=bool)
    if kind == "cyclic":
        nc = max(1, int(1.0 / ratio))
        cs = -(-numel // nc)
        c = step % nc
        mask[cyclic_permutation(numel, seed)[c * cs:(c + 1) * cs]] = True
    elif kind == "bernoulli":
        mask = bernoulli_mask(numel, ratio, seed, step)
    else:
        raise ValueError(f"unknown mask kind {kind!r}; use one of {KINDS}")
    for off, length in zip(always[::2], always[1::2], strict=True):
        mask[off:off + length] = True
    return mask


def masked_allreduce(xs: Sequence[np.ndarray], mask: np.ndarray) -> list[np.ndarray]:
    """Each rank's array with the masked elements replaced by their average over the ranks (sum then
    times 1/n, in the arrays' dtype, as the core's dense Average), the others its own."""
    n = len(xs)
    dense = [x[mask] for x in xs]
    total = dense[0].copy()
    for d in dense[1:]:
        total = total + d
    if n > 1:
        total = (total * np.asarray(1.0 / n, dtype=total.dtype)).astype(total.dtype)
    out = []
    for x in xs:
        y = x.copy()
        y[mask] = total
        out.append(y)
    return out
