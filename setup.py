"""Build of hvd_compress and its C++ core, hvd_compress._core (nanobind, MPI).

A second, small extension, hvd_compress._kernel_bench, holds the 1-bit kernels' self-check and
micro-benchmark (cpp/bench), so that the shipped _core carries no test or benchmark hook.

A third, hvd_compress._cuda, holds the CUDA kernels (cpp/cuda): built when nvcc is on PATH and
HVDC_WITH_CUDA is not "0", with the flags of cpp/cuda/nvcc_flags (which `make cudacheck` uses
too). _core never links the CUDA runtime: the CPU build needs neither a GPU nor the toolkit.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nanobind
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def mpi_flags() -> tuple[list[str], list[str], list[str]]:
    """Include dirs, library dirs and libraries of the system MPI, asked from its compiler wrapper."""

    def show(what: str) -> list[str]:
        out = subprocess.run(["mpicc", f"--showme:{what}"], check=True, capture_output=True, text=True)
        return out.stdout.split()

    if shutil.which("mpicc") is None:
        raise SystemExit("mpicc not found: install Open MPI (apt-get install openmpi-bin libopenmpi-dev)")
    return show("incdirs"), show("libdirs"), show("libs")


def cuda_enabled() -> bool:
    return os.environ.get("HVDC_WITH_CUDA", "1") != "0" and shutil.which("nvcc") is not None


def nvcc_flags() -> list[str]:
    with open(os.path.join(ROOT, "cpp", "cuda", "nvcc_flags")) as f:
        return f.read().split()


def cuda_home() -> str:
    """The toolkit's root: CUDA_HOME or CUDA_PATH, else the TOP that nvcc itself reports (nvcc on PATH may be a
    wrapper script or a link, so its own location says nothing)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    out = subprocess.run(["nvcc", "-dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                         check=True, capture_output=True, text=True).stderr
    for line in out.splitlines():
        if line.startswith("#$ TOP="):
            return os.path.normpath(line.split("=", 1)[1].strip())
    raise SystemExit("nvcc does not say where the CUDA toolkit is: set CUDA_HOME, or HVDC_WITH_CUDA=0")


def cuda_architectures(flags: list[str]) -> list[str]:
    """sm_XX for each machine code and compute_XX for each PTX that the -gencode flags ask for."""
    return [g.split("code=", 1)[1] for g in flags if g.startswith("arch=")]


def parallel_compile(compiler, jobs: int):
    """compiler.compile with the sources of one extension compiled `jobs` at a time (HVDC_BUILD_JOBS: setuptools
    compiles them one after the other, which a GPU machine's 16 cores and a one-call check cannot afford)."""
    from concurrent.futures import ThreadPoolExecutor

    def compile_all(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                    extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, objects))  # list(): an exception in any job is raised here
        return objects

    return compile_all


class BuildExt(build_ext):
    """build_ext that hands .cu files to nvcc and everything else to the C++ compiler."""

    def build_extensions(self) -> None:
        compiler = self.compiler
        original = compiler._compile

        def compile_one(obj, src, ext, cc_args, extra_postargs, pp_opts):
            if src.endswith(".cu"):
                nvcc_args = [*nvcc_flags(), "-c", src, "-o", obj]
                nvcc_args += [a for a in pp_opts if a.startswith(("-I", "-D"))]
                self.spawn(["nvcc", *nvcc_args])
            else:
                original(obj, src, ext, cc_args, extra_postargs, pp_opts)

        compiler.src_extensions.append(".cu")
        compiler._compile = compile_one
        jobs = int(os.environ.get("HVDC_BUILD_JOBS", "1"))
        if jobs > 1:
            compiler.compile = parallel_compile(compiler, jobs)
        # One extension after the other, each into a folder of its own (build_extension): both
        # compile nanobind's nb_combined.cpp and cpp/src/onebit_kernels.cc, and one object path per
        # source would be shared, and raced for under -j.
        self.parallel = False
        super().build_extensions()

    def build_extension(self, ext: Extension) -> None:
        shared_temp = self.build_temp
        self.build_temp = os.path.join(shared_temp, ext.name)
        try:
            super().build_extension(ext)
        finally:
            self.build_temp = shared_temp


NANOBIND_SOURCE = os.path.join(nanobind.source_dir(), "nb_combined.cpp")
NANOBIND_INCLUDES = [
    nanobind.include_dir(),
    os.path.join(os.path.dirname(nanobind.include_dir()), "ext/robin_map/include"),
]
# No contraction (specs/gpu.md): a * b + c rounds twice, as in the NumPy reference and in the CUDA
# kernels (nvcc -fmad=false); the one-rounding multiply-adds are written as fma.
COMPILE_ARGS = ["-std=c++17", "-O3", "-fvisibility=hidden", "-fno-strict-aliasing", "-ffp-contract=off", "-Wall",
                "-Wno-psabi"]


def core_extension() -> Extension:
    inc, libdirs, libs = mpi_flags()
    sources = [*sorted(glob.glob("cpp/src/*.cc")), NANOBIND_SOURCE]
    macros = [("OMPI_SKIP_MPICXX", "1"), ("NDEBUG", "1")]
    return Extension(
        "hvd_compress._core",
        sources=sources,
        include_dirs=["cpp/include", *NANOBIND_INCLUDES, *inc],
        library_dirs=libdirs,
        runtime_library_dirs=libdirs,
        libraries=libs,
        define_macros=macros,
        extra_compile_args=COMPILE_ARGS,
        language="c++",
    )


def kernel_bench_extension() -> Extension:
    """The 1-bit kernels and Birder's stochastic kernels, with the benchmarks and the 1-bit self-check
    (cpp/bench) and their bindings; no MPI."""
    sources = ["cpp/src/onebit_kernels.cc", "cpp/src/stochastic_kernels.cc", "cpp/src/philox.cc",
               *sorted(glob.glob("cpp/bench/*.cc")), NANOBIND_SOURCE]
    return Extension(
        "hvd_compress._kernel_bench",
        sources=sources,
        include_dirs=["cpp/include", *NANOBIND_INCLUDES],
        define_macros=[("NDEBUG", "1")],
        extra_compile_args=COMPILE_ARGS,
        language="c++",
    )


def cuda_extension() -> Extension:
    """The CUDA kernels and their module; the CUDA runtime linked statically, so that the module needs only
    the driver where it is imported."""
    home = cuda_home()
    archs = " ".join(cuda_architectures(nvcc_flags()))
    return Extension(
        "hvd_compress._cuda",
        sources=[*sorted(glob.glob("cpp/cuda/*.cu")), *sorted(glob.glob("cpp/cuda/*.cc")), NANOBIND_SOURCE],
        include_dirs=["cpp/include", *NANOBIND_INCLUDES, os.path.join(home, "include")],
        library_dirs=[os.path.join(home, "lib64")],
        libraries=["cudart_static", "dl", "rt", "pthread"],
        define_macros=[("NDEBUG", "1"), ("HVDC_CUDA_ARCHS", f'"{archs}"')],
        extra_compile_args=COMPILE_ARGS,
        language="c++",
    )


def extensions() -> list[Extension]:
    exts = [core_extension(), kernel_bench_extension()]
    if cuda_enabled() and glob.glob("cpp/cuda/*.cu"):
        exts.append(cuda_extension())
    return exts


# Metadata and build requirements are in pyproject.toml (so `pip install .` / `pip wheel .` work in a clean
# virtual environment); this file adds the extensions.
setup(
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
