"""Adasum of the optimizer's parameter delta, overlapped with backward: paper 002 (Adasum, MLSys 2021).

Section 4.1: with an adaptive optimizer, Adasum combines the *updates* each rank's optimizer computed
from its own gradient, not the gradients: per rank ``delta_r = step(x, g_r) - x``, then
``x <- x + Adasum_r(delta_r)`` (Algorithm 1, lines 1-14, for the reduction itself, in the core).

This module holds what does not depend on a framework: the options, the bucket plan (which deltas travel
together), and the sequencing of the reductions: a bucket whose deltas are all written is reduced on
one background thread, buckets strictly in bucket order (the same on every rank, so the collectives
match), and ``drain()`` waits for all of them and re-raises the first error only after every bucket has
finished (a rank never leaves a collective half-issued). The face runs the local steps, owns the buffers
and applies the reduced delta.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any

DEFAULT_BUCKET_MB = 16.0


@dataclasses.dataclass(frozen=True)
class AdasumOptions:
    """``hierarchical``: average within each node, Adasum across nodes (None: ``HVDC_ADASUM_HIERARCHICAL``);
    ``bucket_mb``: the size at which a bucket of deltas is closed and reduced."""

    hierarchical: bool | None = None
    bucket_mb: float = DEFAULT_BUCKET_MB

    def __post_init__(self) -> None:
        if not (isinstance(self.bucket_mb, (int, float)) and self.bucket_mb > 0):
            raise ValueError(f"op=Adasum: bucket_mb must be a positive number of MiB, got {self.bucket_mb!r}")


def plan_buckets(items: Sequence[tuple[Hashable, int]], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``items`` (each ``(dtype key, bytes)``) grouped into buckets of one key each.

    Items are taken in reverse order, which approximates the order gradients become final in backward,
    so the first buckets fill first and their reduction overlaps the rest of backward. A bucket closes
    once it holds ``bucket_bytes``; the still-open ones close at the end, in key order of first use.
    """
    buckets: list[list[int]] = []
    open_by_key: dict[Hashable, list[int]] = {}
    open_bytes: dict[Hashable, int] = {}
    for i in reversed(range(len(items))):
        key, nbytes = items[i]
        members = open_by_key.setdefault(key, [])
        members.append(i)
        open_bytes[key] = open_bytes.get(key, 0) + nbytes
        if open_bytes[key] >= bucket_bytes:
            buckets.append(members)
            open_by_key[key], open_bytes[key] = [], 0
    buckets.extend(members for members in open_by_key.values() if members)
    return buckets


class DeltaReductions:
    """In-order background reduction of delta buckets (the state of one optimizer's Adasum pipeline)."""

    def __init__(self, bucket_sizes: Sequence[int]) -> None:
        self._sizes = list(bucket_sizes)  # members per bucket
        self._ready: list[int] = [0] * len(self._sizes)
        self._futures: list[concurrent.futures.Future | None] = [None] * len(self._sizes)
        self._next = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hvdc-adasum")

    def mark_ready(self, bucket: int, count: int = 1) -> None:
        """``count`` more deltas of ``bucket`` are written."""
        self._ready[bucket] += count

    @property
    def launched(self) -> int:
        """Buckets started so far this step (those started from hooks overlap backward)."""
        return self._next

    def is_complete(self, bucket: int) -> bool:
        return self._ready[bucket] >= self._sizes[bucket]

    def launch_ready(self, reduce_bucket: Callable[[int], Any]) -> None:
        """Start ``reduce_bucket(b)`` on the background thread for each next bucket that is complete."""
        while self._next < len(self._sizes) and self.is_complete(self._next):
            self._futures[self._next] = self._pool.submit(reduce_bucket, self._next)
            self._next += 1

    def drain(self) -> None:
        """Wait for every launched bucket; raise the first error once all have finished."""
        errors = []
        for future in self._futures:
            if future is None:
                continue
            try:
                future.result()
            except Exception as e:  # re-raised below, once every bucket is drained
                errors.append(e)
        if errors:
            self.reset()
            raise errors[0]

    def reset(self) -> None:
        """Forget the step's readiness (after the reduced deltas are applied, or after an error)."""
        self._ready = [0] * len(self._sizes)
        self._futures = [None] * len(self._sizes)
        self._next = 0
