"""SLAMB's benchmark rows: the whole SLAMB step against the dense LAMB step (Horovod's and ours) on the same
parameter, and the mask kernels (mask generation, gather, scatter; cpp/src/masks.cc) against a memory copy.

The SLAMB parameter is 2-D (numel x 1) so that the mask acts on it (1-D tensors are always synchronized, spec
step 2). Bytes: the runner reports ``bytes_sent_per_call`` of ours; with ``--min-reps``/``--max-reps`` of at
least ``sync_interval`` the dense parameter average every H steps is in that mean.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

import hvd_compress.torch as hc
from hvd_compress import _core
from hvd_compress.bench.cases import Case

MB = 1 << 20


def _stepper(make: Callable[[torch.nn.Parameter], torch.optim.Optimizer],
             two_d: bool) -> Callable[[torch.Tensor], None]:
    built: dict[int, tuple[torch.nn.Parameter, torch.optim.Optimizer]] = {}

    def run(buf: torch.Tensor) -> None:
        if buf.numel() not in built:
            p = torch.nn.Parameter(torch.zeros((buf.numel(), 1) if two_d else (buf.numel(),)))
            p.grad = torch.zeros_like(p)
            built[buf.numel()] = (p, make(p))
        p, opt = built[buf.numel()]
        p.grad.copy_(buf.view_as(p))
        opt.step()

    return run


def slamb_cases(hvd) -> list[Case]:
    """SLAMB (k = 0.1, H = 100) step against the dense hc.Lamb step behind Horovod's gradient average (not an hc
    one: the runner's byte count is of every hc call, so an hc baseline would be counted as ours), and against the
    local hc.Lamb step without communication (the floor)."""

    def slamb(p: torch.nn.Parameter) -> torch.optim.Optimizer:
        return hc.DistributedOptimizer(hc.Lamb([p], lr=1e-3), named_parameters=[("p", p)], op=hc.SLAMB,
                                       compress_ratio=0.1, sync_interval=100, seed=1)

    def hvd_lamb(p: torch.nn.Parameter) -> torch.optim.Optimizer:
        return hvd.DistributedOptimizer(hc.Lamb([p], lr=1e-3), named_parameters=[("p", p)])

    # The floor: the same hc.Lamb step with no communication at all. SLAMB does at least LAMB's arithmetic on
    # every element, so no SLAMB step is faster than this, and (hvd Lamb step / floor) bounds its speed-up.
    return [Case("SLAMB step", _stepper(slamb, True),
                 {"hvd Lamb step": _stepper(hvd_lamb, True),
                  "floor: local Lamb step": _stepper(lambda p: hc.Lamb([p], lr=1e-3), True)})]


def _median_s(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _size_rows(mb: float, reps: int, ratio: float) -> list[dict]:
    numel = int(mb * MB) // 4
    src = np.random.default_rng(0).standard_normal(numel, dtype=np.float32)
    dst, copy_dst = np.empty_like(src), np.empty_like(src)
    mask, drawn = np.zeros(numel, dtype=bool), np.zeros(numel, dtype=bool)
    _core.random_mask(mask, ratio, 1, 0, 0, [])  # builds and keeps the permutation of (numel, seed)
    compact = np.empty(int(mask.sum()), dtype=np.float32)
    # The mask kernels write `drawn`, so that gather and scatter run on `mask`, whose count sizes `compact`: a
    # Bernoulli draw can select more.
    kernels = {
        "mask (cyclic)": lambda: _core.random_mask(drawn, ratio, 1, 3, 0, []),
        "mask (bernoulli)": lambda: _core.random_mask(drawn, ratio, 1, 3, 1, []),
        "gather": lambda: _core.mask_gather(src, mask, compact),
        "scatter": lambda: _core.mask_scatter(compact, mask, dst),
    }
    memcpy = _median_s(lambda: np.copyto(copy_dst, src), reps)
    rows = []
    for name, fn in kernels.items():
        k = _median_s(fn, reps)
        rows.append({"kernel": name, "size_mb": mb, "numel": numel, "kernel_ms": k * 1e3,
                     "memcpy_ms": memcpy * 1e3, "ratio": memcpy / k})
    return rows


def mask_kernel_rows(sizes_mb: list[float], reps: int = 9, ratio: float = 0.1) -> list[dict]:
    """One row per (size, kernel) on float32 buffers of ``size`` MB: the kernel's median time and that of a
    memcpy (numpy copyto between distinct buffers) of the float32 buffer's bytes; ratio = memcpy / kernel."""
    return [row for mb in sizes_mb for row in _size_rows(mb, reps, ratio)]
