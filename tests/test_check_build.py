"""``python -m hvd_compress --check-build`` reports what is built and in use, as ``horovodrun --check-build``."""

from __future__ import annotations

import subprocess
import sys

from mpi_harness import ROOT, mpi_env

import hvd_compress
from hvd_compress import _core


def test_check_build_names_extensions_kernels_mpi_and_frameworks() -> None:
    cmd = [sys.executable, "-m", "hvd_compress", "--check-build"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=mpi_env(), cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert out.startswith(f"hvd_compress {hvd_compress.__version__}\n"), out
    assert "[X] _core (CUDA: no)" in out and f"1-bit kernels: {_core.onebit_kernel_isa()}" in out, out
    assert "[X] _kernel_bench" in out and "[X] PyTorch 2.13.0" in out, out
    assert "[X] MPI: Open MPI" in out and "[X] Horovod 0.28.1" in out, out
    # This machine's Open MPI is built without CUDA, and says so when asked.
    assert "MPI CUDA-aware: no (MPIX_Query_cuda_support)" in out, out
    assert "\0" not in out, "a NUL byte makes grep call the output binary"
    try:
        from hvd_compress import _cuda
    except ImportError:
        assert "[ ] _cuda" in out, out
    else:
        archs = " ".join(_cuda.architectures())
        want = f"[X] _cuda (CUDA kernels for {archs}; {_cuda.device_count()} device(s) visible; device table: "
        assert want in out, out


def test_module_without_flags_prints_usage_and_fails() -> None:
    cmd = [sys.executable, "-m", "hvd_compress"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=mpi_env(), cwd=ROOT, timeout=120)
    assert res.returncode == 2 and "--check-build" in res.stdout, res.stdout + res.stderr
