"""Runs a worker script on n real MPI processes under a hard timeout, and loads what each rank saved.

Workers write ``rank{r}.pt`` into the directory given as their first argument; a hung or failed
job fails the calling test with the job's output, it never hangs the test run. ``Cases`` runs many cases of one
worker in one launch per rank count (this file is then the script each rank runs).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import mpi_pool

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


def keras_face_env(face: str) -> dict[str, str] | None:
    """The environment of a worker on Keras 3 (``"keras"``) or tf_keras (``"tf_keras"``); skips the calling test where
    that face is not installed."""
    import pytest

    pytest.importorskip("tensorflow")
    if face == "tf_keras":
        pytest.importorskip("tf_keras")
        return {"TF_USE_LEGACY_KERAS": "1"}
    return None


def mpi_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        # Ranks here share 2 cores with their background threads (Horovod's, ours): Open MPI's blocking waits
        # must yield, which it turns on by itself only when it counts more ranks than slots.
        OMPI_MCA_mpi_yield_when_idle="1",
        PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}",
        OMP_NUM_THREADS="1",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    if extra:
        env.update(extra)
    return env


def launch(cmd: list[str], timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in its own process group; on timeout kill the whole group and fail loudly."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"job hung: killed after {timeout:.0f} s: {' '.join(cmd)}\n{out[-6000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def mpirun(
    worker: str,
    n: int,
    out_dir: Path,
    *args: str,
    timeout: float = 180,
    env: dict[str, str] | None = None,
    check: bool = True,
    mpi_args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    cmd = ["mpirun", "--oversubscribe", "-np", str(n), "--bind-to", "none", *mpi_args]
    cmd += [sys.executable, str(WORKERS / worker), str(out_dir), *args]
    if check and not mpi_args and mpi_pool.enabled() and Path(worker).name not in OWN_LAUNCH and \
            "HVDC_HOROVOD_ENTRY" not in (env or {}):
        res = _pooled(cmd, worker, n, [str(out_dir), *args], env or {}, timeout)
    else:
        res = launch(cmd, timeout, mpi_env(env))
    if check and res.returncode != 0:
        # A pooled job's failed ranks' report (mpi_pool.Pool.failures) first: its first line names the rank, the op
        # and the step, as `pytest -x` shows it.
        failed = f"{res.stderr}\n" if res.stderr else ""
        raise AssertionError(f"{failed}{worker} on {n} ranks exited {res.returncode}:\n{res.stdout[-6000:]}")
    return res


#: Workers that need a process of their own: they end it themselves (``os._exit``, a peer that stops or leaves),
#: read their environment at import, or run the docs' blocks, each its own program. So does a job whose environment
#: sets the Horovod entry switch (HVDC_HOROVOD_ENTRY), which a process reads when it imports a face: a pool's ranks
#: route Horovod's entry points as a fresh process without it does (``mpi_pool.ProcessState.restore``).
OWN_LAUNCH = frozenset({"peer_exits.py", "config_invalid.py", "doc_blocks.py", "launch_mode.py",
                        "adasum_wait.py"})


ALONE = "(a pooled job: HVDC_TEST_POOL=0 gives each job a launch of its own, to rule out what an earlier job left)"


def _pooled(cmd: list[str], worker: str, n: int, args: list[str], env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess[str]:
    """``mpirun``'s job run on a pool of n ranks (``mpi_pool``) that has torch or TensorFlow imported already."""
    script = WORKERS / worker
    scripts = [script]
    if script.name == "mpi_harness.py":  # a ``Cases`` launch: the face is its workers'
        scripts = [WORKERS / args[1], *(WORKERS / json.loads(a)["worker"] for a in args[2:] if '"worker"' in a)]
        if any(p.name in OWN_LAUNCH for p in scripts):
            return launch(cmd, timeout, mpi_env(env))
    legacy = env.get("TF_USE_LEGACY_KERAS", os.environ.get("TF_USE_LEGACY_KERAS", "")) in ("1", "true", "True")
    key = (n, mpi_pool.face(scripts), legacy)
    pool_env = mpi_env({"PYTHONUNBUFFERED": "1", **({"TF_USE_LEGACY_KERAS": "1"} if legacy else {})})
    code, out, failures = mpi_pool.run(key, n, pool_env, script.resolve(), args, env, timeout)
    if code is None:
        raise AssertionError(f"job hung or its pool died: stopped after {timeout:.0f} s at most: {' '.join(cmd)}\n"
                             f"{out[-6000:]}\n{ALONE}")
    if code:
        out += f"\n{ALONE}"
    return subprocess.CompletedProcess(cmd, code, out, failures)


def horovodrun(
    worker: str, n: int, out_dir: Path, *args: str, mode: str = "--mpi", timeout: float = 180, check: bool = True
) -> subprocess.CompletedProcess[str]:
    cmd = ["horovodrun", "-np", str(n), mode]
    if mode == "--mpi":
        cmd += ["--mpi-args=--oversubscribe --bind-to none"]
    cmd += [sys.executable, str(WORKERS / worker), str(out_dir), *args]
    res = launch(cmd, timeout, mpi_env())
    if check and res.returncode != 0:
        raise AssertionError(f"{worker} under horovodrun on {n} ranks exited {res.returncode}:\n{res.stdout[-6000:]}")
    return res


def load_ranks(out_dir: Path, n: int) -> list[dict[str, Any]]:
    """What each rank saved, in rank order; fails if a rank saved nothing."""
    import torch  # here: this file also runs as the script of ``Cases``' launches, some without torch

    results = []
    for r in range(n):
        path = out_dir / f"rank{r}.pt"
        assert path.exists(), f"rank {r} of {n} wrote no result"
        results.append(torch.load(path, weights_only=False))
    return results


def load_pickled_ranks(out_dir: Path, n: int) -> list[dict[str, Any]]:
    """What each rank of a TensorFlow/Keras worker pickled (``rank{r}.pkl``: no torch in a TF process)."""
    results = []
    for r in range(n):
        path = out_dir / f"rank{r}.pkl"
        assert path.exists(), f"rank {r} of {n} wrote no result"
        with open(path, "rb") as f:
            results.append(pickle.load(f))
    return results


def assert_alike_and_near(runs: list[dict[str, Any]], parts: tuple[str, ...], what: str,
                          want: dict[str, Any] | None = None, tol: float = 0.0) -> None:
    """Each rank's tensors ``parts`` (one dict per rank) equal rank 0's bit for bit; with ``want`` (a one-process
    reference), rank 0's are within ``tol`` of it, element by element."""
    import torch  # here: as in load_ranks

    for part in parts:
        assert all(torch.equal(run[part], runs[0][part]) for run in runs), f"{what}: ranks differ in {part}"
        if want is not None:
            err = (runs[0][part] - want[part]).abs().max().item()
            assert err < tol, f"{what}: {part} off the reference by {err}"


#: The type names of a usage error as a worker's ``"Type: message"`` shows it: ``UsageError`` for input this rank
#: refused alone, ``RejectedInputError`` (a UsageError and a RuntimeError) for input refused on every rank.
USAGE = ("UsageError", "RejectedInputError")


def relu_fidelity_runs(out_dir: Path, n: int, task: str, steps: int, runs: list[str]) -> dict[str, Any]:
    """``workers/relu_fidelity.py`` with ``runs`` on ``task`` for ``steps`` steps at n ranks: asserts that every
    run ends with identical parameters on every rank and returns rank 0's results (run name -> its record)."""
    mpirun("relu_fidelity.py", n, out_dir, task, str(steps), ",".join(runs), timeout=300)
    ranks = load_ranks(out_dir, n)
    for run in runs:
        assert len({rk[run]["hash"] for rk in ranks}) == 1, f"{task} {run}: parameters differ across {n} ranks"
    return ranks[0]


class Cases:
    """The cases of one worker, run in one launch per rank count: a worker process spends more time importing torch
    or TensorFlow than on a case, and a worker's cases build their own objects, so one process can run them in turn.

    ``cases`` maps a rank count to its cases, each a tuple of the worker's arguments after out_dir, or a pair
    (arguments, environment) for a worker that reads os.environ (each case starts as a process of its own would:
    ``mpi_pool.ProcessState``), or a triple (arguments, environment, another worker).
    ``ranks(n, case)`` (a case as given) launches every case at n on the first request and returns what each rank
    saved for ``case``; a failed launch fails each case at n without relaunching."""

    def __init__(self, worker: str, cases: dict[int, list], base: Path, timeout_per_case: float = 60,
                 env: dict[str, str] | None = None, pickled: bool = False) -> None:
        self.worker, self.cases, self.base, self.timeout_per_case, self.env = worker, cases, base, timeout_per_case, env
        self._load = load_pickled_ranks if pickled else load_ranks  # pickled: TF workers' rank{r}.pkl
        self._done: dict[int, Path | AssertionError] = {}

    def ranks(self, n: int, case: tuple) -> list[dict[str, Any]]:
        if n not in self._done:
            out = self.base / f"{Path(self.worker).stem}_n{n}"
            out.mkdir(parents=True, exist_ok=True)
            specs = [json.dumps(dict(zip(("args", "env", "worker"), c if isinstance(c[0], tuple) else (c,),
                                         strict=False))) for c in self.cases[n]]
            try:
                mpirun("../mpi_harness.py", n, out, self.worker, *specs,
                       timeout=120 + self.timeout_per_case * len(specs), env=self.env)
                self._done[n] = out
            except AssertionError as e:
                self._done[n] = e
        if isinstance(self._done[n], AssertionError):
            raise self._done[n]
        return self._load(self._done[n] / f"case{self.cases[n].index(case)}", n)


def _run_cases(out: Path, worker: str, specs: list[str]) -> None:
    """On each rank of a ``Cases`` launch: the worker's script once per case, as its own launch would run it (the
    process put back after each), case i saving into out/case{i}."""
    fresh = mpi_pool.ProcessState()
    for i, spec in enumerate(specs):
        case = json.loads(spec)
        (out / f"case{i}").mkdir(exist_ok=True)
        try:
            mpi_pool.run_script(str(WORKERS / case.get("worker", worker)), [str(out / f"case{i}"), *case["args"]],
                                case.get("env", {}))
        except BaseException as e:  # the case's arguments name it in the pool's failure line
            e.hvdc_where = {"case": f"{i} {' '.join(case['args'])}", **getattr(e, "hvdc_where", {})}
            raise
        fresh.restore()


if __name__ == "__main__":
    _run_cases(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
