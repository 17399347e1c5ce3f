"""``hc.Lamb``: plain (uncompressed) LAMB, the rule that ``op=hc.OneBitLamb`` compresses.

Paper 001 (1-bit LAMB), equation (1) and footnote 3 (LAMB of You et al.): per layer l (a parameter
tensor), with g the gradient::

    m = b1 m + (1 - b1) g                 v = b2 v + (1 - b2) g^2
    mh = m / (1 - b1^t)                   vh = v / (1 - b2^t)        (if bias_correction)
    u = mh / (sqrt(vh) + eps) + weight_decay * x
    c = clip(||x|| / ||u||, min_coeff, max_coeff)   (c = 1 when ||x|| or ||u|| is 0)
    x = x - lr * c * u

The trust ratio is clipped as a whole (001 footnote 3; DeepSpeed's ``max_coeff``/``min_coeff``).
State per parameter: ``step`` (a float tensor, as torch's Adam), ``exp_avg``, ``exp_avg_sq`` and
``lamb_coeff`` (the last trust ratio, which 1-bit LAMB's warm-up averages).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


def trust_ratio(x_norm: torch.Tensor, u_norm: torch.Tensor, min_coeff: float, max_coeff: float) -> torch.Tensor:
    """LAMB's clipped ||x|| / ||u|| (a 0-d float64 tensor); 1 when either norm is 0."""
    xn, un = x_norm.double(), u_norm.double()
    if float(xn) > 0.0 and float(un) > 0.0:
        return (xn / un).clamp(min_coeff, max_coeff)
    return torch.ones((), dtype=torch.float64)


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
        if lr < 0.0 or eps < 0.0 or weight_decay < 0.0:
            raise ValueError(f"Lamb: lr {lr}, eps {eps} and weight_decay {weight_decay} must be >= 0")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Lamb: betas {betas} must be in [0, 1)")
        if not 0.0 < min_coeff <= max_coeff:
            raise ValueError(f"Lamb: need 0 < min_coeff <= max_coeff, got {min_coeff}, {max_coeff}")
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
            b1, b2 = group["betas"]
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
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                u = lamb_direction(p, m, v, t, t, group)
                c = trust_ratio(p.norm(), u.norm(), group["min_coeff"], group["max_coeff"])
                state["lamb_coeff"] = c
                p.add_(u, alpha=-group["lr"] * float(c))
        return loss


def lamb_direction(
    p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t_m: int, t_v: int, group: dict[str, Any]
) -> torch.Tensor:
    """u = mh / (sqrt(vh) + eps) + weight_decay * p, with m bias-corrected for step ``t_m`` and v for
    step ``t_v`` when the group's ``bias_correction`` is on (1-bit LAMB freezes v at ``freeze_step``)."""
    b1, b2 = group["betas"]
    if group.get("bias_correction", True):
        denom = (v / (1 - b2**t_v)).sqrt_().add_(group["eps"])
        u = (m / (1 - b1**t_m)).div_(denom)
    else:
        u = m / v.sqrt().add_(group["eps"])
    if group["weight_decay"] != 0.0:
        u.add_(p, alpha=group["weight_decay"])
    return u
