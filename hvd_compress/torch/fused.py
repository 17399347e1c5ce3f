"""One flat buffer per (dtype, device) holding the gradients of many parameters.

Each parameter's ``.grad`` is a view into the buffer, so one collective call reduces all of them
with no per-step concatenation. When something replaced a ``.grad`` (``zero_grad(set_to_none=True)``
from outside, a user assignment), the next ``gather()`` copies it back in and restores the view.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def views_into(flat: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive views of ``flat`` shaped like each of ``params``."""
    views, offset = [], 0
    for p in params:
        views.append(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return views


def cached_views(params: list[torch.Tensor]) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """``views(flat)``: ``views_into(flat, params)``, made once per buffer (an algorithm's buffers live as long
    as it does, and their views are needed several times every step)."""
    cache: dict[int, list[torch.Tensor]] = {}

    def views(flat: torch.Tensor) -> list[torch.Tensor]:
        key = flat.data_ptr()
        if key not in cache:
            cache[key] = views_into(flat, params)
        return cache[key]

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
        self._where: dict[int, tuple[int, int, int]] = {}  # id -> (buffer index, offset, numel)
        for members in groups.values():
            flat, views = flat_with_views(members)
            self._views.update((id(p), v) for p, v in zip(members, views, strict=True))
            offset = 0
            for p in members:
                self._where[id(p)] = (len(self.buffers), offset, p.numel())
                offset += p.numel()
            self.buffers.append(flat)
        for p in self.params:
            p.grad = self._views[id(p)]
        # Parameters whose gradients arrived sparse (nn.Embedding(sparse=True)) while sparse_as_dense is off:
        # id -> the gradient's sparse_dim. Their .grad stays a sparse tensor, reduced apart (Horovod's
        # allgather of indices and values), and their slot in the flat buffer stays zero.
        self.sparse: dict[int, int] = {}
        # Parameters whose gradients arrived sparse while sparse_as_dense is on: reduced dense in their views, and
        # given back sparse to a wrapped optimizer that takes only sparse gradients (``resparsify``).
        self.densified: set[int] = set()

    def note_densified(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        """Before ``grad`` accumulates into ``p.grad`` (sparse_as_dense): remember that ``p``'s gradient is sparse."""
        if grad.is_sparse:
            self.densified.add(id(p))

    def resparsify(self) -> None:
        """After the reduction: each densified parameter's ``.grad`` becomes its reduced view as a sparse tensor
        (Horovod's ``to_sparse()`` under sparse_as_dense), for ``torch.optim.SparseAdam``, which refuses a dense
        one. The views keep the values; ``zero_()`` and ``gather()`` restore them as ``.grad``."""
        for p in self.params:
            if id(p) in self.densified:
                p.grad = self._views[id(p)].to_sparse()

    def keep_sparse(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        """Before ``grad`` accumulates into ``p.grad``: a sparse ``grad`` makes ``p`` a sparse parameter, whose
        gradient accumulates as a sparse tensor instead of into its dense view."""
        if not grad.is_sparse:
            return
        view = self._views[id(p)]
        if id(p) not in self.sparse:
            self.sparse[id(p)] = grad.sparse_dim()
            view.zero_()
        if p.grad is not None and not p.grad.is_sparse and p.grad.data_ptr() == view.data_ptr():
            p.grad = None  # cleared before accumulation: the sparse gradient becomes .grad as it is

    def gather(self) -> None:
        """Make every parameter's ``.grad`` its view again, copying in any gradient held elsewhere.

        A parameter with no gradient on this rank contributes zeros, as in Horovod, so that all
        ranks reduce the same buffers.
        """
        for p in self.params:
            self.gather_one(p)

    def gather_one(self, p: torch.nn.Parameter) -> None:
        """``gather()`` for one parameter (from its gradient hook, before its bucket is reduced)."""
        if id(p) in self.sparse:
            return
        view = self._views[id(p)]
        g = p.grad
        if g is None:
            view.zero_()
        elif g.is_sparse:  # sparse_as_dense: a sparse gradient that replaced the view
            view.copy_(g.to_dense())
        elif g.data_ptr() != view.data_ptr():
            view.copy_(g)
        p.grad = view

    def span(self, params: list[torch.nn.Parameter]) -> tuple[int, torch.Tensor]:
        """(buffer index, the contiguous slice of that buffer) holding the gradients of ``params``: consecutive
        parameters of one buffer, in any order (a bucket of ``hvd_compress.ops.buckets.plan_buckets``)."""
        where = sorted(self._where[id(p)] for p in params)
        index, start, _ = where[0]
        end = where[-1][1] + where[-1][2]
        if any(w[0] != index for w in where) or end - start != sum(w[2] for w in where):
            raise ValueError("FusedGradients.span: the parameters are not consecutive in one buffer")
        return index, self.buffers[index][start:end]

    def zero_(self, set_to_none: bool = False) -> None:
        """Zero every gradient. ``set_to_none``: ``.grad`` becomes None, as torch's and Horovod's ``zero_grad()``
        leave it; the next gradient is copied into its view when it is gathered (one copy per step), else
        ``.grad`` stays the view and backward accumulates into the fused buffer directly."""
        for flat in self.buffers:
            flat.zero_()
        for p in self.params:
            p.grad = None if set_to_none or id(p) in self.sparse else self._views[id(p)]
