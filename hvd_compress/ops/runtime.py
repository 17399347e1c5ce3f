"""The process's one connection to the C++ core: created by ``init()``, used by every collective.

The MPI world is the one ``mpirun``/``horovodrun`` started; Horovod, when it runs, shares it. The
core receives that communicator's handle from mpi4py and duplicates it, so its messages never mix
with Horovod's.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from hvd_compress import _core
from hvd_compress.ops.errors import LaunchError, NotInitializedError

DEFAULT_TIMEOUT_S = 300.0



@dataclasses.dataclass
class _Session:
    core: _core.Runtime
    world: Any  # the mpi4py communicator it was built on


_session: _Session | None = None


def _timeout_from_env() -> float:
    raw = os.environ.get("HVDC_TIMEOUT", "")
    try:
        return float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError as e:
        raise ValueError(f"HVDC_TIMEOUT={raw!r} is not a number of seconds") from e


def _launched_by_mpi() -> bool:
    markers = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "HYDRA_CONTROL_FD")
    return any(k in os.environ for k in markers)


def _launched_by_gloo() -> bool:
    return "HOROVOD_GLOO_RENDEZVOUS_ADDR" in os.environ


def init(comm: Any = None, expected_size: int | None = None, expected_rank: int | None = None) -> None:
    """Connect the core to the MPI world (or to ``comm``, an mpi4py communicator).

    ``expected_size``/``expected_rank`` are Horovod's view of the world when Horovod is running;
    a disagreement means Horovod is not on this MPI world (a Gloo launch) and is an error.
    """
    global _session
    if _launched_by_gloo() and not _launched_by_mpi():
        raise LaunchError(
            "hvd_compress needs MPI, but this job was started by horovodrun with Gloo: "
            "launch with `horovodrun --mpi ...` or `mpirun ...`"
        )
    # Imported here, not at module level: importing mpi4py.MPI initializes MPI, which must not happen
    # before the launch checks above (a Gloo launch would silently get a world of one).
    from mpi4py import MPI

    world = comm if comm is not None else MPI.COMM_WORLD
    if _session is not None and _session.world is world:
        return
    if expected_size is not None and world.Get_size() != expected_size:
        raise LaunchError(
            f"Horovod sees {expected_size} ranks but the MPI world has {world.Get_size()}: Horovod is "
            "not running over MPI (a Gloo launch?). Launch with `horovodrun --mpi ...` or `mpirun ...`"
        )
    if expected_rank is not None and world.Get_rank() != expected_rank:
        raise LaunchError(
            f"Horovod rank {expected_rank} is MPI rank {world.Get_rank()}: pass Horovod's communicator "
            "to hc.init(comm=...)"
        )
    _session = _Session(_core.Runtime(MPI._handleof(world), _timeout_from_env()), world)


def is_initialized() -> bool:
    return _session is not None


def get() -> _core.Runtime:
    """The runtime; raises ``NotInitializedError`` before ``init()``."""
    if _session is None:
        raise NotInitializedError(
            "hvd_compress is not initialized: call hvd.init() and then use hc, or call hc.init() "
            "first (in a job started by mpirun or horovodrun)"
        )
    return _session.core


def shutdown() -> None:
    """Drop the runtime (frees its duplicated communicator); ``init()`` may be called again."""
    global _session
    _session = None


def rank() -> int:
    return get().rank


def size() -> int:
    return get().size


def set_timeout(seconds: float) -> None:
    """Seconds a collective waits for all ranks to join before raising ``CommTimeoutError``."""
    get().timeout = float(seconds)


def comm_stats(reset: bool = True) -> dict[str, int]:
    """Bytes this rank sent and received in hvd_compress collectives since the last reset."""
    rt = get()
    stats = dict(rt.stats())
    if reset:
        rt.reset_stats()
    return stats
