"""Long-lived MPI jobs that run worker scripts one after another, so that a test run starts Python, torch and
TensorFlow once per (rank count, face) instead of once per test: on a 2-core CI host starting them costs more than
most workers' own work.

A pool is ``mpirun -np n python mpi_pool.py DIR``; each rank reads jobs (a worker script, its arguments and
environment) from its own FIFO in DIR, runs the script as its own process would (``runpy``, ``__main__``), puts the
process back as it found it (environment, working directory, warning filters, hvd_compress's and Horovod's runtimes,
Keras's session) and prints an end line with its status on stdout and stderr. The test side reads the pool's output
up to every rank's end lines, so a job's output is the job's own. A job that fails, hangs or kills a rank ends its
pool; the next job starts a new one. ``HVDC_TEST_POOL=0`` turns pools off (a launch per job, as without them).
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
        is of no more use: ``close`` it."""
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
        timeout: float) -> tuple[int | None, str]:
    """Run a job on the pool of ``key`` (started, or replaced, here)."""
    pool = _pools.pop(key, None)
    if pool is not None and (pool.proc.poll() is not None or pool.jobs >= JOBS_PER_POOL):
        pool.close()
        pool = None
    while _pools and (sum(p.n for p in _pools.values()) + n > MAX_RANKS_ALIVE or _free_bytes() < MIN_FREE_BYTES):
        _pools.pop(next(iter(_pools))).close()
    if pool is None:
        pool = Pool(n, env)
    code, out = pool.run(script, args, job_env, timeout)
    if code == 0:
        _pools[key] = pool
    else:
        pool.close()
    return code, out


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
                    print(f"SystemExit: {e.code}", file=sys.stderr)
            except BaseException:
                traceback.print_exc()
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
