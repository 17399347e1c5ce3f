"""Framework-neutral random-k masks and the masked allreduce (SLAMB's communication: paper 000 Alg. 1 lines
6-8; spec shared/specs/slamb.md sections 2 step 4 and 3), over the core (cpp/include/hvdc/masks.h,
cpp/include/hvdc/masked_allreduce.h).

Masks come from the core's Philox keyed by (seed, step): the same bits on every rank, no framework
generator touched, nothing sent. ``kind="cyclic"`` (default) selects chunk (step mod int(1/ratio)) of a
permutation drawn once from ``seed``: every element exactly once per int(1/ratio) steps, a fixed count per
step. ``kind="bernoulli"`` selects each element independently with probability T / 2^32, T = ceil(float32(ratio)
2^32), from 16-bit halves of Philox words (the draw is defined in cpp/include/hvdc/masks.h).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hvd_compress import _core
from hvd_compress.ops import runtime
from hvd_compress.ops.tensors import as_core_buffer
from hvd_compress.ops.traffic import Traffic, record

KINDS = {"cyclic": 0, "bernoulli": 1}
_U64 = (1 << 64) - 1


def mask_kind(kind: str) -> int:
    """The core's code of a mask kind name; ValueError for an unknown one."""
    try:
        return KINDS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown mask kind {kind!r}; use one of {sorted(KINDS)}") from None


def check_mask_args(ratio: float, seed: int, step: int) -> None:
    """ValueError for a ratio outside (0, 1], a seed outside [0, 2**64) or a negative step."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio (the fraction of elements selected) must be in (0, 1], got {ratio!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _U64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")


def random_mask_(out: Any, ratio: float, seed: int, step: int, kind: str = "cyclic",
                 always: Sequence[int] = (), offset: int = 0, total: int | None = None) -> Any:
    """Fill ``out`` (a contiguous 1-D bool tensor on the CPU) with the mask of (total, ratio, seed, step,
    kind), plus the (offset, length) pairs of ``always``: its elements [offset, offset + len(out)), each the bit
    it has in the whole mask (``total`` None: len(out), the whole mask). Returns ``out``."""
    check_mask_args(ratio, seed, step)
    _core.random_mask(out, float(ratio), int(seed), int(step), mask_kind(kind), [int(a) for a in always],
                      int(offset), -1 if total is None else int(total))
    return out


def masked_norms(x: Any, mask: Any) -> tuple[float, float, int]:
    """(2-norm of x[mask], 2-norm of x[~mask], number selected) of a contiguous float32 CPU tensor, in one pass
    of the core (sums of squares in double) instead of two boolean-indexed copies."""
    if mask.shape[0] == 0:  # an empty tensor's strides may not read as contiguous
        return 0.0, 0.0, 0
    selected, unselected, count = _core.mask_sum_squares(x, mask)
    return math.sqrt(selected), math.sqrt(unselected), int(count)


def freshness_(c: Any, mask: Any, beta3: float) -> Any:
    """In place on a flat float32 CPU buffer: c = 1 where ``mask`` is set, else beta3 * c (SLAMB step 6), in
    one core pass; returns ``c``."""
    if mask.shape[0]:  # an empty tensor's strides may not read as contiguous
        _core.mask_freshness(c, mask, float(beta3))
    return c


def masked_allreduce_(
    tensor: Any,
    ratio: float,
    seed: int,
    step: int,
    kind: str = "cyclic",
    always: Sequence[int] = (),
    mask_out: Any = None,
    check_finite: bool = False,
    name: str | None = None,
    traffic: Traffic | None = None,
    offset: int = 0,
    total: int | None = None,
) -> Any:
    """In place: the elements of ``tensor`` (contiguous, CPU, float) that the mask selects become their
    average over all ranks; the others keep this rank's values. Returns ``tensor``.

    The mask is ``random_mask_`` of (total, ratio, seed, step, kind, always, offset), drawn in the core:
    ``tensor`` holds elements [offset, offset + numel) of the mask's index space of ``total`` elements (None:
    numel, the whole mask). The average is element-wise, so a buffer reduced in ranges (SLAMB's buckets) ends
    exactly as if reduced whole under the same mask. The mask's arguments are agreed between the ranks first
    (``MismatchError`` on every rank if any differs, before any data moves). ``mask_out`` (bool, numel)
    receives it. ``check_finite``: NaN/Inf on any rank raises ``UsageError`` on every rank with every tensor
    unchanged.
    """
    check_mask_args(ratio, seed, step)
    counts = runtime.get_in_order().masked_allreduce(
        as_core_buffer(tensor), float(ratio), int(seed), int(step), mask_kind(kind), [int(a) for a in always],
        mask_out, bool(check_finite), name or "", int(offset), -1 if total is None else int(total),
    )
    record(counts, traffic)
    return tensor


def masked_gather_(
    tensor: Any,
    compact: Any | None,
    ratio: float,
    seed: int,
    step: int,
    kind: str = "cyclic",
    always: Sequence[int] = (),
    *,
    mask_out: Any,
    check_finite: bool = False,
    name: str | None = None,
    traffic: Traffic | None = None,
    offset: int = 0,
    total: int | None = None,
) -> int:
    """The agreement and gather of ``masked_allreduce_`` without its average, for a caller that averages the
    gathered elements itself: the same mask and the same checks (``MismatchError``/``UsageError`` on every rank,
    nothing changed), then the mask into ``mask_out`` and tensor[mask], in index order, into the front of
    ``compact`` (same dtype, room for every selected element; None: the mask only). Returns how many are selected
    (the same on every rank). Only the signature travels."""
    check_mask_args(ratio, seed, step)
    counts = dict(runtime.get_in_order().masked_gather(
        as_core_buffer(tensor), None if compact is None else as_core_buffer(compact), float(ratio), int(seed),
        int(step), mask_kind(kind), [int(a) for a in always], mask_out, bool(check_finite), name or "", int(offset),
        -1 if total is None else int(total),
    ))
    count = int(counts.pop("count"))
    record(counts, traffic)
    return count
