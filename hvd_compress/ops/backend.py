"""The element-wise primitives the algorithms and the compression state are written in, implemented once
per framework face (``hvd_compress/torch/backend.py``).

An algorithm never touches a framework: it calls these on the face's own tensors (flat contiguous
buffers, per-parameter views of them, and the parameters). Each primitive is one in-place framework op
with that framework's rounding, named and ordered as in PyTorch, so the algorithms round exactly as the
NumPy reference (which follows the same order) expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

Tensor = Any  # a framework tensor (torch.Tensor, tf.Variable, ...)
Scalar = float


class Backend(Protocol):
    """In-place math on a face's tensors; every method returns its (first) output."""

    def float32_like(self, numel: int, like: Tensor) -> Tensor:
        """A new zeroed float32 flat buffer of ``numel`` elements on ``like``'s device."""

    def describe(self, x: object) -> tuple[str, int] | None:
        """(dtype name such as ``"float32"``, number of elements) of a tensor of this face; None otherwise."""

    def zero_(self, x: Tensor) -> Tensor: ...

    def zeros_like(self, x: Tensor) -> Tensor:
        """A new zeroed tensor of ``x``'s shape, dtype and device."""

    def copy_(self, dst: Tensor, src: Tensor) -> Tensor: ...

    def add_(self, x: Tensor, y: Tensor | Scalar, alpha: Scalar = 1.0) -> Tensor:
        """x += alpha * y (y a tensor), or x += y (y a number)."""

    def mul_(self, x: Tensor, y: Tensor | Scalar) -> Tensor: ...

    def lerp_(self, x: Tensor, y: Tensor, weight: Scalar) -> Tensor:
        """x += weight * (y - x), rounded as torch's ``lerp_`` on the CPU (torch's Adam forms its momentum so)."""

    def div_(self, x: Tensor, y: Tensor | Scalar) -> Tensor: ...

    def addcmul_(self, x: Tensor, a: Tensor, b: Tensor, value: Scalar) -> Tensor:
        """x += value * a * b."""

    def reciprocal_(self, x: Tensor) -> Tensor: ...

    def abs(self, x: Tensor, out: Tensor) -> Tensor:
        """out = |x| (``out`` may be ``x``)."""

    def sqrt(self, x: Tensor, out: Tensor) -> Tensor:
        """out = sqrt(x) (``out`` may be ``x``)."""

    def sub(self, a: Tensor, b: Tensor, alpha: Scalar, out: Tensor) -> Tensor:
        """out = a - alpha * b."""

    def div(self, a: Tensor, b: Tensor, out: Tensor) -> Tensor:
        """out = a / b."""

    def foreach_add_(self, xs: Sequence[Tensor], ys: Sequence[Tensor], alpha: Scalar) -> None:
        """x_i += alpha * y_i."""

    def foreach_mul_(self, xs: Sequence[Tensor], scalars: Scalar | Sequence[Scalar]) -> None: ...

    def foreach_addcdiv_(self, xs: Sequence[Tensor], a: Sequence[Tensor], b: Sequence[Tensor], value: Scalar) -> None:
        """x_i += value * a_i / b_i."""

    def foreach_norm(self, xs: Sequence[Tensor]) -> list[float]:
        """The 2-norm of each tensor, as computed in its dtype, as Python floats."""

    def clamp_min_(self, x: Tensor, value: Scalar) -> Tensor:
        """x = max(x, value)."""

    def raise_floored(self, d: Tensor, m: Tensor, cap: Scalar, floor: Scalar, out: Tensor) -> Tensor:
        """out = max(d, |m| * cap) where d <= floor, else d (the 1-bit variance floor's cap; ``out`` is neither)."""

    def foreach_mean(self, xs: Sequence[Tensor]) -> list[float]:
        """The mean of each tensor, accumulated in double precision (0.0 for an empty one)."""

    def norm(self, x: Tensor) -> float:
        """The 2-norm of ``x``, as computed in its dtype."""

    def max(self, x: Tensor) -> float: ...

    def first_nonfinite(self, x: Tensor) -> tuple[int, float] | None:
        """(index, value) of the first NaN/Inf element of ``x``, or None when all are finite."""

    def any_nonfinite(self, x: Tensor) -> bool: ...

    # SLAMB's masked primitives (``algorithms/slamb.py``): ``mask`` is a bool tensor of ``x``'s shape.
    def bool_like(self, numel: int, like: Tensor) -> Tensor:
        """A new all-False bool flat buffer of ``numel`` elements on ``like``'s device."""

    def clamp_(self, x: Tensor, low: Scalar, high: Scalar) -> Tensor:
        """x = min(max(x, low), high)."""

    def masked_norms(self, x: Tensor, mask: Tensor) -> tuple[float, float, int]:
        """(2-norm of x[mask], 2-norm of x[~mask], number of elements selected), norms in ``x``'s dtype."""
