"""Optimizer checkpoints that hold every rank's state, for Horovod's resume recipe (rank 0 saves one file; a new
launch loads it on rank 0 and broadcasts).

Some state is each rank's own: error feedback, the moments of a rank that steps on its own gradient (Adasum), local
steps (0/1 Adam, SLAMB). Rank 0's ``state_dict()`` holds rank 0's only, so a resume from it cannot be exact.
``full_optimizer_state_dict(opt)`` is the collective that every rank calls before rank 0 saves (as FSDP's
``optim_state_dict``): rank 0's ``state_dict()`` plus, under ``RANKS_KEY``, what each rank's differs in. Found by
comparing, not by a list per op, so every op's per-rank state is in it, and only that travels and is stored.
``state_dict()`` itself stays local: in Horovod's recipe only rank 0 calls it, and a collective there would hang.

The load side: ``load`` (the wrapped optimizer's ``load_state_dict``) takes this rank's part where the file has one
(every rank loading the file resumes exactly too), and remembers what it loaded for ``broadcast``
(``broadcast_optimizer_state``, Horovod's too), which hands every rank its part. A state without the parts (a plain
``state_dict()``) broadcast from a rank that loaded it warns on every rank; a checkpoint of another world size that
this op cannot load is refused on every rank by that broadcast (or by ``step()``), not by the root's local load,
which would leave the other ranks waiting in the broadcast."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from hvd_compress import ops
from hvd_compress.ops.errors import warn_per_rank_state
from hvd_compress.torch.context import ensure_init, horovod
from hvd_compress.torch.functions import broadcast_object
from hvd_compress.torch.gather import allgather_object

#: The entry of a full optimizer state dict that holds every rank's part: {"world_size", "root", "ranks"}, where
#: ``ranks[r]`` lists the [path, value] pairs of rank r's ``state_dict()`` that differ from the root's (the rest of
#: the dict), a path being the keys and indices down to the value.
RANKS_KEY = "hvd_compress_ranks"
#: The entry of a wrapper's section of ``state_dict()`` that records the world size of the job that wrote it.
WORLD_KEY = "world_size"

PLAIN = (
    "{name}: the optimizer state rank {root} loaded holds only that rank's {what}, not every rank's (a plain "
    "state_dict()): rank {rank} {fallback}, so this resume is not exact. For an exact resume, every rank calls "
    "full = hc.full_optimizer_state_dict(opt) and rank 0 saves full; then load it on rank 0 and broadcast as here"
)
OTHER_WORLD_PARTS = (
    "{name}: the optimizer state rank {root} loaded was written by a job of {saved} ranks and this job has {size}: "
    "its ranks' {what} cannot be handed to these ranks, so rank {rank} {fallback} and this resume is not exact. "
    "To resume it exactly, launch {saved} ranks"
)
OTHER_WORLD = (
    "{why}: the checkpoint was written by a job of {saved} ranks and this job has {size}. To resume it, launch "
    "{saved} ranks. To go on with {size}, load it without hvd_compress's entries, "
    "{{k: v for k, v in state.items() if not k.startswith('hvd_compress')}}: the rest of the optimizer state is "
    "loaded and the op's own state starts afresh where the op can start mid-run (1-bit LAMB and 0/1 Adam past their "
    "freeze steps and Birder cannot: start their optimizer anew)"
)


@dataclasses.dataclass
class Loaded:
    """What a wrapper's ``load_state_dict`` loaded, kept for the ``broadcast`` that follows (until a step):
    ``full`` the state with every rank's part; ``plain`` a state with one rank's per-rank state only, and
    ``saved`` the world size that wrote it; ``error`` a refusal for every rank (another world size)."""

    full: dict[str, Any] | None = None
    plain: bool = False
    saved: int | None = None
    error: str | None = None


def local_world() -> tuple[int, int] | None:
    """(rank, size); None where no job was started (one process without ``init()``). Local: it never starts
    hvd_compress's runtime, whose set-up is a collective that rank 0's ``load_state_dict`` alone would wait in
    (Horovod's resume recipe); Horovod's rank and size serve until the wrapper's construction has started it."""
    if ops.is_initialized():
        return ops.rank(), ops.size()
    hvd = horovod()
    return None if hvd is None else (int(hvd.rank()), int(hvd.size()))


def full_optimizer_state_dict(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> dict[str, Any]:
    """A collective: every rank calls it (where rank 0 alone would call ``state_dict()``); returns, on every rank,
    ``root_rank``'s ``optimizer.state_dict()`` with every rank's per-rank state (error feedback, local moments) in
    its ``"hvd_compress_ranks"`` entry. Save it on rank 0; ``load_state_dict`` on rank 0 followed by
    ``hc.broadcast_optimizer_state`` (or ``hvd.broadcast_optimizer_state``) on every rank, or ``load_state_dict`` of
    the file on every rank, resumes every rank bit for bit. Any optimizer: one with no per-rank state gets empty
    parts. What travels is the root's state (one broadcast) and each rank's differences from it (one allgather)."""
    ensure_init()
    mine = optimizer.state_dict()
    root = broadcast_object(mine if ops.rank() == root_rank else None, root_rank, "full_optimizer_state_dict.root")
    parts = allgather_object(_differences(root, mine), "full_optimizer_state_dict.ranks")
    return {**root, RANKS_KEY: {"world_size": ops.size(), "root": root_rank, "ranks": parts}}


def _differences(root: Any, mine: Any, path: tuple[Any, ...] = (), out: list | None = None) -> list[list[Any]]:
    """[path, value] for every value of ``mine`` that differs from ``root``'s at its path (a container whose keys
    or length differ counts as one value)."""
    out = [] if out is None else out
    if isinstance(root, dict) and isinstance(mine, dict) and root.keys() == mine.keys():
        for key in root:
            _differences(root[key], mine[key], (*path, key), out)
    elif isinstance(root, list | tuple) and type(root) is type(mine) and len(root) == len(mine):
        for i, (a, b) in enumerate(zip(root, mine, strict=True)):
            _differences(a, b, (*path, i), out)
    elif not _same(root, mine):
        out.append([list(path), mine])
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and a.device == b.device and bool(torch.equal(a, b)))
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # a value without a plain truth of ==: kept as a difference
        return False


def with_part(state: dict[str, Any], part: list[list[Any]]) -> dict[str, Any]:
    """``state`` with rank's ``part`` (its [path, value] pairs) in place; ``state`` itself is not changed."""
    for path, value in part:
        state = _replaced(state, list(path), value)
    return state


def _replaced(node: Any, path: list[Any], value: Any) -> Any:
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {**node, key: _replaced(node[key], rest, value)}
    items = list(node)
    items[key] = _replaced(items[key], rest, value)
    return type(node)(items)


def load(engine: Any, state_dict: dict[str, Any], name: str, defer: bool = True) -> None:
    """The wrapped optimizer's ``load_state_dict``: this rank's part where ``state_dict`` holds every rank's, else
    the state as it is; records what it loaded (``Loaded``) for a ``broadcast``. A checkpoint of another world size
    that the op cannot load (its state depends on the world size) is, with ``defer`` and more than one rank, not
    refused here but by the broadcast on every rank (or by the next ``step()``): this may be the root's load alone
    while the others wait in the broadcast."""
    engine.loaded = None
    ranks = state_dict.get(RANKS_KEY) if isinstance(state_dict, dict) else None
    body = {k: v for k, v in state_dict.items() if k != RANKS_KEY} if ranks is not None else state_dict
    world = local_world()
    if world is None:
        engine.load_state_dict(body)
        return
    rank, size = world
    section = body.get("hvd_compress") if isinstance(body, dict) else None
    saved = ranks["world_size"] if ranks is not None else (section or {}).get(WORLD_KEY) \
        if isinstance(section, dict) else None
    if ranks is not None and saved == size:
        engine.load_state_dict(with_part(body, ranks["ranks"][rank]))
        engine.loaded = Loaded(full=state_dict)
        return
    try:
        engine.load_state_dict(body)
    except ValueError as e:
        if saved is None or saved == size:
            raise
        refusal = ValueError(OTHER_WORLD.format(saved=saved, size=size, why=e))
        if not defer or size == 1:
            raise refusal from e
        engine.loaded = Loaded(error=str(refusal))
        warn_per_rank_state(f"{refusal} (raised on every rank by broadcast_optimizer_state or the next step())",
                            stacklevel=4)
        return
    engine.loaded = Loaded(plain=True, saved=saved)


def before_step(engine: Any) -> None:
    """At ``step()``: a refused load (``Loaded.error``) raises here, once, on the ranks that loaded it, before the
    step does anything (the state is as before that load); a load is then no longer for a broadcast."""
    loaded, engine.loaded = engine.loaded, None
    if loaded is not None and loaded.error is not None:
        raise ValueError(loaded.error)


def broadcast(engine: Any, optimizer: torch.optim.Optimizer, root_rank: int, process_set: Any, name: str) -> None:
    """``broadcast_optimizer_state`` of a wrapped optimizer: root_rank's state on every rank, each rank with its own
    per-rank part where the root loaded a full state dict (exact); where it loaded a plain one, a warning on every
    rank with per-rank state, whose rank starts its error feedback from zero; where nothing was loaded since the
    last step (the start of a run, or midway), each rank keeps its own error feedback. A refused load raises on
    every rank."""
    ensure_init()
    payload = None
    if ops.rank() == root_rank:
        loaded = engine.loaded or Loaded()
        if loaded.error is not None:
            payload = {"error": loaded.error}
        elif loaded.full is not None:
            payload = {"full": loaded.full}
        else:
            payload = {"state": optimizer.state_dict(), "plain": engine.per_rank_what() if loaded.plain else None,
                       "saved": loaded.saved}
    payload = broadcast_object(payload, root_rank, "optimizer_state", process_set)
    engine.loaded = None
    if "error" in payload:
        raise ValueError(payload["error"])
    if "full" in payload:
        load(engine, payload["full"], name, defer=False)
        engine.loaded = None
        return
    what = payload["plain"]  # the root's words: every rank warns alike
    world = local_world()
    if what is not None and world is not None and world[1] > 1:
        rank = world[0]
        fallback = "keeps its own (it loaded it)" if rank == root_rank else engine.per_rank_fallback(root_rank)
        saved = payload["saved"]
        text = PLAIN if saved is None or saved == world[1] else OTHER_WORLD_PARTS
        warn_per_rank_state(text.format(name=name, root=root_rank, what=what, rank=rank, fallback=fallback,
                                        saved=saved, size=world[1]), stacklevel=3)
        if rank != root_rank:
            engine.load_broadcast_state(payload["state"])
            engine.reset_error_feedback()
            return
    engine.load_broadcast_state(payload["state"])
