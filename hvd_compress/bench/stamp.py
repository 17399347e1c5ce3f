"""Where a benchmark result came from: the commit and the machine it ran on, the network emulation, the ranks,
the date and the command. Every bench entry point puts ``stamp(...)`` into its JSON, and docs/benchmarks.md
prints it above each table (hvd_compress/bench/report.py), so a figure always names what produced it.

The machine is described by what decides the figures (CPU model, cores, memory), never by its hostname.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Settings that tools/bench.sh and tools/slow_link.sh pass to every rank and that change the figures.
SETTINGS = ("OMPI_MCA_mpi_yield_when_idle", "OMPI_MCA_btl", "HOROVOD_CPU_OPERATIONS", "HVDC_LOCAL_SIZE")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], check=False, capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source() -> dict:
    """The commit of this checkout, and whether its code differs from it (changes under docs/, where results are
    saved, do not count); ``None`` for both outside a git checkout (an installed package)."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--", ".", ":!docs")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def machine() -> dict:
    return {"cpu": _cpu_model(), "arch": platform.machine(), "cores": os.cpu_count(), "memory_gib": _memory_gib()}


def _command(argv: list[str]) -> list[str]:
    """argv without ``--out DIR`` (a local path that says nothing about the measurement)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            out.append(a)
    return out


def stamp(kind: str, module: str, ranks: int) -> dict:
    """The stamp of a result of ``kind`` (collectives, e2e, keras, kernels) measured now by ``module`` on ``ranks``
    ranks. The network is what tools/bench.sh, slow_link.sh or two_nodes.sh set in ``HVDC_BENCH_NET`` ("" is
    shared memory); ``HVDC_BENCH_ENV`` the extra settings of ``BENCH_ENV``."""
    return {
        "kind": kind,
        **source(),
        "machine": machine(),
        "net": os.environ.get("HVDC_BENCH_NET", ""),
        "ranks": ranks,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": ["python", "-m", module, *_command(sys.argv[1:])],
        "settings": {k: os.environ[k] for k in SETTINGS if k in os.environ},
        "bench_env": os.environ.get("HVDC_BENCH_ENV", ""),
        # Other work on the machine during the run (the 15-minute figure spans most runs): a shared machine's
        # figures are read with it.
        "loadavg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }
