"""LAMB (You et al.), the uncompressed rule that 1-bit LAMB compresses: paper 001 (1-bit LAMB), equation (1)
and footnote 3. Per layer l (a parameter tensor), with g the gradient::

    m = b1 m + (1 - b1) g                 v = b2 v + (1 - b2) g^2
    mh = m / (1 - b1^t)                   vh = v / (1 - b2^t)        (if bias_correction)
    u = mh / (sqrt(vh) + eps) + weight_decay * x
    c = clip(||x|| / ||u||, min_coeff, max_coeff)   (c = 1 when ||x|| or ||u|| is 0)
    x = x - lr * c * u

The trust ratio is clipped as a whole (001 footnote 3; DeepSpeed's ``max_coeff``/``min_coeff``).
"""

from __future__ import annotations

from typing import Any

from hvd_compress.ops.backend import Backend, Tensor


def trust_ratio(x_norm: float, u_norm: float, min_coeff: float, max_coeff: float) -> float:
    """LAMB's clipped ||x|| / ||u|| (in double precision); 1 when either norm is 0."""
    if x_norm > 0.0 and u_norm > 0.0:
        return min(max(x_norm / u_norm, min_coeff), max_coeff)
    return 1.0


def validate(lr: float, betas: tuple[float, float], eps: float, weight_decay: float, min_coeff: float,
             max_coeff: float) -> None:
    """LAMB's hyper-parameter checks (a ValueError naming the bad value)."""
    if lr < 0.0 or eps < 0.0 or weight_decay < 0.0:
        raise ValueError(f"Lamb: lr {lr}, eps {eps} and weight_decay {weight_decay} must be >= 0")
    if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
        raise ValueError(f"Lamb: betas {betas} must be in [0, 1)")
    if not 0.0 < min_coeff <= max_coeff:
        raise ValueError(f"Lamb: need 0 < min_coeff <= max_coeff, got {min_coeff}, {max_coeff}")


def lamb_step(xp: Backend, x: Tensor, g: Tensor, m: Tensor, v: Tensor, t: int, group: dict[str, Any]) -> float:
    """One LAMB step of one layer, in place on ``x``, ``m``, ``v``; returns the trust ratio c."""
    b1, b2 = group["betas"]
    xp.add_(xp.mul_(m, b1), g, alpha=1 - b1)
    xp.addcmul_(xp.mul_(v, b2), g, g, value=1 - b2)
    if group.get("bias_correction", True):
        denom = xp.div_(xp.copy_(xp.zeros_like(v), v), 1 - b2**t)
        xp.add_(xp.sqrt(denom, out=denom), group["eps"])
        u = xp.div_(xp.div_(xp.copy_(xp.zeros_like(m), m), 1 - b1**t), denom)
    else:
        u = xp.div(m, xp.add_(xp.sqrt(v, out=xp.zeros_like(v)), group["eps"]), out=xp.zeros_like(m))
    if group["weight_decay"] != 0.0:
        xp.add_(u, x, alpha=group["weight_decay"])
    c = trust_ratio(xp.norm(x), xp.norm(u), group["min_coeff"], group["max_coeff"])
    xp.add_(x, u, alpha=-group["lr"] * c)
    return c
