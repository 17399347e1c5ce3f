"""``python -m hvd_compress --check-build``: what is built and in use, as ``horovodrun --check-build``."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import os
import sys


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _mpi_cuda_aware() -> str:
    """What MPIX_Query_cuda_support says (Open MPI's extension), asked through the core."""
    try:
        from hvd_compress import _core

        answer = _core.mpi_cuda_support()
    except (ImportError, AttributeError):
        return "unknown (no _core)"
    return {1: "yes (MPIX_Query_cuda_support)", 0: "no (MPIX_Query_cuda_support)"}.get(
        answer, "unknown (this MPI has no MPIX_Query_cuda_support)")


def check_build() -> list[str]:
    """Lines describing the build: version, extensions, kernels, MPI, frameworks, Horovod."""
    import hvd_compress

    lines = [f"hvd_compress {hvd_compress.__version__}", "", "Extensions:"]
    try:
        from hvd_compress import _core

        info = dict(_core.build_info())
        lines.append(f"    [X] _core (CUDA: {'yes' if info.get('cuda') else 'no'})")
        forced = os.environ.get("HVDC_ONEBIT_KERNELS", "").strip() == "scalar"
        lines.append(f"    1-bit kernels: {'scalar (HVDC_ONEBIT_KERNELS)' if forced else _core.onebit_kernel_isa()}")
    except ImportError as e:
        lines.append(f"    [ ] _core: {e} (run `make build`)")
    try:
        importlib.import_module("hvd_compress._kernel_bench")
        lines.append("    [X] _kernel_bench (kernel self-check and micro-benchmark)")
    except ImportError:
        lines.append("    [ ] _kernel_bench")
    try:
        from hvd_compress import _cuda

        lines.append(f"    [X] _cuda (CUDA kernels for {' '.join(_cuda.architectures())}; "
                     f"{_cuda.device_count()} device(s) visible; device table: 1-bit allreduce, dense allreduce, "
                     "broadcast, flat Adasum; the faces refuse CUDA tensors yet)")
    except ImportError as e:
        lines.append(f"    [ ] _cuda: {e} (built only where nvcc is on PATH)")
    lines += ["", "Frameworks:"]
    for name, dist in (("PyTorch", "torch"), ("TensorFlow", "tensorflow")):
        v = _version(dist)
        lines.append(f"    [{'X' if v else ' '}] {name}{' ' + v if v else ''}")
    lines += ["", "Controllers:"]
    try:
        from mpi4py import MPI

        lib = MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()  # Open MPI ends it with a NUL
        lines.append(f"    [X] MPI: {lib} (mpi4py {_version('mpi4py')})")
        lines.append(f"    MPI CUDA-aware: {_mpi_cuda_aware()}")
    except ImportError:
        lines.append("    [ ] MPI: mpi4py is not installed")
    hv = _version("horovod")
    horovod = f"Horovod {hv} (launcher; hvd_compress needs its MPI mode)" if hv else "Horovod"
    lines.append(f"    [{'X' if hv else ' '}] {horovod}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvd_compress", description=__doc__)
    parser.add_argument("--check-build", action="store_true", help="print what is built and in use")
    args = parser.parse_args(argv)
    if not args.check_build:
        parser.print_help()
        return 2
    print("\n".join(check_build()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
