"""The process's connection to the C++ core: created by ``init()``, used by every collective.

The MPI world is the one ``mpirun``/``horovodrun`` started; Horovod, when it runs, shares it. The
core receives that communicator's handle from mpi4py and duplicates it, so its messages never mix
with Horovod's. The members of a process set hold one more runtime each, over the set's ranks
(``new_subset``); collectives issued inside ``scoped(core)`` run there.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import dataclasses
import math
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from hvd_compress import _core
from hvd_compress.ops.errors import LaunchError, NotInitializedError

#: ``HVDC_TIMEOUT``'s default. Long: a peer that exited is named within seconds (its goodbye, ``_leave``), so the
#: timeout only ends a wait for a live peer that is elsewhere, and one rank may spend many minutes alone on an
#: evaluation or a checkpoint while the others wait (Horovod waits with no limit).
DEFAULT_TIMEOUT_S = 3600.0
#: ``HVDC_STALL_WARNING``'s default: Horovod's ``HOROVOD_STALL_CHECK_TIME_SECONDS``.
DEFAULT_STALL_WARNING_S = 60.0


def _bounded_int(raw: str, lo: int, hi: int, invalid: int) -> int:
    """The integer a setting's text names if it lies in [lo, hi], else ``invalid``."""
    try:
        value = int(raw)
    except ValueError:
        return invalid
    return value if lo <= value <= hi else invalid


@dataclasses.dataclass(frozen=True)
class Config:
    """The settings read once, at ``init()``, from the environment (nothing reads them per call)."""

    #: ``HVDC_TIMEOUT``: seconds a collective waits for every rank to join (``CommTimeoutError``), and the longest
    #: a transfer inside a collective every rank joined may make no progress before the job is aborted with a
    #: message (``set_timeout`` changes both). 0 or less: no limit.
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: ``HVDC_ADASUM_HIERARCHICAL``: the Adasum mode when a call does not say (not "" and not "0": on).
    adasum_hierarchical: bool = False
    #: ``HVDC_LOCAL_SIZE``: blocks of this many consecutive ranks form a node; 0: the shared-memory node.
    local_size: int = 0
    #: ``HVDC_ONEBIT_KERNELS=scalar``: the core's element-wise kernels (1-bit, stochastic) run the portable code
    #: instead of AVX2 ("" or "auto": AVX2 where the CPU has it).
    scalar_kernels: bool = False
    #: ``HVDC_ONEBIT_PIPELINE``: elements per piece of the pipelined 1-bit compressed allreduce (the core rounds it
    #: down to a multiple of 32; under 32, 0 included: never pipeline; -1, unset: the core's default). Must be the
    #: same on every rank.
    onebit_piece: int = -1
    #: Why a setting is invalid on this rank ("" if none): ``init()`` then raises on every rank.
    invalid: str = ""
    #: ``HVDC_STALL_WARNING``: while a collective waits for ranks that have not joined it, every waiting rank warns
    #: on stderr this often (seconds), naming the collective and those ranks; 0: never.
    stall_warning_s: float = DEFAULT_STALL_WARNING_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Config:
        problems = []
        timeout_s = DEFAULT_TIMEOUT_S
        raw = env.get("HVDC_TIMEOUT", "")
        try:
            timeout_s = float(raw) if raw else DEFAULT_TIMEOUT_S
        except ValueError:
            problems.append(f"HVDC_TIMEOUT={raw!r} is not a number of seconds")
        if math.isnan(timeout_s):
            problems.append(f"HVDC_TIMEOUT={raw!r} is not a number of seconds")
            timeout_s = DEFAULT_TIMEOUT_S
        local_size = 0
        raw = env.get("HVDC_LOCAL_SIZE", "")
        if raw:
            local_size = _bounded_int(raw, 1, 1 << 30, 0)
            if not local_size:
                problems.append(f"HVDC_LOCAL_SIZE={raw} is not a positive number of ranks")
        hierarchical = env.get("HVDC_ADASUM_HIERARCHICAL", "0").strip() not in ("", "0")
        kernels = env.get("HVDC_ONEBIT_KERNELS", "").strip()
        if kernels not in ("", "auto", "scalar"):
            problems.append(f"HVDC_ONEBIT_KERNELS={kernels} is not 'auto' or 'scalar'")
        onebit_piece = -1
        raw = env.get("HVDC_ONEBIT_PIPELINE", "").strip()
        if raw:
            onebit_piece = _bounded_int(raw, 0, 1 << 40, -1)
            if onebit_piece < 0:
                problems.append(f"HVDC_ONEBIT_PIPELINE={raw} is not a number of elements (0: off)")
        stall_warning_s = DEFAULT_STALL_WARNING_S
        raw = env.get("HVDC_STALL_WARNING", "").strip()
        if raw:
            try:
                stall_warning_s = float(raw)
            except ValueError:
                stall_warning_s = -1.0
            if not 0 <= stall_warning_s < math.inf:
                problems.append(f"HVDC_STALL_WARNING={raw} is not a number of seconds >= 0 (0: no warnings)")
                stall_warning_s = DEFAULT_STALL_WARNING_S
        return cls(timeout_s, hierarchical, local_size, kernels == "scalar", onebit_piece, "; ".join(problems),
                   stall_warning_s)


@dataclasses.dataclass
class _Session:
    core: _core.Runtime
    world: Any  # the mpi4py communicator it was built on
    config: Config
    # The one thread that runs asynchronous collectives, in submission order (made on first use).
    executor: concurrent.futures.ThreadPoolExecutor | None = None
    worker: int | None = None  # that thread's ident
    pending: int = 0  # collectives submitted to it and not finished
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    # The runtimes of this rank's process sets (``hvd_compress.ops.process_sets``): each over a communicator of
    # the set's ranks, counted in ``comm_stats``, told of ``set_timeout`` and of this process leaving.
    subsets: list[Any] = dataclasses.field(default_factory=list)
    # hvd_compress._cuda's device table (a capsule it owns), registered with every runtime once loaded.
    cuda_table: Any = None
    # The private test device of ``_set_test_device`` (set on process sets made later too).
    test_device: tuple[str, str, int] = ("", "", 0)


# The runtime that collectives issued by this thread run on, inside ``scoped`` (a process set's).
_scope = threading.local()


_session: _Session | None = None
_leave_registered = False


def _launched_by_mpi() -> bool:
    markers = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "HYDRA_CONTROL_FD")
    return any(k in os.environ for k in markers)


def _launched_by_gloo() -> bool:
    return "HOROVOD_GLOO_RENDEZVOUS_ADDR" in os.environ


def initialize_mpi_first() -> None:
    """In a job that an MPI launcher started, initialize MPI now (mpi4py), at the import of a face, before
    ``hvd.init()`` would: Horovod then takes it as it is, and mpi4py finalizes it after every atexit hook. Why:
    when one rank exits, Horovod shuts down on every rank, and where Horovod had initialized MPI it finalizes it
    from its background thread, under a collective that this process may still wait in (Open MPI then aborts the
    process, naming neither the rank that left nor the collective). Nothing here in a Gloo launch or outside MPI
    (``init`` explains those)."""
    if _launched_by_mpi():
        from mpi4py import MPI  # noqa: F401  (importing it initializes MPI)


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
    config = Config.from_env()
    # Collective: agrees on the settings (a bad one on any rank raises UsageError on every rank) and
    # builds the node topology once.
    core = _core.Runtime(MPI._handleof(world), config.timeout_s, config.local_size, config.invalid,
                         config.scalar_kernels, config.onebit_piece, config.stall_warning_s)
    _session = _Session(core, world, config)
    global _leave_registered
    if not _leave_registered:
        atexit.register(_leave)
        _leave_registered = True


#: Seconds a leaving process gives its goodbye messages to go out.
LEAVE_TIMEOUT_S = 2.0


def _leave() -> None:
    """At exit, before MPI is finalized (mpi4py's and Horovod's finalization run after this hook, which was
    registered after they were): tell every peer that this process is leaving. A peer that waits for it in a
    collective then raises ``PeerExitedError`` naming this rank within seconds, instead of waiting for the
    timeout and failing inside MPI's finalization with no word of which rank or collective."""
    session = _session
    if session is None:
        return
    for core in [*session.subsets, session.core]:
        try:
            core.leave(LEAVE_TIMEOUT_S)
        except Exception:
            pass


def is_initialized() -> bool:
    return _session is not None


def _current() -> _Session:
    if _session is None:
        raise NotInitializedError(
            "hvd_compress is not initialized: call hvd.init() and then use hc, or call hc.init() "
            "first (in a job started by mpirun or horovodrun)"
        )
    return _session


def get() -> _core.Runtime:
    """The runtime (a process set's inside ``scoped``); raises ``NotInitializedError`` before ``init()``."""
    session = _current()
    return getattr(_scope, "core", None) or session.core


def world() -> Any:
    """The mpi4py communicator of the world ``init()`` connected to (process sets are subsets of its ranks)."""
    return _current().world


def new_subset(comm: Any) -> _core.Runtime:
    """A runtime over ``comm`` (an mpi4py communicator of some ranks of the world; collective over them), with the
    settings ``init()`` read; it lives until ``drop_subset``. Nodes are its ranks' shared-memory nodes
    (``HVDC_LOCAL_SIZE`` counts world ranks)."""
    from mpi4py import MPI

    session = _current()
    c = session.config
    core = _core.Runtime(MPI._handleof(comm), session.core.timeout, 0, "", c.scalar_kernels, c.onebit_piece,
                         c.stall_warning_s)
    if session.cuda_table is not None:
        core._register_device(session.cuda_table)
    if session.test_device[0]:
        core._set_test_device(*session.test_device)
    with session.lock:
        session.subsets.append(core)
    return core


def cuda_device_table() -> Any:
    """Load ``hvd_compress._cuda`` and register its device table (``cpp/include/hvdc/device.h``) with every
    runtime of this process, once; what a face calls when the first CUDA tensor arrives. ImportError where the
    module was not built (no nvcc at build time) or cannot load."""
    session = _current()
    with session.lock:
        if session.cuda_table is None:
            from hvd_compress import _cuda

            table = _cuda.device_table()
            for core in [session.core, *session.subsets]:
                core._register_device(table)
            session.cuda_table = table
        return session.cuda_table


def _set_test_device(which: str, fault: str = "", index: int = 0) -> None:
    """Tests only, called alike on every rank: ``"staged"`` runs the collectives that go through the device table
    (allreduce, broadcast, the 1-bit allreduce, flat Adasum) on the staged test device
    (``cpp/include/hvdc/staged_device.h``), ``""`` on the CPU's; ``fault`` (``"to_host"``, ``"to_device"``,
    ``"wait"``) drops that operation's ``index``-th occurrence from now on."""
    session = _current()
    for core in [session.core, *session.subsets]:
        core._set_test_device(which, fault, index)
    session.test_device = (which, fault, index)


def drop_subset(core: _core.Runtime) -> None:
    """Forget a runtime of ``new_subset`` (its communicator is freed with it)."""
    session = _current()
    with session.lock:
        session.subsets.remove(core)


@contextlib.contextmanager
def scoped(core: _core.Runtime) -> Iterator[None]:
    """Collectives that this thread issues inside run on ``core`` (a process set's runtime); so do those it
    submits to the background thread (``submit``). ``rank()``/``size()`` are then the set's."""
    previous = getattr(_scope, "core", None)
    _scope.core = core
    try:
        yield
    finally:
        _scope.core = previous


def config() -> Config:
    """The settings ``init()`` read; raises ``NotInitializedError`` before ``init()``."""
    return _current().config


def shutdown() -> None:
    """Drop the runtime (frees its duplicated communicator); ``init()`` may be called again."""
    global _session
    if _session is not None and _session.executor is not None:
        _session.executor.shutdown(wait=True)
    _session = None


def executor() -> concurrent.futures.ThreadPoolExecutor:
    """The thread that runs this process's asynchronous collectives one at a time, in submission order
    (so every rank issues them in the order it submitted them)."""
    session = _session
    if session is None:
        get()  # raises NotInitializedError
    if session.executor is None:

        def remember_worker() -> None:
            session.worker = threading.get_ident()

        session.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="hvdc-async", initializer=remember_worker
        )
    return session.executor


def submit(fn: Any, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
    """Run ``fn(*args, **kwargs)`` (collectives) on the background thread, after what was submitted before."""
    session = _current()
    pool = executor()
    with session.lock:
        session.pending += 1

    def done(_: concurrent.futures.Future) -> None:
        with session.lock:
            session.pending -= 1

    core = getattr(_scope, "core", None)
    if core is not None:  # the submitter's process set, in the background thread too
        fn = _in_scope(core, fn)
    future = pool.submit(fn, *args, **kwargs)
    future.add_done_callback(done)
    return future


def _in_scope(core: _core.Runtime, fn: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        with scoped(core):
            return fn(*args, **kwargs)

    return run


def get_in_order() -> _core.Runtime:
    """The runtime, for a collective issued now from this thread: first waits until the background collectives
    submitted so far have run. Every rank submits those in one order (bucket order, submission order), so a
    collective of the main thread (a loss averaged between ``backward()`` and ``step()``, an autograd allreduce
    inside backward) then meets the same collective on every rank instead of racing the background thread."""
    session = _current()
    if session.pending and threading.get_ident() != session.worker:
        executor().submit(lambda: None).result()  # one worker, FIFO: everything before it has finished
    return getattr(_scope, "core", None) or session.core


def rank() -> int:
    return get().rank


def size() -> int:
    return get().size


def set_timeout(seconds: float) -> None:
    """Seconds a collective waits for all ranks to join before raising ``CommTimeoutError``; also the longest a
    transfer inside a collective that every rank joined may wait before the job is aborted (a stopped peer or a
    stuck MPI transport: its requests can be neither cancelled nor abandoned, so no exception can leave it)."""
    session = _current()
    for core in [session.core, *session.subsets]:
        core.timeout = float(seconds)


def comm_stats(reset: bool = True) -> dict[str, int]:
    """Bytes this rank sent and received in all hvd_compress collectives of this process (every thread)
    since the last reset, and the number of calls. Per-call counts: ``hvd_compress.ops.traffic``."""
    session = _current()
    stats: dict[str, int] = {}
    for core in [session.core, *session.subsets]:
        for key, value in dict(core.stats()).items():
            stats[key] = stats.get(key, 0) + int(value)
        if reset:
            core.reset_stats()
    return stats


def kernel_isa() -> str:
    """What the core's element-wise kernels run in this process: "avx2" or "scalar" (``HVDC_ONEBIT_KERNELS``)."""
    return "scalar" if get().scalar_kernels else _core.onebit_kernel_isa()
