"""Birder's benchmark rows (paper 004): a Birder step against Horovod's Adam step, 1-bit Adam through the
hierarchical all-reduce against the flat one, and the collectives alone (Birder's +/-1 payload, the scaled 1-bit
payload; flat and hierarchical) against Horovod's Average allreduce of the same buffer; EF-signSGD with majority
vote (``op=hc.SignSGD``, its vote on Birder's flat collective) against Horovod's SGD step. The stochastic quantizer
against a memcpy of the bytes it streams is a kernel row
(hvd_compress/bench/kernels.py, ``python -m hvd_compress.bench.kernels``)."""

from __future__ import annotations

import torch

import hvd_compress.torch as hc
from hvd_compress.bench.cases import Case, horovod_average
from hvd_compress.bench.optimizer_cases import _stepper
from hvd_compress.ops import hierarchical_onebit


def _collective(payload: int, hierarchical: bool):
    """hierarchical_compressed_allreduce_ in place on the benchmark's buffer, its error state kept per size (the
    step advances, so every call draws new uniforms)."""
    states: dict[int, tuple[torch.Tensor, torch.Tensor, list[int]]] = {}

    def run(t: torch.Tensor) -> torch.Tensor:
        if t.numel() not in states:
            c1, c2 = hierarchical_onebit.state_numels(t.numel(), hierarchical)
            states[t.numel()] = (torch.zeros(c1), torch.zeros(c2), [0])
        werr, serr, step = states[t.numel()]
        step[0] += 1
        return hierarchical_onebit.hierarchical_compressed_allreduce_(
            t, werr, serr, payload=payload, hierarchical=hierarchical, seed=1, step=step[0], name="bench.birder")

    return run


def birder_cases(hvd) -> list[Case]:
    def hvd_adam(p: torch.nn.Parameter) -> torch.optim.Optimizer:
        return hvd.DistributedOptimizer(torch.optim.Adam([p], lr=1e-3), named_parameters=[("p", p)])

    def birder(hierarchical: bool):
        return lambda p: hc.DistributedOptimizer(hc.Birder([p]), named_parameters=[("p", p)], op=hc.Birder,
                                                 hierarchical=hierarchical)

    def hvd_sgd(p: torch.nn.Parameter) -> torch.optim.Optimizer:
        return hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1e-3), named_parameters=[("p", p)])

    def signsgd(p: torch.nn.Parameter) -> torch.optim.Optimizer:
        return hc.DistributedOptimizer(torch.optim.SGD([p], lr=1e-3), named_parameters=[("p", p)], op=hc.SignSGD)

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
        # The vote's extra cost over Birder's flat step: the scale allreduce (one float per parameter).
        Case("SignSGD step", _stepper(signsgd, 0),
             {"hvd SGD step": _stepper(hvd_sgd, 1), "Birder flat step": _stepper(birder(False), 0)}),
        Case("OneBitAdam flat vs hierarchical", _stepper(onebit_adam(True), 1),
             {"OneBitAdam flat step": _stepper(onebit_adam(False), 1)}),
        Case("Birder collective", _collective(hierarchical_onebit.PAYLOAD_SIGN, False),
             {"hvd Average": horovod_average(hvd)}),
        Case("Birder collective hierarchical", _collective(hierarchical_onebit.PAYLOAD_SIGN, True),
             {"Birder collective flat": _collective(hierarchical_onebit.PAYLOAD_SIGN, False),
              "hvd Average": horovod_average(hvd)}),
        Case("1-bit collective hierarchical", _collective(hierarchical_onebit.PAYLOAD_SCALED, True),
             {"1-bit collective flat": _collective(hierarchical_onebit.PAYLOAD_SCALED, False),
              "hvd Average": horovod_average(hvd)}),
    ]
