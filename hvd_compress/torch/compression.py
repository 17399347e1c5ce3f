"""PyTorch face of the dense path's compression: ``hc.Compression`` and ``hc.CompressionState``.

The compressors and the error-feedback state are framework-neutral (``hvd_compress.ops.compression``); this
face gives the state torch buffers. ``hc.allreduce(t, compression=..., state=...)`` and
``hc.DistributedOptimizer(opt, compression=...)`` use them.
"""

from __future__ import annotations

from typing import Any

import torch

from hvd_compress.ops import compression as compression_ops
from hvd_compress.ops.compression import Compression, Compressor
from hvd_compress.torch.backend import BACKEND

__all__ = ["Compression", "CompressionState", "Compressor"]


class CompressionState(compression_ops.CompressionState):
    """Error feedback (float32 ``error`` of ``numel`` elements, on ``device``, default the CPU) and ``step`` of
    one tensor reduced with ``compression`` (``hc.Compression.topk(...)`` or ``randomk(...)``); keep one per
    tensor across calls and save its ``state_dict()`` with the checkpoint. ``sizes``: the tensors a fused buffer
    holds (each sends its own ratio of elements; default one tensor)."""

    def __init__(self, numel: int, compression: Any, device: torch.device | str | None = None,
                 sizes: list[int] | None = None) -> None:
        like = torch.empty(0, device=device)
        super().__init__(numel, compression_ops.resolve(compression), BACKEND, like, sizes)
