"""Horovod's process sets, as far as hvd_compress goes: the global set only.

hvd_compress runs every collective on all ranks of the world it was initialized on. ``add_process_set`` and
``process_set=`` accept the global set (ours or Horovod's) and raise ``ProcessSetError`` for any other, naming
what to use instead, rather than silently reducing over all ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hvd_compress.ops import runtime
from hvd_compress.ops.errors import ProcessSetError

_INSTEAD = (
    "hvd_compress reduces over every rank of its world only. For a subset, either run Horovod's own "
    "collectives there (hvd.add_process_set + hvd.allreduce(..., process_set=...)), or start hvd_compress on "
    "that subset's communicator: hc.init(comm=MPI.COMM_WORLD.Split(color, key)) in a job whose hc "
    "collectives all run within it"
)


class ProcessSet:
    """A set of ranks (``ranks=None``: every rank), as Horovod's ``ProcessSet``."""

    def __init__(self, ranks: Sequence[int] | None = None) -> None:
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id = 0 if ranks is None else None

    def size(self) -> int:
        return runtime.size() if self.ranks is None else len(self.ranks)

    def rank(self) -> int:
        return runtime.rank() if self.ranks is None else self.ranks.index(runtime.rank())

    def included(self) -> bool:
        return self.ranks is None or runtime.rank() in self.ranks

    def __repr__(self) -> str:
        return "ProcessSet(global)" if self.ranks is None else f"ProcessSet(ranks={self.ranks})"


#: The set of every rank: what every hvd_compress collective runs on.
global_process_set = ProcessSet()


def _is_global(ranks: Sequence[int] | None) -> bool:
    return ranks is None or sorted(int(r) for r in ranks) == list(range(runtime.size()))


def add_process_set(process_set: Any) -> ProcessSet:
    """As ``hvd.add_process_set``: a list of ranks (or a ProcessSet). The set of all ranks is the global set;
    any other raises ``ProcessSetError`` naming the alternatives."""
    ranks = getattr(process_set, "ranks", process_set)
    if _is_global(ranks):
        return global_process_set
    raise ProcessSetError(f"process set {sorted(ranks)} of a world of {runtime.size()}: {_INSTEAD}")


def check_process_set(process_set: Any) -> None:
    """Accept ``None``, the global set (hvd_compress's or Horovod's, id 0, or one listing every rank);
    raise ``ProcessSetError`` for any other set."""
    if process_set is None or process_set is global_process_set:
        return
    if getattr(process_set, "process_set_id", None) == 0:
        return
    ranks = getattr(process_set, "ranks", "?")
    if ranks != "?" and _is_global(ranks):
        return
    raise ProcessSetError(f"process_set={process_set!r}: {_INSTEAD}")
