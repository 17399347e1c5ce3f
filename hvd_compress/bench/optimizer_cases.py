"""Benchmark cases of whole optimizer steps: a 1-bit optimizer in its compression stage against
Horovod's ``DistributedOptimizer`` around the same torch optimizer (dense gradient allreduce, then the
step). The "buffer" is the model: one float32 parameter of the benchmark's size whose gradient is the
buffer, so both sides do the same arithmetic on the same number of elements and only the
communication differs."""

from __future__ import annotations

from collections.abc import Callable

import torch

import hvd_compress.torch as hc
from hvd_compress.bench.cases import Case

Collective = Callable[[torch.Tensor], object]


def _stepper(make: Callable[[torch.nn.Parameter], torch.optim.Optimizer], warm_steps: int) -> Collective:
    """One optimizer per buffer size, built on first use and stepped ``warm_steps`` times (past a
    1-bit optimizer's warm-up) before it is timed; each timed call sets the gradient and steps."""
    built: dict[int, tuple[torch.nn.Parameter, torch.optim.Optimizer]] = {}

    def run(buf: torch.Tensor) -> None:
        if buf.numel() not in built:
            p = torch.nn.Parameter(torch.zeros(buf.numel()))
            p.grad = torch.zeros_like(p)
            opt = make(p)
            for _ in range(warm_steps):
                p.grad.copy_(buf)
                opt.step()
            built[buf.numel()] = (p, opt)
        p, opt = built[buf.numel()]
        p.grad.copy_(buf)
        opt.step()

    return run


def optimizer_cases(hvd) -> list[Case]:
    """1-bit Adam, 0/1 Adam (a sync step) and 1-bit LAMB steps against Horovod's step of the same uncompressed rule
    (Adam, resp. ``hc.Lamb``) on the same parameter."""

    def hvd_adam(p: torch.nn.Parameter) -> torch.optim.Optimizer:
        return hvd.DistributedOptimizer(torch.optim.Adam([p], lr=1e-3), named_parameters=[("p", p)])

    def hvd_lamb(p: torch.nn.Parameter) -> torch.optim.Optimizer:
        return hvd.DistributedOptimizer(hc.Lamb([p], lr=1e-3), named_parameters=[("p", p)])

    def onebit(base: Callable[[list], torch.optim.Optimizer], op) -> Callable[[torch.nn.Parameter], object]:
        return lambda p: hc.DistributedOptimizer(base([p]), named_parameters=[("p", p)], op=op, freeze_step=1)

    def zero_one(p: torch.nn.Parameter) -> torch.optim.Optimizer:
        """0/1 Adam with every step a sync step (the sync interval clipped at 1): its costliest kind of step."""
        return hc.DistributedOptimizer(torch.optim.Adam([p], lr=1e-3), named_parameters=[("p", p)],
                                       op=hc.ZeroOneAdam, var_freeze_step=0, local_step_clipper=1)

    adam = onebit(lambda ps: torch.optim.Adam(ps, lr=1e-3), hc.OneBitAdam)
    lamb = onebit(lambda ps: hc.Lamb(ps, lr=1e-3), hc.OneBitLamb)
    return [
        Case("OneBitAdam step", _stepper(adam, 1), {"hvd Adam step": _stepper(hvd_adam, 1)}),
        Case("ZeroOneAdam sync step", _stepper(zero_one, 1), {"hvd Adam step": _stepper(hvd_adam, 1)}),
        Case("OneBitLamb step", _stepper(lamb, 1), {"hvd Lamb step": _stepper(hvd_lamb, 1)}),
    ]
