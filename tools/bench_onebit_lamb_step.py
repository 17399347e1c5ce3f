"""One-rank timing of 1-bit LAMB's compression-stage step on the end-to-end benchmark's MLP (4.8M float32
parameters): median ms of ``step()`` and of its arithmetic (``OneBitLamb.compressed``) over 20 steps, with the
core's fused passes and, where they exist, with the backend's ops (``--backend`` forces those).

    OMP_NUM_THREADS=1 mpirun -np 1 python3 tools/bench_onebit_lamb_step.py [--backend]

Measured (2-core shared machine, bench lock held, two runs each): compressed() 21.4-25.9 ms before (main),
21.8-22.0 ms with ``--backend``, 5.5-5.6 ms fused; step() 86.7-88.8 ms before, 39.3-44.1 ms fused.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import hvd_compress.torch as hc
from hvd_compress.algorithms import onebit_lamb
from hvd_compress.bench.models import Mlp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", action="store_true", help="the backend's ops, not the fused passes")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    hc.init()
    torch.manual_seed(0)
    if args.backend and hasattr(onebit_lamb, "fused_ops"):
        onebit_lamb.fused_ops.accepts = lambda *tensors: False
    spent: list[float] = []
    compressed = onebit_lamb.OneBitLamb.compressed

    def timed(self, *a, **k):
        t0 = time.perf_counter()
        compressed(self, *a, **k)
        spent.append(time.perf_counter() - t0)

    onebit_lamb.OneBitLamb.compressed = timed
    model = Mlp()
    numel = sum(p.numel() for p in model.parameters())
    freeze = 2
    opt = hc.DistributedOptimizer(hc.Lamb(model.parameters(), lr=1e-3, weight_decay=0.01),
                                  named_parameters=model.named_parameters(), op=hc.OneBitLamb, freeze_step=freeze)
    steps: list[float] = []
    for t in range(freeze + 2 + args.steps):
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-2
        t0 = time.perf_counter()
        opt.step()
        if t >= freeze + 2:  # two compressed steps to warm the caches
            steps.append(time.perf_counter() - t0)
    ms = 1e3 * statistics.median(steps)
    arith = 1e3 * statistics.median(spent[-args.steps:])
    path = "backend ops" if args.backend or not hasattr(onebit_lamb, "fused_ops") else "fused passes"
    print(f"OneBitLamb compression stage, {numel} float32 params, 1 rank, {path}: step() median {ms:.1f} ms, "
          f"compressed() median {arith:.1f} ms ({args.steps} steps)")


if __name__ == "__main__":
    main()
