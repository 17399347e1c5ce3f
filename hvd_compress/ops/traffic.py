"""Bytes on the wire per collective call.

Every core collective reports the bytes this rank sent and received for that one call (signature
exchange included), counted by the core under its one-collective-at-a-time lock: no diff of global
counters, so traffic of another thread (the Adasum optimizer's background thread, a user's own
allreduce) never lands in the wrong total. A call's counts go to

- the ``traffic=`` accumulator passed to the ``hvd_compress.ops`` collective, if any, and
- every accumulator that ``counting(...)`` made active in the calling context (this thread), which is
  how a wrapper counts calls made through code that does not forward ``traffic=`` (a framework face).

``comm_stats()`` (hvd_compress.ops.runtime) still reports the process-wide totals.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator, Mapping

_KEYS = ("bytes_sent", "bytes_received", "calls")


class Traffic:
    """A thread-safe accumulator of per-call byte counts: ``bytes_sent``, ``bytes_received``, ``calls``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(_KEYS, 0)

    def add(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            for k in _KEYS:
                self._counts[k] += int(counts.get(k, 0))

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def take(self) -> dict[str, int]:
        """The counts so far, and start again from zero."""
        with self._lock:
            out, self._counts = self._counts, dict.fromkeys(_KEYS, 0)
        return out


# The accumulators active in this context; a new thread starts with none.
_active: contextvars.ContextVar[tuple[Traffic, ...]] = contextvars.ContextVar("hvdc_traffic", default=())


@contextlib.contextmanager
def counting(traffic: Traffic) -> Iterator[Traffic]:
    """Within the block, every ``hvd_compress.ops`` collective called in this context adds its counts to
    ``traffic`` (nested blocks add to each of their accumulators)."""
    token = _active.set((*_active.get(), traffic))
    try:
        yield traffic
    finally:
        _active.reset(token)


def record(counts: Mapping[str, int], traffic: Traffic | None = None) -> Mapping[str, int]:
    """Add one call's ``counts`` to ``traffic`` and to the accumulators active here (each once); returns
    ``counts``."""
    targets = {id(t): t for t in ((traffic,) if traffic is not None else ()) + _active.get()}
    for t in targets.values():
        t.add(counts)
    return counts
