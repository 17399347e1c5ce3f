"""``hvd_compress.ops.backend.Backend`` on torch tensors: each primitive is one torch op.

Scalars keep their float32 precision on half tensors too. PyTorch's CPU kernels round the scalar of
``add_(y, alpha=a)``, ``add_(s)``, ``_foreach_add_`` and ``_foreach_mul_`` to the tensor's dtype first on
float16/bfloat16 tensors (so 1 - beta1 = 0.1 becomes 0.09998 in float16, a 0.02% bias of every moment update,
and rounds differently from the reference), while ``mul_``, ``addcmul_`` and ``addcdiv_`` compute with the
scalar in float32. On half tensors the first group is therefore routed through ``addcmul_`` with a 0-d one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hvd_compress.ops import masks as mask_ops

_HALF = (torch.float16, torch.bfloat16)


def _one(x: torch.Tensor) -> torch.Tensor:
    """A 0-d one of ``x``'s dtype and device: ``x.addcmul_(y, one, value=a)`` is x + a * y with a in float32."""
    return torch.ones((), dtype=x.dtype, device=x.device)


class TorchBackend:
    """The algorithms' element-wise primitives as torch ops (no autograd: call under ``no_grad``)."""

    @staticmethod
    def float32_like(numel: int, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(numel, dtype=torch.float32, device=like.device)

    @staticmethod
    def describe(x: object) -> tuple[str, int] | None:
        if not isinstance(x, torch.Tensor):
            return None
        return str(x.dtype).removeprefix("torch."), x.numel()

    @staticmethod
    def zero_(x: torch.Tensor) -> torch.Tensor:
        return x.zero_()

    @staticmethod
    def zeros_like(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x, memory_format=torch.preserve_format)

    @staticmethod
    def copy_(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return dst.copy_(src)

    @staticmethod
    def add_(x: torch.Tensor, y: torch.Tensor | float, alpha: float = 1.0) -> torch.Tensor:
        if x.dtype in _HALF:
            one = _one(x)
            if isinstance(y, torch.Tensor):
                return x.addcmul_(y, one, value=alpha)
            return x.addcmul_(one, one, value=float(y))
        if isinstance(y, torch.Tensor):
            return x.add_(y, alpha=alpha)
        return x.add_(y)

    @staticmethod
    def mul_(x: torch.Tensor, y: torch.Tensor | float) -> torch.Tensor:
        return x.mul_(y)

    @staticmethod
    def lerp_(x: torch.Tensor, y: torch.Tensor, weight: float) -> torch.Tensor:
        if x.dtype == y.dtype:
            return x.lerp_(y, weight)
        return x.copy_(x.float().lerp_(y.float(), weight))  # a half x with a float32 y: in float32, rounded once

    @staticmethod
    def div_(x: torch.Tensor, y: torch.Tensor | float) -> torch.Tensor:
        return x.div_(y)

    @staticmethod
    def addcmul_(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, value: float) -> torch.Tensor:
        return x.addcmul_(a, b, value=value)

    @staticmethod
    def reciprocal_(x: torch.Tensor) -> torch.Tensor:
        return x.reciprocal_()

    @staticmethod
    def abs(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return torch.abs(x, out=out)

    @staticmethod
    def sqrt(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x, out=out)

    @staticmethod
    def sub(a: torch.Tensor, b: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
        if out.dtype in _HALF:
            return out.copy_(a).addcmul_(b, _one(out), value=-alpha)
        return torch.sub(a, b, alpha=alpha, out=out)

    @staticmethod
    def div(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return torch.div(a, b, out=out)

    @staticmethod
    def foreach_add_(xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor], alpha: float) -> None:
        if any(x.dtype in _HALF for x in xs):
            for x, y in zip(xs, ys, strict=True):
                TorchBackend.add_(x, y, alpha=alpha)
            return
        torch._foreach_add_(list(xs), list(ys), alpha=alpha)

    @staticmethod
    def foreach_mul_(xs: Sequence[torch.Tensor], scalars: float | Sequence[float]) -> None:
        if any(x.dtype in _HALF for x in xs):
            each = [scalars] * len(xs) if isinstance(scalars, (int, float)) else list(scalars)
            for x, s in zip(xs, each, strict=True):
                x.mul_(s)
            return
        torch._foreach_mul_(list(xs), scalars if isinstance(scalars, (int, float)) else list(scalars))

    @staticmethod
    def foreach_addcdiv_(
        xs: Sequence[torch.Tensor], a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], value: float
    ) -> None:
        torch._foreach_addcdiv_(list(xs), list(a), list(b), value=value)

    @staticmethod
    def foreach_norm(xs: Sequence[torch.Tensor]) -> list[float]:
        return [float(n) for n in torch._foreach_norm(list(xs))]

    @staticmethod
    def clamp_min_(x: torch.Tensor, value: float) -> torch.Tensor:
        return x.clamp_min_(value)

    @staticmethod
    def raise_floored(d: torch.Tensor, m: torch.Tensor, cap: float, floor: float, out: torch.Tensor) -> torch.Tensor:
        torch.maximum(out.copy_(m).abs_().mul_(cap), d, out=out)
        return out.copy_(torch.where(d <= floor, out, d))

    @staticmethod
    def foreach_mean(xs: Sequence[torch.Tensor]) -> list[float]:
        return [float(x.double().mean()) if x.numel() else 0.0 for x in xs]

    @staticmethod
    def norm(x: torch.Tensor) -> float:
        return float(x.norm())

    @staticmethod
    def max(x: torch.Tensor) -> float:
        return float(x.max())

    @staticmethod
    def first_nonfinite(x: torch.Tensor) -> tuple[int, float] | None:
        if not TorchBackend.any_nonfinite(x):
            return None
        bad = int((~torch.isfinite(x)).nonzero()[0, 0])
        return bad, float(x[bad])

    @staticmethod
    def any_nonfinite(x: torch.Tensor) -> bool:
        """For real floats one pass and no mask the size of ``x``: a NaN makes both extremes NaN, an Inf one of them
        Inf."""
        if x.numel() == 0 or not x.is_floating_point():  # complex: no order; integers: always finite
            return bool((~torch.isfinite(x)).any())
        lo, hi = torch.aminmax(x)
        return not (bool(torch.isfinite(lo)) and bool(torch.isfinite(hi)))

    @staticmethod
    def bool_like(numel: int, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(numel, dtype=torch.bool, device=like.device)

    @staticmethod
    def clamp_(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
        return x.clamp_(low, high)

    @staticmethod
    def masked_norms(x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, int]:
        if x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous():
            return mask_ops.masked_norms(x, mask.reshape(-1))
        selected = int(mask.sum())
        if selected == mask.numel():
            return float(x.norm()), 0.0, selected
        if selected == 0:
            return 0.0, float(x.norm()), 0
        return float(x[mask].norm()), float(x[~mask].norm()), selected


BACKEND = TorchBackend()
