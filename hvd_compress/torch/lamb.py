"""``hc.Lamb``: plain (uncompressed) LAMB, the rule that ``op=hc.OneBitLamb`` compresses.

The rule (paper 001, equation (1) and footnote 3) is ``hvd_compress.algorithms.lamb``; this is its torch
optimizer. State per parameter: ``step`` (a float tensor, as torch's Adam), ``exp_avg``, ``exp_avg_sq`` and
``lamb_coeff`` (the last trust ratio, which 1-bit LAMB's warm-up averages).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from hvd_compress.algorithms import lamb
from hvd_compress.torch.backend import BACKEND


class Lamb(torch.optim.Optimizer):
    """LAMB with per-layer trust ratio clipped to [``min_coeff``, ``max_coeff``]."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        min_coeff: float = 0.01,
        max_coeff: float = 10.0,
    ) -> None:
        lamb.validate(lr, betas, eps, weight_decay, min_coeff, max_coeff)
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "bias_correction": bias_correction,
            "min_coeff": min_coeff,
            "max_coeff": max_coeff,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["lamb_coeff"] = torch.ones((), dtype=torch.float64)
                state["step"] += 1
                t = int(state["step"].item())
                c = lamb.lamb_step(BACKEND, p, p.grad, state["exp_avg"], state["exp_avg_sq"], t, group)
                state["lamb_coeff"] = torch.tensor(c, dtype=torch.float64)
        return loss
