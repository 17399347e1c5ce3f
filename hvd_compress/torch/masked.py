"""PyTorch face of the random-k masks and the masked allreduce (``hvd_compress.ops.masks``):
``hc.random_mask`` and ``hc.masked_allreduce``/``masked_allreduce_``."""

from __future__ import annotations

import torch

from hvd_compress.ops import masks as mask_ops
from hvd_compress.torch.context import ensure_init


def random_mask(numel: int, ratio: float, seed: int, step: int, kind: str = "cyclic") -> torch.Tensor:
    """The random-k mask of (numel, ratio, seed, step) as a bool tensor, identical on every rank.

    ``kind="cyclic"`` (default): chunk (step mod int(1/ratio)) of a permutation drawn once from ``seed``,
    so every element is selected exactly once per int(1/ratio) steps; ``"bernoulli"``: each element with
    probability ``ratio`` (exactly T / 2^32, T = ceil(float32(ratio) 2^32)), drawn from (seed, step). Needs no
    ``init()``: nothing is communicated.
    """
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel must be an int >= 0, got {numel!r}")
    return mask_ops.random_mask_(torch.empty(numel, dtype=torch.bool), ratio, seed, step, kind)


def masked_allreduce_(tensor: torch.Tensor, ratio: float, seed: int, step: int, kind: str = "cyclic",
                      name: str | None = None) -> torch.Tensor:
    """In place: the elements ``random_mask(tensor.numel(), ratio, seed, step, kind)`` selects (in flat
    order) become their average over all ranks; the others keep this rank's values. No index is sent."""
    ensure_init()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"masked_allreduce expects a torch.Tensor, got {type(tensor).__name__}")
    mask_ops.masked_allreduce_(tensor.detach(), ratio, seed, step, kind, name=name)
    return tensor


def masked_allreduce(tensor: torch.Tensor, ratio: float, seed: int, step: int, kind: str = "cyclic",
                     name: str | None = None) -> torch.Tensor:
    """A new tensor: ``tensor`` with the masked elements averaged over all ranks (see ``masked_allreduce_``)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"masked_allreduce expects a torch.Tensor, got {type(tensor).__name__}")
    return masked_allreduce_(tensor.detach().clone(memory_format=torch.contiguous_format), ratio, seed, step,
                             kind, name)
