"""One-rank timing of a 1-bit optimizer's compression-stage step (1-bit LAMB by default, ``--op OneBitAdam``)
on the end-to-end benchmark's MLP (4.8M float32 parameters): median ms of ``step()`` and of its arithmetic
(``compressed``, the algorithm's update of lines 12-21 of 001 / 12-13 of 003; ``local_momentum``, line 6 of
both) over 20 steps, with the core's fused passes or with the backend's ops (``--backend`` forces those, the
local momentum of line 6 included).

    OMP_NUM_THREADS=1 mpirun -np 1 python3 tools/bench_onebit_lamb_step.py [--op OneBitAdam] [--adamw] [--backend]

It prints its figures and writes no result file, so docs/benchmarks.md holds none of them.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch

import hvd_compress.torch as hc
from hvd_compress.algorithms import onebit
from hvd_compress.bench.models import Mlp
from hvd_compress.ops import onebit_adam_kernels, onebit_lamb_kernels

ALGORITHMS = {"OneBitLamb": ("onebit_lamb", "OneBitLamb"), "OneBitAdam": ("onebit_adam", "OneBitAdam")}


def _optimizer(op: str, adamw: bool, params) -> torch.optim.Optimizer:
    if op == "OneBitLamb":
        return hc.Lamb(params, lr=1e-3, weight_decay=0.01)
    if adamw:
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    return torch.optim.Adam(params, lr=1e-3, weight_decay=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--op", choices=sorted(ALGORITHMS), default="OneBitLamb")
    parser.add_argument("--adamw", action="store_true", help="OneBitAdam over AdamW (decoupled weight decay)")
    parser.add_argument("--backend", action="store_true", help="the backend's ops, not the fused passes")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    hc.init()
    torch.manual_seed(0)
    module_name, class_name = ALGORITHMS[args.op]
    module = importlib.import_module(f"hvd_compress.algorithms.{module_name}")
    cls = getattr(module, class_name)
    if args.backend:  # every fused pass of the 1-bit optimizers, the local momentum of line 6 included
        for ops_module in (onebit_lamb_kernels, onebit_adam_kernels):
            ops_module.accepts = lambda *tensors: False
    spent: dict[str, list[float]] = {"compressed": [], "local_momentum": []}

    def timing(owner: type, name: str) -> None:
        method = getattr(owner, name)

        def timed(self, *a, **k):
            t0 = time.perf_counter()
            method(self, *a, **k)
            spent[name].append(time.perf_counter() - t0)

        setattr(owner, name, timed)

    timing(cls, "compressed")
    timing(onebit.OneBitAlgorithm, "local_momentum")  # line 6, on the step's thread without overlap
    model = Mlp()
    numel = sum(p.numel() for p in model.parameters())
    freeze = 2
    opt = hc.DistributedOptimizer(_optimizer(args.op, args.adamw, model.parameters()),
                                  named_parameters=model.named_parameters(), op=getattr(hc, args.op),
                                  freeze_step=freeze)
    steps: list[float] = []
    for t in range(freeze + 2 + args.steps):
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-2
        t0 = time.perf_counter()
        opt.step()
        if t >= freeze + 2:  # two compressed steps to warm the caches
            steps.append(time.perf_counter() - t0)
    ms = 1e3 * statistics.median(steps)
    arith = {name: 1e3 * statistics.median(times[-args.steps:]) for name, times in spent.items()}
    path = "backend ops" if args.backend else "fused passes"
    rule = f"{args.op}{' (AdamW)' if args.adamw else ''}"
    print(f"{rule} compression stage, {numel} float32 params, 1 rank, {path}: step() median {ms:.1f} ms, "
          f"compressed() median {arith['compressed']:.1f} ms, local_momentum() median {arith['local_momentum']:.1f} ms "
          f"({args.steps} steps)")


if __name__ == "__main__":
    main()
