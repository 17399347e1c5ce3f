"""Long-lived MPI jobs that run worker scripts one after another, so that a test run starts Python, torch and
TensorFlow once per (rank count, face) instead of once per test: on a 2-core CI host starting them costs more than
most workers' own work.

A pool is ``mpirun -np n python mpi_pool.py DIR``; each rank reads jobs (a worker script, its arguments and
environment) from its own FIFO in DIR, runs the script as its own process would (``runpy``, ``__main__``), puts the
process back as it found it (environment, working directory, warning filters, hvd_compress's and Horovod's runtimes,
Keras's session) and prints an end line with its status on stdout and stderr. The test side reads the pool's output
up to every rank's end lines, so a job's output is the job's own. A rank whose job raises writes one line that names
the rank, the op and the step (``failure_line``) and its traceback into a file of the pool's, and prints only that line:
the test's error starts with the first failing rank's line, not with every rank's traceback. A job that fails, hangs
or kills a rank ends its pool; the next job starts a new one. ``HVDC_TEST_POOL=0`` turns pools off (a launch per job,
as without them).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

WORKERS = Path(__file__).resolve().parent / "workers"
END = "@@hvdc-pool-end"
#: Pools alive at once hold at most this many ranks, and leave this much memory free for the next pool (an idle
#: TensorFlow rank holds most of a GB); a pool is replaced after this many jobs (what jobs leave behind grows).
MAX_RANKS_ALIVE = int(os.environ.get("HVDC_TEST_POOL_RANKS", "20"))
MIN_FREE_BYTES = 6 << 30
JOBS_PER_POOL = 40

_TF = re.compile(r"\b(tensorflow|keras|tf_keras|tf_common)\b")


def enabled() -> bool:
    return os.environ.get("HVDC_TEST_POOL", "1") != "0"


def face(scripts: list[Path]) -> str:
    """``"tf"`` for a job whose scripts use TensorFlow or Keras (with which of the two Keras the pool imports in its
    key), else ``"torch"``: the two stay in separate processes, as they would in users' jobs."""
    return "tf" if any(_TF.search(p.read_text()) for p in scripts) else "torch"


class Pool:
    """One long-lived ``mpirun`` of n ranks; ``run`` hands it one job at a time."""

    def __init__(self, n: int, env: dict[str, str]) -> None:
        self.n, self.jobs, self.dir = n, 0, Path(tempfile.mkdtemp(prefix="hvdc-pool-"))
        for r in range(n):
            os.mkfifo(self.dir / f"rank{r}")
        self.log = open(self.dir / "out.log", "w+b")  # lives as long as the pool
        cmd = ["mpirun", "--oversubscribe", "-np", str(n), "--bind-to", "none", sys.executable, __file__,
               str(self.dir)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        stats["pools"] += 1
        self.fifos: list[int] = []

    def _open_fifos(self, deadline: float) -> bool:
        """Open each rank's FIFO for writing once that rank reads it (a rank opens it after Python's start)."""
        while len(self.fifos) < self.n:
            try:
                fd = os.open(self.dir / f"rank{len(self.fifos)}", os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ENXIO:
                    raise
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    return False
                time.sleep(0.02)
                continue
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            self.fifos.append(fd)
        return True

    def run(self, script: Path, args: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str]:
        """Run one job on every rank: (0, output) when every rank ended it normally, (1, output) when one raised or
        exited non-zero, (None, output) when it hung past ``timeout`` or the pool died. After any but 0 the pool
        is of no more use: ``close`` it (``failures`` first, for what its ranks reported)."""
        deadline = time.monotonic() + timeout
        self.jobs += 1
        stats["jobs"] += 1
        with open(self.dir / "out.log", "rb") as log:
            log.seek(0, os.SEEK_END)  # the job's output starts here
            out = bytearray()
            if not self._open_fifos(deadline):
                return None, self._text(out, log)
            line = json.dumps({"id": self.jobs, "script": str(script), "args": args, "env": env}) + "\n"
            for fd in self.fifos:
                os.write(fd, line.encode())
            ends = re.compile(rb"^" + re.escape(f"{END} {self.jobs} ".encode()) + rb"(\d+) (\S+)$", re.M)
            statuses: list[bytes] = []
            failed_at, lines_end = None, 0
            while True:
                new = log.read()
                if new:  # search the lines that are whole now: a read may end inside a line
                    out += new
                    start, lines_end = lines_end, out.rfind(b"\n") + 1
                    statuses += [m.group(2) for m in ends.finditer(out, start, lines_end)]
                if len(statuses) == 2 * self.n:  # each rank's end line on stdout and on stderr: all its output is in
                    return (1 if any(s != b"ok" for s in statuses) else 0), out.decode(errors="replace")
                if failed_at is None and any(s != b"ok" for s in statuses):
                    failed_at = time.monotonic()  # the other ranks may wait for it in a collective: a moment more
                now = time.monotonic()
                if self.proc.poll() is not None or now > deadline or (failed_at is not None and now > failed_at + 5):
                    return (1 if failed_at is not None else None), self._text(out, log)
                time.sleep(0.01)

    def failures(self) -> str:
        """What the ranks that failed the last job reported, the first to fail first: each one's ``failure_line``,
        then the first one's traceback; "" when none reported."""
        files = sorted(self.dir.glob(f"fail{self.jobs}.*"), key=lambda f: f.stat().st_mtime_ns)
        reports = [f.read_text(errors="replace") for f in files]
        if not reports:
            return ""
        lines = [r.partition("\n")[0] for r in reports]
        return "\n".join([lines[0], *(f"  and {line}" for line in lines[1:]), reports[0].partition("\n")[2]])

    @staticmethod
    def _text(out: bytearray, log) -> str:
        """The job's output so far, with what is still unread."""
        return (out + log.read()).decode(errors="replace")

    def close(self) -> None:
        if self.log.closed:
            return
        for fd in self.fifos:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fifos = []
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_pools: dict[tuple, Pool] = {}  # in order of last use
#: Pools started and jobs run in this test run (the test run's summary shows them).
stats = {"pools": 0, "jobs": 0}


def run(key: tuple, n: int, env: dict[str, str], script: Path, args: list[str], job_env: dict[str, str],
        timeout: float) -> tuple[int | None, str, str]:
    """Run a job on the pool of ``key`` (started, or replaced, here): its status and output as ``Pool.run``'s, and
    what its failed ranks reported (``Pool.failures``)."""
    pool = _pools.pop(key, None)
    if pool is not None and (pool.proc.poll() is not None or pool.jobs >= JOBS_PER_POOL):
        pool.close()
        pool = None
    while _pools and (sum(p.n for p in _pools.values()) + n > MAX_RANKS_ALIVE or _free_bytes() < MIN_FREE_BYTES):
        _pools.pop(_evictee()).close()
    if pool is None:
        pool = Pool(n, env)
    try:
        code, out = pool.run(script, args, job_env, timeout)
    except BaseException:  # an interrupted test run (Ctrl-C): the pool is in no list that _close_all reads
        pool.close()
        raise
    failures = ""
    if code == 0:
        _pools[key] = pool
    else:
        failures = pool.failures()
        pool.close()
    return code, out, failures


def _evictee() -> tuple:
    """The key of the pool to close to make room: a torch pool before a TensorFlow one (a TensorFlow pool takes
    several times as long to start), the least recently used of a face first."""
    return min(_pools, key=lambda key: key[1] == "tf")  # min keeps the first of equals: _pools is in order of use


def _free_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    return 1 << 62


def test_file_order(path: Path) -> int:
    """Test files that start TensorFlow run after the others, so that each face's pools serve a run of files."""
    return 1 if _TF.search(path.read_text()) else 0


@atexit.register
def _close_all() -> None:
    while _pools:
        _pools.popitem()[1].close()


# The rank's side.


class ProcessState:
    """What a fresh process would start the next worker script with, taken once and put back after each script."""

    def __init__(self) -> None:
        self.env, self.cwd, self.filters = dict(os.environ), os.getcwd(), list(warnings.filters)

    def restore(self) -> None:
        """Put the process back as far as a worker can tell: environment, working directory, warning filters (and
        the record of warnings shown), hvd_compress's and Horovod's runtimes, the routing of Horovod's entry points,
        Keras's session and dtype policy, torch's default dtype."""
        os.environ.clear()
        os.environ.update(self.env)
        os.chdir(self.cwd)
        warnings.filters[:] = self.filters
        warnings._filters_mutated()  # forgets which warnings were already shown
        entry = sys.modules.get("hvd_compress.ops.horovod_entry")
        if entry is not None and entry._switched is not None:  # a script's horovod_entry(): the environment's again
            entry._switched = None
            entry.horovod_entry(entry._enabled())
            entry._switched = None
        runtime = sys.modules.get("hvd_compress.ops.runtime")
        if runtime is not None and runtime.is_initialized():
            runtime.shutdown()  # the next script's hc.init() reads its own environment
        for name in ("horovod.torch", "horovod.tensorflow"):
            hvd = sys.modules.get(name)
            if hvd is not None and hvd.is_initialized():
                hvd.shutdown()  # an idle Horovod background thread would take CPU from the other pools' jobs
        for name in ("keras", "tf_keras"):
            keras = sys.modules.get(name)
            if keras is not None and hasattr(keras, "backend"):
                keras.backend.clear_session()
                keras.mixed_precision.set_global_policy("float32")
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_default_dtype(torch.float32)
        import gc

        gc.collect()


def run_script(script: str, args: list[str], env: dict[str, str]) -> None:
    """Run a worker script as its own launch would: ``env`` added to the environment, ``sys.argv`` its command
    line, the script as ``__main__``. The caller puts the process back after it (``ProcessState.restore``)."""
    if str(WORKERS) not in sys.path:
        sys.path.insert(0, str(WORKERS))
    os.environ.update(env)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


#: The names under which a worker's frame holds what it runs (an op's name or class, a run's name) and which step.
OP_NAMES, STEP_NAMES = ("op", "run"), ("step",)


def failure_line(exc: BaseException, rank: int, size: int) -> str:
    """``rank 1 of 3, op OneBitAdam, step 7, at worker.py:52: AssertionError: <message's first line>``.

    The op and the step come from ``exc.hvdc_where`` where a worker or ``mpi_harness.Cases`` set it (a dict, e.g.
    {"case": 2}), else from the innermost frame of a worker script that holds one of ``OP_NAMES`` (a string or a
    class) or an int in one of ``STEP_NAMES``: the loops of most workers, which need no change for it."""
    where = dict(getattr(exc, "hvdc_where", {}))
    frames, tb = [], exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    at = ""
    for frame, line in reversed(frames):
        if not frame.f_code.co_filename.startswith(str(WORKERS)):
            continue
        at = at or f"{Path(frame.f_code.co_filename).name}:{line}"
        names = frame.f_locals
        for key, wanted in (("op", OP_NAMES), ("step", STEP_NAMES)):
            value = next((names[k] for k in wanted if k in names), None)
            if key == "step" and not isinstance(value, int):
                value = None
            if key not in where and value is not None and (key == "step" or isinstance(value, str | type)):
                where[key] = value.__name__ if isinstance(value, type) else value
    parts = [f"rank {rank} of {size}", *(f"{k} {where[k]}" for k in ("case", "op", "step") if k in where)]
    if at:
        parts.append(f"at {at}")
    message = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    return f"{', '.join(parts)}: {message}"


def _report(pool_dir: Path, job: int, exc: BaseException) -> None:
    """This rank's ``failure_line`` on stderr, and with the traceback into the pool's file for the test side; the
    traceback on stderr where the file cannot be written."""
    rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    line = failure_line(exc, rank, size)
    try:
        (pool_dir / f"fail{job}.{rank}").write_text(f"{line}\n{''.join(traceback.format_exception(exc))}")
    except OSError:
        traceback.print_exc()
    print(line, file=sys.stderr)


def _serve(pool_dir: Path) -> None:
    rank = os.environ["OMPI_COMM_WORLD_RANK"]
    fresh = ProcessState()
    with open(pool_dir / f"rank{rank}") as jobs:
        for line in jobs:
            job = json.loads(line)
            try:
                run_script(job["script"], job["args"], job["env"])
                status = "ok"
            except SystemExit as e:
                status = "ok" if e.code in (None, 0) else "exited"
                if status != "ok":
                    _report(pool_dir, job["id"], e)
            except BaseException as e:
                _report(pool_dir, job["id"], e)
                status = "raised"
            try:
                fresh.restore()
            except BaseException:
                traceback.print_exc()
                status = "reset-failed"
            for stream in (sys.stdout, sys.stderr):
                stream.write(f"\n{END} {job['id']} {rank} {status}\n")
                stream.flush()
            if status != "ok":
                break


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
