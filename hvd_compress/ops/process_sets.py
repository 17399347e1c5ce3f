"""Horovod's process sets: collectives over a subset of the world's ranks.

A set's members share a runtime of their own, built over a communicator of just those ranks
(``MPI_Comm_create_group``, collective over the members only), so a set's collectives follow the same protocol as
the world's (signature agreement, rejection on every member, byte counting) and never mix with another set's.
``add_process_set`` is called by every rank of the world in one order, as Horovod's (which hvd_compress does not
require ``HOROVOD_DYNAMIC_PROCESS_SETS`` for); a set that Horovod made (``hvd.add_process_set``,
``hvd.init(process_sets=...)``) gets its runtime at its first hc collective, on its members. Ranks are world
ranks, ``root_rank`` included. A rank outside a set that calls a collective with it raises
``NotInProcessSetError``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hvd_compress.ops import runtime
from hvd_compress.ops.errors import CORE_ERRORS, NotInProcessSetError, ProcessSetError

#: The tag of the communicators of process sets (``MPI_Comm_create_group`` over the world).
_TAG = 0x68766463


class ProcessSet:
    """A set of world ranks (``ranks=None``: the global set), as Horovod's ``ProcessSet``: register it with
    ``add_process_set`` (every rank), then pass it as ``process_set=``."""

    def __init__(self, ranks: Sequence[int] | None = None) -> None:
        self.ranks = None if ranks is None else sorted(ranks)
        self.process_set_id: int | None = 0 if ranks is None else None

    def size(self) -> int | None:
        """The number of ranks in the set; None if it is not registered."""
        if self.ranks is None:
            return runtime.world().Get_size()
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within the set (its position in ``ranks``); None if the set is not registered.
        ValueError outside the set (as Horovod)."""
        if self.ranks is None:
            return runtime.world().Get_rank()
        if self.process_set_id is None:
            return None
        me = runtime.world().Get_rank()
        if me not in self.ranks:
            raise ValueError(f"rank {me} is not part of {self!r}")
        return self.ranks.index(me)

    def included(self) -> bool:
        return self.ranks is None or runtime.world().Get_rank() in self.ranks

    def __repr__(self) -> str:
        return "ProcessSet(global)" if self.ranks is None else f"ProcessSet(ranks={self.ranks})"


#: The set of every rank: what a collective runs on without ``process_set=``.
global_process_set = ProcessSet()


class _Subset:
    """A registered set's runtime on one of its members (``core``), or nothing on a rank outside it."""

    def __init__(self, ranks: tuple[int, ...]) -> None:
        world = runtime.world()
        self.ranks = ranks
        self.core = None
        if world.Get_rank() in ranks:
            whole = world.Get_group()
            group = whole.Incl(list(ranks))
            comm = world.Create_group(group, _TAG)
            group.Free()
            whole.Free()
            self.core = runtime.new_subset(comm)
            comm.Free()  # the runtime holds its own duplicate


class _Registry:
    """The sets of this session: those added here (by ranks, the same on every rank) and those Horovod made."""

    def __init__(self, world: Any) -> None:
        self.world = world
        self.added: dict[tuple[int, ...], _Subset] = {}
        self.horovods: dict[tuple[int, ...], _Subset] = {}
        self.next_id = 1


_registry: _Registry | None = None
_lock = threading.RLock()


def _current() -> _Registry:
    global _registry
    world = runtime.world()
    if _registry is None or _registry.world is not world:  # a new init(): the old sets died with their runtime
        _registry = _Registry(world)
    return _registry


def _problem(ranks: Any, size: int) -> str:
    """Why ``ranks`` is no set of ranks of a world of ``size`` ("" if it is one)."""
    try:
        items = list(ranks)
    except TypeError:
        return f"{ranks!r} is not a list of ranks"
    if not items:
        return "the list of ranks is empty (the global set is hc.global_process_set)"
    bad = [r for r in items if isinstance(r, bool) or not isinstance(r, (int, np.integer))]
    if bad:
        return f"{bad[0]!r} is not an integer rank"
    outside = sorted({int(r) for r in items if not 0 <= int(r) < size})
    if outside:
        return f"ranks {outside} are not ranks of a world of {size}"
    if len(set(items)) != len(items):
        return f"ranks {sorted(items)} name a rank twice"
    return ""


def _agree(ranks: Any, problem: str) -> tuple[int, ...]:
    """Every rank's ``ranks`` must be one valid list: one allreduce (max of membership and problem flags, and of
    their negation for the min) over the world; ValueError on every rank otherwise, naming the ranks at fault."""
    from hvd_compress.ops.collectives import allreduce_
    from hvd_compress.ops.constants import ReduceOp

    world = runtime.world()
    size, me = world.Get_size(), world.Get_rank()
    flags = np.zeros(2 * size, dtype=np.float64)
    if problem:
        flags[size + me] = 1.0
    else:
        flags[[int(r) for r in ranks]] = 1.0
    both = np.concatenate([flags, -flags])
    allreduce_(both, op=ReduceOp.Max, name="hc.add_process_set")
    high, low = both[: 2 * size], -both[2 * size :]
    at_fault = [r for r in range(size) if high[size + r]]
    if at_fault:
        raise ValueError(f"add_process_set: {problem or f'ranks {at_fault} passed an invalid list of ranks'}"
                         " (every rank raises)")
    if (high[:size] != low[:size]).any():
        raise ValueError("add_process_set: the ranks passed different lists of ranks; every rank of the world "
                         "must call it with the same list, in the same order")
    return tuple(r for r in range(size) if high[r])


def add_process_set(process_set: Any) -> ProcessSet:
    """As ``hvd.add_process_set``: register a set (a ProcessSet or a list of world ranks) and return it. Called by
    every rank of the world, in the same order, with the same ranks (ValueError on every rank for a bad or
    differing list, or for a set already added). The set of every rank returns the global set."""
    ranks = getattr(process_set, "ranks", process_set)
    world = runtime.world()
    # After the collectives submitted before (an allreduce, then this set's communicator), on every rank alike;
    # waited for outside the lock, which a background collective may need.
    agreed = _agree(ranks, _problem(ranks, world.Get_size()))
    with _lock:
        registry = _current()
        if len(agreed) == world.Get_size():
            return global_process_set
        if agreed in registry.added:
            raise ValueError(f"add_process_set: a process set of ranks {list(agreed)} was added already")
        registry.added[agreed] = _Subset(agreed)
        ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(agreed)
        ps.ranks, ps.process_set_id = list(agreed), registry.next_id
        registry.next_id += 1
        return ps


def remove_process_set(process_set: Any) -> bool:
    """As ``hvd.remove_process_set``: forget a set that ``add_process_set`` returned (every rank calls it) and
    return True; False for the global set or a set not added."""
    ranks = getattr(process_set, "ranks", None)
    if ranks is None or not isinstance(process_set, ProcessSet) or process_set.process_set_id is None:
        return False
    runtime.get_in_order()  # its collectives submitted before have finished
    with _lock:
        subset = _current().added.pop(tuple(ranks), None)
        if subset is None:
            return False
        process_set.process_set_id = None
        if subset.core is not None:
            runtime.drop_subset(subset.core)
        return True


def _describe(process_set: Any) -> str:
    """A set in a message: its ranks, for ours and Horovod's alike (whose repr does not show them)."""
    ranks = getattr(process_set, "ranks", None)
    return f"ProcessSet(ranks={list(ranks)})" if ranks is not None else repr(process_set)


def _not_registered(process_set: Any) -> ValueError:
    return ValueError(f"{_describe(process_set)} is not registered (or was removed): call add_process_set(...) "
                      "with it on every rank first")


def _is_global(process_set: Any) -> bool:
    if process_set is None or process_set is global_process_set:
        return True
    if getattr(process_set, "process_set_id", None) == 0:  # Horovod's global set
        return True
    ranks = getattr(process_set, "ranks", None)
    return ranks is not None and sorted(ranks) == list(range(runtime.world().Get_size()))


def resolve(process_set: Any) -> Any:
    """None for the global set (None, ours or Horovod's), else the set itself, checked: a ProcessSet that was not
    added (or was removed) raises ValueError; what is no process set raises ``ProcessSetError``."""
    if _is_global(process_set):
        return None
    ranks = getattr(process_set, "ranks", None)
    if ranks is None or not hasattr(process_set, "included"):
        raise ProcessSetError(
            f"process_set={process_set!r} is not a process set: pass hc.global_process_set, or a set that "
            "hc.add_process_set(ranks) or hvd.add_process_set(ranks) returned"
        )
    if getattr(process_set, "process_set_id", None) is None:
        raise _not_registered(process_set)
    return process_set


def _core_of(process_set: Any) -> Any:
    """This member's runtime of ``process_set`` (resolved, not global); made now for a set Horovod made."""
    key = tuple(sorted(process_set.ranks))
    ours = isinstance(process_set, ProcessSet)
    with _lock:
        registry = _current()
        subset = registry.added.get(key) or (None if ours else registry.horovods.get(key))
    if subset is None and ours:
        raise _not_registered(process_set)
    if subset is None:
        runtime.get_in_order()  # outside the lock, which a background collective may need
        with _lock:
            registry = _current()
            subset = registry.horovods.get(key) or registry.horovods.setdefault(key, _Subset(key))
    return subset.core


def includes_me(process_set: Any) -> bool:
    """Whether this rank takes part in collectives over ``process_set`` (resolved; None: the world)."""
    return process_set is None or runtime.world().Get_rank() in process_set.ranks


def require_member(process_set: Any) -> Any:
    """``resolve(process_set)``; ``NotInProcessSetError`` on a rank outside the set."""
    ps = resolve(process_set)
    if not includes_me(ps):
        raise NotInProcessSetError(
            f"rank {runtime.world().Get_rank()} called a collective with {_describe(ps)}, which it is not part "
            "of: only its members call collectives with it (as in Horovod)"
        )
    return ps


@contextlib.contextmanager
def scope(process_set: Any) -> Iterator[Any]:
    """Run the collectives issued inside on ``process_set`` (anything ``resolve`` takes); yields the resolved set
    (None: the world). A rank outside the set raises ``NotInProcessSetError``."""
    ps = require_member(process_set)
    if ps is None:
        yield None
        return
    with runtime.scoped(_core_of(ps)):
        try:
            yield ps
        except CORE_ERRORS as e:  # the core numbers the set's ranks from 0: say so in the message
            if e.args and isinstance(e.args[0], str):
                e.args = (f"{e.args[0]}\n  (on {_describe(ps)}: rank k above is world rank {ps.ranks}[k])", *e.args[1:])
            raise


def broadcast_in_set(buffer: Any, root_rank: int, name: str | None, process_set: Any) -> None:
    """``broadcast_`` of ``buffer`` from world rank ``root_rank``, inside ``scope(process_set)`` (``process_set``
    resolved): a root outside the set raises ValueError on every member that names it."""
    from hvd_compress.ops.collectives import broadcast_

    root = root_in_set(process_set, root_rank)
    try:
        broadcast_(buffer, root, name)
    except CORE_ERRORS as e:
        if root < 0 <= root_rank:
            raise ValueError(f"broadcast root_rank {root_rank} is not part of {_describe(process_set)} (every member "
                             "raises)") from e
        raise


def root_in_set(process_set: Any, root_rank: int) -> int:
    """A broadcast's ``root_rank`` (a world rank, as in Horovod) as a rank of ``process_set`` (resolved); -1, which
    the core rejects on every member, when the set does not hold it."""
    if process_set is None:
        return int(root_rank)
    ranks = list(process_set.ranks)
    return ranks.index(int(root_rank)) if int(root_rank) in ranks else -1


def check_process_set(process_set: Any) -> None:
    """For what runs on the world only (the TF/Keras optimizer wrappers): accept the global set, raise
    ``ProcessSetError`` naming what works for any other."""
    if not _is_global(process_set):
        raise ProcessSetError(
            f"process_set={_describe(process_set)}: the TensorFlow/Keras optimizer wrappers (DistributedGradientTape, "
            "DistributedOptimizer) reduce over every rank only; a process set works with hc's collectives "
            "(allreduce, grouped_allreduce, allgather, broadcast) and with the PyTorch DistributedOptimizer"
        )
