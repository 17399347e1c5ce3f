"""The one place where a framework tensor becomes a core buffer.

The core reads DLPack (``__dlpack__`` objects or capsules) through nanobind, so torch tensors,
NumPy arrays and TensorFlow's DLPack capsules all reach it without a copy. This module only
removes what DLPack refuses to export (autograd history) and never imports a framework. The buffer
keeps the tensor's shape (never flatten here): the core puts it in the call signature, so ranks that
pass equal element counts in different shapes raise ``MismatchError`` instead of being reduced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def as_core_buffer(tensor: Any) -> Any:
    """An object the core accepts for ``tensor``'s memory and shape (same storage, no copy)."""
    detach = getattr(tensor, "detach", None)
    if detach is not None and getattr(tensor, "requires_grad", False):
        return detach()
    return tensor


def as_core_layers(tensors: Sequence[Any], sizes: Sequence[int]) -> list[Any]:
    """A bucket's parameters for the fused kernels' per-layer lists: ``as_core_buffer`` of each, None for an empty
    one (whose strides may not read as contiguous)."""
    return [as_core_buffer(x) if size else None for x, size in zip(tensors, sizes, strict=True)]
