"""Buckets reduced in the background while backward continues (Horovod's fusion buffer, DDP's reducer buckets),
framework-neutral: which tensors travel together (the bucket plan) and the in-order launch of their reductions.

Used by the optimizer faces that overlap communication with backward: ``op=Average``/``Sum`` (gradient buckets)
and ``op=Adasum`` (parameter-delta buckets). A face marks members of a bucket ready from its gradient hooks; a
complete bucket is reduced on the process's one background thread (``runtime.submit``), buckets strictly in bucket
order, so every rank issues the same collectives in the same order whatever the thread timing. ``drain()`` waits
for all of them and re-raises the first error only after every launched bucket has finished (a rank never leaves a
collective half-issued).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

from hvd_compress.ops import runtime
from hvd_compress.ops.collectives import reject_allreduce
from hvd_compress.ops.errors import CORE_ERRORS
from hvd_compress.ops.traffic import CommMeter

#: ``op=Average``/``Sum``: a gradient bucket closes at this many MiB (DDP's default bucket_cap_mb), the first one
#: at ``FIRST_BUCKET_MB``, so that the first reduction starts early in backward (DDP's first bucket).
DEFAULT_BUCKET_MB = 25.0
FIRST_BUCKET_MB = 1.0


def plan_buckets(
    items: Sequence[tuple[Hashable, int]], bucket_bytes: int, first_bucket_bytes: int | None = None
) -> list[list[int]]:
    """Indices of ``items`` (each ``(dtype key, bytes)``) grouped into buckets of one key each.

    Items are taken in reverse order, which approximates the order gradients become final in backward,
    so the first buckets fill first and their reduction overlaps the rest of backward. A bucket closes
    once it holds ``bucket_bytes`` (the first bucket of each key: ``first_bucket_bytes``, when given, so that
    the first reduction starts early, as DDP's 1 MB first bucket); the still-open ones close at the end, in key
    order of first use. For one key, a bucket's members are consecutive items.
    """
    buckets: list[list[int]] = []
    open_by_key: dict[Hashable, list[int]] = {}
    open_bytes: dict[Hashable, int] = {}
    closed: set[Hashable] = set()  # keys that closed a bucket already
    for i in reversed(range(len(items))):
        key, nbytes = items[i]
        members = open_by_key.setdefault(key, [])
        members.append(i)
        open_bytes[key] = open_bytes.get(key, 0) + nbytes
        cap = bucket_bytes if first_bucket_bytes is None or key in closed else first_bucket_bytes
        if open_bytes[key] >= cap:
            buckets.append(members)
            open_by_key[key], open_bytes[key] = [], 0
            closed.add(key)
    buckets.extend(members for members in open_by_key.values() if members)
    return buckets


def cut_buckets(items: Sequence[tuple[Hashable, int]], bucket_mb: float) -> tuple[list[list[int]], list[int]]:
    """The buckets of ``items`` (as ``plan_buckets``: ``bucket_mb`` MiB, the first bucket of each key
    ``FIRST_BUCKET_MB``) as a bucketed algorithm's buckets, the one cut both faces make: each bucket's members
    in registration order, the buckets sorted by their first member (the order of a checkpoint's bucket list), and
    the bucket indices in bucket order (the order their reductions start)."""
    cap = int(bucket_mb * (1 << 20))
    plan = plan_buckets(items, cap, min(cap, int(FIRST_BUCKET_MB * (1 << 20))))
    buckets = sorted(sorted(members) for members in plan)
    index = {tuple(members): s for s, members in enumerate(buckets)}
    return buckets, [index[tuple(sorted(members))] for members in plan]


class BucketReductions:
    """In-order background reduction of buckets (the state of one optimizer's pipeline for one step)."""

    def __init__(self, bucket_sizes: Sequence[int]) -> None:
        self._sizes = list(bucket_sizes)  # members per bucket
        self._ready: list[int] = [0] * len(self._sizes)
        self._futures: list[concurrent.futures.Future | None] = [None] * len(self._sizes)
        self._next = 0

    def mark_ready(self, bucket: int, count: int = 1) -> None:
        """``count`` more members of ``bucket`` are final."""
        self._ready[bucket] += count

    def mark_all_ready(self) -> None:
        """Every bucket is complete (the end of the gradient phase: members without a gradient count as final)."""
        self._ready = list(self._sizes)

    @property
    def launched(self) -> int:
        """Buckets started so far this step (those started from hooks overlap backward)."""
        return self._next

    def is_complete(self, bucket: int) -> bool:
        return self._ready[bucket] >= self._sizes[bucket]

    def next_is_ready(self) -> bool:
        """Whether ``launch_ready`` would start a bucket now."""
        return self._next < len(self._sizes) and self.is_complete(self._next)

    def launch_ready(self, reduce_bucket: Callable[[int], Any]) -> int:
        """Start ``reduce_bucket(b)`` on the background thread for each next bucket that is complete; how many."""
        start = self._next
        while self.next_is_ready():
            self._futures[self._next] = runtime.submit(reduce_bucket, self._next)
            self._next += 1
        return self._next - start

    def wait(self) -> None:
        """Wait for every launched bucket to finish; their errors stay for ``drain`` to raise."""
        concurrent.futures.wait([f for f in self._futures if f is not None])

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
        """Forget the step's readiness (after the reduced buckets are used, or after an error)."""
        self._ready = [0] * len(self._sizes)
        self._futures = [None] * len(self._sizes)
        self._next = 0


@contextlib.contextmanager
def failure_joins_as_rejection(meter: CommMeter, name: str) -> Iterator[None]:
    """Around a bucket's work on the background thread up to and including its collective ``name``: a Python
    error there is this rank's alone, so it joins the call as a rejection and the other ranks raise too instead of
    waiting for it; errors the core raised (already on every rank) pass through."""
    try:
        yield
    except CORE_ERRORS:
        raise
    except Exception as e:
        meter.run(reject_allreduce, f"{type(e).__name__}: {e}", name)
        raise
