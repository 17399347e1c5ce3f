"""Birder's benchmark rows (paper 004): a Birder step against Horovod's Adam step, 1-bit Adam through the
hierarchical all-reduce against the flat one, and (``python -m hvd_compress.bench.birder_cases``, one
process) the stochastic quantizer kernel against a memcpy of the bytes it streams."""

from __future__ import annotations

import time

import numpy as np
import torch

import hvd_compress.torch as hc
from hvd_compress import _core
from hvd_compress.bench.cases import Case
from hvd_compress.bench.optimizer_cases import _stepper


def birder_cases(hvd) -> list[Case]:
    def hvd_adam(p: torch.nn.Parameter) -> torch.optim.Optimizer:
        return hvd.DistributedOptimizer(torch.optim.Adam([p], lr=1e-3), named_parameters=[("p", p)])

    def birder(hierarchical: bool):
        return lambda p: hc.DistributedOptimizer(hc.Birder([p]), named_parameters=[("p", p)], op=hc.Birder,
                                                 hierarchical=hierarchical)

    def onebit_adam(hierarchical: bool):
        return lambda p: hc.DistributedOptimizer(torch.optim.Adam([p], lr=1e-3), named_parameters=[("p", p)],
                                                 op=hc.OneBitAdam, freeze_step=1, hierarchical=hierarchical)

    return [
        Case("Birder step", _stepper(birder(False), 0), {"hvd Adam step": _stepper(hvd_adam, 1)}),
        Case("Birder hierarchical step", _stepper(birder(True), 0), {"Birder flat step": _stepper(birder(False), 0)}),
        Case("OneBitAdam flat vs hierarchical", _stepper(onebit_adam(True), 1),
             {"OneBitAdam flat step": _stepper(onebit_adam(False), 1)}),
    ]


def quantizer_rows(sizes_mb: list[float], reps: int = 7) -> list[dict]:
    """Median seconds of the worker quantizer (Philox draws) and of a memcpy of the bytes it streams
    (reads x and the error, writes the error and the bits: 12.125 bytes per element)."""
    rows = []
    for mb in sizes_mb:
        n = int(mb * (1 << 20)) // 4 // 8 * 8
        x, err = np.random.default_rng(0).uniform(-1, 1, n).astype(np.float32), np.zeros(n, np.float32)
        bits = np.zeros(n // 8, np.uint8)
        src = np.zeros(int(n * 12.125) // 4, np.float32)
        dst = np.empty_like(src)

        def median(fn) -> float:
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return float(np.median(times))

        k = median(lambda: _core.stochastic_quantize(x, err, bits, seed=1, step=1))  # noqa: B023
        c = median(lambda: np.copyto(dst, src))  # noqa: B023
        rows.append({"size_mb": mb, "numel": n, "kernel_ms": 1e3 * k, "memcpy_ms": 1e3 * c, "ratio": c / k})
    return rows


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Birder's quantizer against memcpy, this process only")
    parser.add_argument("--sizes", default="16,64")
    args = parser.parse_args()
    print(f"stochastic quantizer ({_core.stochastic_kernel_isa()}, one thread): kernel / memcpy throughput")
    for r in quantizer_rows([float(s) for s in args.sizes.split(",")]):
        print(f"| {r['size_mb']:g} MB | {r['numel']:,} | {r['kernel_ms']:.3f} ms | memcpy {r['memcpy_ms']:.3f} ms "
              f"| {r['ratio']:.2f} |")
