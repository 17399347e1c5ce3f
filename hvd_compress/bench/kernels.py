"""Single-thread throughput of the 1-bit kernels (cpp/src/onebit_kernels.cc) and of Birder's stochastic quantizer
(cpp/src/stochastic_kernels.cc) against a plain memory copy.

For each kernel K, ``_kernel_bench.onebit_kernel_bench`` / ``stochastic_kernel_bench`` (an extension of its own,
not the shipped ``_core``; cpp/include/hvdc/onebit_kernel_bench.h, stochastic_kernel_bench.h) times K on one chunk
and, right after it in every repetition, ``memcpy`` between two distinct buffers of the bytes K streams element by
element. Times are the thread's CPU time (cpp/include/hvdc/kernel_timing.h), so that other jobs on a shared machine
do not count. ``ratio = memcpy time / kernel time`` (1.0 = as fast as copying those bytes once). Sizes are the
buffer's bytes in its dtype. The rows, what each kernel does and which bytes its memcpy copies: docs/benchmarks.md,
"Kernels".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hvd_compress import _kernel_bench
from hvd_compress.bench import tables
from hvd_compress.bench.stamp import stamp

MB = 1 << 20
KERNELS = (
    "compress",
    "compress_signs",
    "accumulate",
    "server_compress",
    "server_fused",
    "decompress",
    "error_decompress",
)
STOCHASTIC_KERNELS = (
    "stochastic_quantize",
    "stochastic_quantize_moments",
    "stochastic_server",
    "sign_unpack",
    "philox_fill",
)
_DTYPE_SIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def _rows(t: dict, kernels: tuple[str, ...], dtype: str, mb: float) -> list[dict]:
    return [
        {
            "kernel": kernel,
            "dtype": dtype,
            "size_mb": mb,
            "numel": int(t["numel"]),
            "kernel_ms": t[kernel] * 1e3,
            "memcpy_ms": t["memcpy_" + kernel] * 1e3,
            "ratio": t["memcpy_" + kernel] / t[kernel],
        }
        for kernel in kernels
    ]


def kernel_rows(sizes_mb: list[float], dtypes: list[str], reps: int = 9) -> list[dict]:
    """One row per (dtype, size, kernel), measured in this process on one thread; Birder's kernels (float32)
    after the 1-bit ones."""
    rows = []
    for dtype in dtypes:
        for mb in sizes_mb:
            numel = int(mb * MB) // _DTYPE_SIZE[dtype]
            rows += _rows(_kernel_bench.onebit_kernel_bench(numel, dtype, reps), KERNELS, dtype, mb)
    for mb in sizes_mb:
        rows += _rows(_kernel_bench.stochastic_kernel_bench(int(mb * MB) // 4, reps), STOCHASTIC_KERNELS, "float32", mb)
    return rows


def run_kernels(comm, sizes_mb: list[float], dtypes: list[str], reps: int = 9) -> list[dict]:
    """Rank 0 measures while the other ranks wait without spinning (so they leave it a core); [] elsewhere."""
    rows = kernel_rows(sizes_mb, dtypes, reps) if comm.rank == 0 else []
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.005)
    return rows


def kernel_isa() -> dict:
    """The code path (portable, avx2, ...) each kernel family of this build runs on this machine."""
    return {"onebit": _kernel_bench.onebit_kernel_isa(), "stochastic": _kernel_bench.stochastic_kernel_isa()}


def main() -> None:
    """This process only, no MPI: prints the table and writes ``kernels_<label>.json``/``.md`` under ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,4,16,64", help="buffer sizes in MB")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--out", default="bench_results")
    parser.add_argument("--label", default="local")
    args = parser.parse_args()
    rows = kernel_rows([float(s) for s in args.sizes.split(",")], args.dtypes.split(","), args.reps)
    result = {"stamp": stamp("kernels", "hvd_compress.bench.kernels", 1), "label": args.label, "kernels": rows,
              "kernel_isa": kernel_isa()}
    table = tables.kernels(rows, result["kernel_isa"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"kernels_{args.label}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(table)
    print(table)
    print(f"[kernels] wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()
