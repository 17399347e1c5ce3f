"""Birder's benchmark rows (paper 004): a Birder step against Horovod's Adam step, 1-bit Adam through the
hierarchical all-reduce against the flat one. The stochastic quantizer against a memcpy of the bytes it
streams is a kernel row (hvd_compress/bench/kernels.py, ``python -m hvd_compress.bench.kernels``)."""

from __future__ import annotations

import torch

import hvd_compress.torch as hc
from hvd_compress.bench.cases import Case, horovod_average
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
        # Horovod Average twice: its optimizer step (the dense allreduce of the gradient, then Adam), and the
        # allreduce alone.
        # The floor: hc.Birder's own rule stepped locally, no communication (the 1-bit step does at least its
        # arithmetic on every element, so it bounds the speed-up over Horovod).
        Case("Birder step", _stepper(birder(False), 0),
             {"hvd Adam step": _stepper(hvd_adam, 1), "hvd Average": horovod_average(hvd),
              "floor: local Birder rule": _stepper(lambda p: hc.Birder([p]), 0)}),
        Case("Birder hierarchical step", _stepper(birder(True), 0),
             {"Birder flat step": _stepper(birder(False), 0), "hvd Adam step": _stepper(hvd_adam, 1)}),
        Case("OneBitAdam flat vs hierarchical", _stepper(onebit_adam(True), 1),
             {"OneBitAdam flat step": _stepper(onebit_adam(False), 1)}),
    ]
