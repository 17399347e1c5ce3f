"""Every rank's ``per_rank_variables`` in rank 0's one ``.keras`` file (the Keras faces' twin of
``hvd_compress.torch.checkpoint``).

``opt.gather_per_rank_state()`` (or ``GatherPerRankStateCallback`` before rank 0's ``ModelCheckpoint``) is the
collective every rank makes: it keeps every rank's values of the optimizer's per-rank variables (error feedback,
local moments, Adasum's inner moments), as of this step, and rank 0's ``model.save`` then writes them beside the
optimizer's variables (``save``). ``model.save`` itself stays local: in Horovod's recipe only rank 0 calls it.
``load_model`` of that file gives each rank its own part (``load``); where only the root loaded it, the broadcast
callback hands each rank its part (``broadcast``). From a file without the parts, the broadcast callback warns on
every rank that the per-rank state was not restored."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hvd_compress import ops
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.errors import warn_per_rank_state

#: The ``.keras`` store entries of every rank's part: ``WORLD`` the world size that wrote them, ``PART + str(i)``
#: every rank's values of the i-th per-rank variable, stacked on a first dim of that size.
WORLD = "hvdc_ranks_world_size"
PART = "hvdc_ranks_"

PLAIN = (
    "{name}: the model rank {root} loaded holds only that rank's {what}, not every rank's: rank {rank} {fallback}, "
    "so this resume is not exact. For an exact resume, every rank calls opt.gather_per_rank_state() (or runs "
    "hck.callbacks.GatherPerRankStateCallback() before rank 0's ModelCheckpoint) before rank 0's model.save"
)


@dataclasses.dataclass
class Gathered:
    """Every rank's values of the per-rank variables (stacked on a first dim of ``world`` ranks) as of optimizer
    step ``iteration``."""

    iteration: int
    world: int
    values: list[np.ndarray]
    #: Whether this rank holds its own per-rank state after the load: its part of such a file, or its own file
    own: bool = False


def gather(optimizer: Any) -> Gathered:
    """The collective: every rank's values of ``optimizer.per_rank_variables`` (one allgather each)."""
    values = []
    for i, v in enumerate(optimizer.per_rank_variables):
        mine = np.ascontiguousarray(np.asarray(v.numpy())[None])
        data, _ = ops.allgather(mine, name=f"gather_per_rank_state.{i}")
        values.append(np.frombuffer(data.tobytes(), mine.dtype).reshape(ops.size(), *mine.shape[1:]).copy())
    return Gathered(int(np.asarray(optimizer.iterations.numpy())), ops.size(), values)


def save(optimizer: Any, gathered: Gathered | None, store: Any) -> None:
    """Write ``gathered`` into ``store`` where it is of this step (an older gathering would resume wrongly)."""
    if gathered is None or gathered.iteration != int(np.asarray(optimizer.iterations.numpy())):
        return
    store[WORLD] = np.asarray(gathered.world, np.int64)
    for i, value in enumerate(gathered.values):
        store[PART + str(i)] = value


def ours(key: str) -> bool:
    return key == WORLD or key.startswith(PART)


def load(optimizer: Any, store: Any) -> Gathered | None:
    """After the optimizer's own variables were loaded from ``store``: where it holds every rank's part of this
    world size, set this rank's and return them all (for the broadcast callback); else a ``Gathered`` without
    values (the file holds one rank's per-rank state only)."""
    keys = list(store.keys())
    if WORLD not in keys:
        return Gathered(-1, 0, [])
    world = int(np.asarray(store[WORLD]))
    variables = optimizer.per_rank_variables
    if world != ops.size() or sum(k != WORLD and k.startswith(PART) for k in keys) != len(variables):
        return Gathered(-1, world, [])
    values = [np.asarray(store[PART + str(i)]) for i in range(len(variables))]
    if any(v.shape != (world, *tuple(x.shape)) for v, x in zip(values, variables, strict=True)):
        return Gathered(-1, world, [])
    for v, x in zip(values, variables, strict=True):
        x.assign(v[ops.rank()])
    return Gathered(int(np.asarray(optimizer.iterations.numpy())), world, values)


def broadcast(optimizer: Any, root_rank: int, name: str) -> None:
    """In the broadcast callback, on every rank, after the other variables: where the root loaded a file with every
    rank's part, each rank takes its own; where it loaded one without, every rank warns (and the others start their
    error feedback from zero); else (no load) each keeps its own."""
    variables = optimizer.per_rank_variables
    if not variables:
        return
    engine = optimizer._hvdc
    loaded = engine.loaded
    # [what the root loaded, how many ranks hold their own state]: where every rank loaded its own file (each rank
    # resumes its own, the callback then runs in fit), nothing is lost and nothing is said.
    code = np.zeros(2, np.float64)
    if ops.rank() == root_rank and loaded is not None:
        code[0] = 1 if loaded.values else 2
    code[1] = 1 if loaded is not None and loaded.own else 0
    ops.allreduce_(code, op=ReduceOp.Sum, name=f"{name}.per_rank_kind")
    engine.loaded = None
    if code[0] == 2 and code[1] == ops.size():
        return
    if code[0] == 1:
        for i, x in enumerate(variables):
            dtype = np.dtype(getattr(x.dtype, "as_numpy_dtype", x.dtype))
            buf = (np.array(loaded.values[i], dtype) if ops.rank() == root_rank else
                   np.empty((ops.size(), *tuple(x.shape)), dtype))
            ops.broadcast_(buf.reshape(-1).view(np.uint8), root_rank, f"{name}.per_rank.{i}")  # any dtype: bytes
            x.assign(buf[ops.rank()])
    elif code[0] == 2 and ops.size() > 1:
        rank = ops.rank()
        kept = rank == root_rank or (loaded is not None and loaded.own)
        fallback = ("keeps its own (it loaded it)" if kept else
                    "starts its error feedback from zero and keeps the rest as it was built" if engine.rank_bound()
                    else "keeps its own as it was built")
        warn_per_rank_state(PLAIN.format(name=name, root=root_rank, what=engine.per_rank_what(), rank=rank,
                                   fallback=fallback), stacklevel=3)
        if not kept:
            optimizer.reset_compression_state()
