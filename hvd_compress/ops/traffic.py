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
from collections.abc import Callable, Iterator, Mapping
from typing import Any

_KEYS = ("bytes_sent", "bytes_received", "calls", "host_bytes")


class Traffic:
    """A thread-safe accumulator of per-call byte counts: ``bytes_sent``, ``bytes_received``, ``calls``, and
    ``host_bytes`` (copied between a device and host memory; 0 on the CPU)."""

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


@contextlib.contextmanager
def not_counting() -> Iterator[None]:
    """Within the block, collectives add to none of the accumulators that enclosing ``counting`` blocks made
    active (a user's code run inside a wrapper's call: its own collectives are not the wrapper's)."""
    token = _active.set(())
    try:
        yield
    finally:
        _active.reset(token)


def record(counts: Mapping[str, int], traffic: Traffic | None = None) -> Mapping[str, int]:
    """Add one call's ``counts`` to ``traffic`` and to the accumulators active here (each once); returns
    ``counts``."""
    targets = {id(t): t for t in ((traffic,) if traffic is not None else ()) + _active.get()}
    for t in targets.values():
        t.add(counts)
    return counts


class CommMeter:
    """Bytes this wrapper's own collectives sent and received (thread-safe).

    Each core call reports its own bytes (above): ``run`` counts exactly the calls
    ``fn`` makes on the calling thread, whatever other threads (the Adasum background thread, a user's
    allreduce) communicate at the same time.
    """

    def __init__(self) -> None:
        self._traffic = Traffic()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with counting(self._traffic):
            return fn(*args, **kwargs)

    def take(self) -> dict[str, int]:
        counts = self._traffic.take()
        return {"bytes_sent": counts["bytes_sent"], "bytes_received": counts["bytes_received"]}
