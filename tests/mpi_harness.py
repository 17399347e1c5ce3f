"""Runs a worker script on n real MPI processes under a hard timeout, and loads what each rank saved.

Workers write ``rank{r}.pt`` into the directory given as their first argument; a hung or failed
job fails the calling test with the job's output, it never hangs the test run.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


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
    res = launch(cmd, timeout, mpi_env(env))
    if check and res.returncode != 0:
        raise AssertionError(f"{worker} on {n} ranks exited {res.returncode}:\n{res.stdout[-6000:]}")
    return res


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
