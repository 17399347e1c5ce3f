"""One flat buffer per (dtype, device) holding the gradients of many parameters.

Each parameter's ``.grad`` is a view into the buffer, so one collective call reduces all of them
with no per-step concatenation. When something replaced a ``.grad`` (``zero_grad(set_to_none=True)``
from outside, a user assignment), the next ``gather()`` copies it back in and restores the view.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def views_into(flat: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive views of ``flat`` shaped like each of ``params``."""
    views, offset = [], 0
    for p in params:
        views.append(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return views


def flat_with_views(params: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A zeroed flat buffer for ``params`` (one dtype and device) and a view of it shaped like each."""
    flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    return flat, views_into(flat, params)


class FusedGradients:
    """Flat gradient buffers with per-parameter views, grouped by (dtype, device)."""

    def __init__(self, params: Iterable[torch.nn.Parameter]) -> None:
        self.params = [p for p in params if p.requires_grad]
        groups: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for p in self.params:
            groups.setdefault((p.dtype, p.device), []).append(p)
        self.buffers: list[torch.Tensor] = []
        self._views: dict[int, torch.Tensor] = {}
        for members in groups.values():
            flat, views = flat_with_views(members)
            self._views.update((id(p), v) for p, v in zip(members, views, strict=True))
            self.buffers.append(flat)
        for p in self.params:
            p.grad = self._views[id(p)]

    def gather(self) -> None:
        """Make every parameter's ``.grad`` its view again, copying in any gradient held elsewhere.

        A parameter with no gradient on this rank contributes zeros, as in Horovod, so that all
        ranks reduce the same buffers.
        """
        for p in self.params:
            view = self._views[id(p)]
            g = p.grad
            if g is None:
                view.zero_()
            elif g.data_ptr() != view.data_ptr():
                if g.is_sparse:
                    raise ValueError("hvd_compress: sparse gradients are not supported; use dense embeddings")
                view.copy_(g)
            p.grad = view

    def zero_(self) -> None:
        for flat in self.buffers:
            flat.zero_()
        for p in self.params:
            p.grad = self._views[id(p)]
