"""The torch half of the algorithms whose segments are buckets (``hvd_compress.algorithms.bucketed``: 1-bit
Adam/LAMB, Birder, SLAMB), written once: cutting the parameters into buckets, and the gradient hooks that report each
parameter whose gradient is final so that its bucket's reduction starts while backward runs (``overlap``).
"""

from __future__ import annotations

from typing import Any

import torch

from hvd_compress.ops.buckets import plan_segments as plan_bucket_segments
from hvd_compress.ops.passes import PassCounter
from hvd_compress.torch.algorithm_mixin import AlgorithmMixin
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.wrapping import hook_gradients


def plan_segments(
    param_groups: list[dict[str, Any]], bucket_mb: float
) -> tuple[list[tuple[int, list[torch.nn.Parameter]]], list[int]]:
    """The buckets of each (param group, dtype, device), as ``op=Average`` cuts its buckets
    (``ops.buckets.plan_segments``: the trainable parameters in reverse registration order, ``bucket_mb`` MiB, the
    first bucket of each key 1 MiB).

    Returns each bucket's (param group, parameters) in registration order (the order of the checkpoint's segment
    list: a model with one bucket per group keeps the layout it had before buckets) and the bucket indices in bucket
    order (the order their reductions start)."""
    trainable = [(gi, p) for gi, group in enumerate(param_groups) for p in group["params"] if p.requires_grad]
    items = [((gi, p.dtype, p.device), p.numel() * p.element_size()) for gi, p in trainable]
    segments, order = plan_bucket_segments(items, bucket_mb)
    return [(trainable[members[0]][0], [trainable[i][1] for i in members]) for members in segments], order


class BucketedMixin(AlgorithmMixin):
    """Methods of a wrapper whose algorithm is a ``BucketedAlgorithm``. With ``overlap`` the gradient hook that makes
    a parameter's gradient final (its last backward pass of ``backward_passes_per_step``) gathers it into its
    bucket's fused buffer and reports it (``gradient_final``); a complete bucket starts reducing on the background
    thread. ``synchronize()`` waits for all; ``zero_grad()`` first drops a step started but not taken."""

    def _hvdc_hook_buckets(self, backward_passes_per_step: int) -> None:
        """Count passes and hook every parameter of the algorithm's segments (``_hvdc_alg`` and ``_hvdc_grads``,
        the ``FusedGradients`` that hold the segments' gradients, are set: one per segment, or one for all)."""
        segments = self._hvdc_alg.segments
        trainable = [p for s in segments for p in s.params]
        self._hvdc_segment_of = {id(p): i for i, s in enumerate(segments) for p in s.params}
        self._hvdc_fused_of = {id(p): fused for fused in self._hvdc_grads for p in fused.params}
        self._hvdc_passes = PassCounter(trainable, backward_passes_per_step)
        hook_gradients(trainable, self._hvdc_count_pass)

    def _hvdc_count_pass(self, p: torch.Tensor) -> None:
        passes = self._hvdc_passes.add(p)
        self._hvdc_synchronized = False  # a new gradient after synchronize() starts another gradient phase
        if self._hvdc_alg.overlap and passes == self._hvdc_passes.limit:
            ensure_init()
            i = self._hvdc_segment_of[id(p)]
            self._hvdc_fused_of[id(p)].gather_one(p)  # a .grad set from outside (model.zero_grad()) into its view
            self._hvdc_alg.gradient_final(i, self.param_groups)

    @property
    def overlap(self) -> bool:
        """Whether buckets are reduced during backward (``overlap=`` of ``DistributedOptimizer``)."""
        return self._hvdc_alg.overlap

    @property
    def bucket_count(self) -> int:
        """Buckets (segments, each with its own per-bucket state) the parameters are cut into."""
        return len(self._hvdc_alg.segments)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As ``AlgorithmMixin.zero_grad``; a step whose buckets were started but not taken is dropped first
        (their state restored), never zeroing a bucket that is still being reduced."""
        self._hvdc_alg.abandon()
        AlgorithmMixin.zero_grad(self, set_to_none)

    def _hvdc_end_gradient_phase(self) -> None:
        # with overlap: every bucket's reduction finished (1-bit warm-up: the dense average, also without overlap)
        self._hvdc_alg.synchronize(self.param_groups)
