"""Adasum of the optimizer's parameter delta, overlapped with backward: paper 002 (Adasum, MLSys 2021).

Section 4.1: with an adaptive optimizer, Adasum combines the *updates* each rank's optimizer computed
from its own gradient, not the gradients: per rank ``delta_r = step(x, g_r) - x``, then
``x <- x + Adasum_r(delta_r)`` (Algorithm 1, lines 1-14, for the reduction itself, in the core).

``AdasumDelta`` is that sequencing, written once for every face: each parameter's delta goes into its bucket's
fused buffer and the parameter back to its start (``gradient_final``); a bucket whose deltas are all written is
reduced (``hvd_compress.ops.buckets``: on the background thread, buckets strictly in bucket order, as the
overlapped ``op=Average``); ``synchronize`` waits for all; ``step`` applies the reduced deltas. The face runs
its framework's local step (the wrapped optimizer on some parameters) and owns the buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from hvd_compress import ops
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.buckets import DEFAULT_BUCKET_MB, BucketReductions, plan_buckets
from hvd_compress.ops.traffic import CommMeter

__all__ = ["AdasumDelta", "AdasumOptions", "DeltaBucket", "plan_buckets"]


@dataclasses.dataclass(frozen=True)
class AdasumOptions:
    """``hierarchical``: average within each node, Adasum across nodes (None: ``HVDC_ADASUM_HIERARCHICAL``);
    ``bucket_mb``: the size at which a bucket of deltas is closed and reduced."""

    hierarchical: bool | None = None
    bucket_mb: float = DEFAULT_BUCKET_MB

    def validate(self, op_name: str = "Adasum") -> None:
        """``ValueError`` for a bad value (``parse_options`` calls it)."""
        if isinstance(self.bucket_mb, bool) or not (isinstance(self.bucket_mb, (int, float)) and self.bucket_mb > 0):
            raise ValueError(f"op={op_name}: bucket_mb must be a positive number of MiB, got {self.bucket_mb!r}")

    def __post_init__(self) -> None:
        self.validate()


@dataclasses.dataclass
class DeltaBucket:
    """Parameters of one dtype whose deltas travel in one fused Adasum call: the face's ``params``, the fused
    ``flat`` buffer and each parameter's view of it (``views``, shaped as the parameter)."""

    index: int
    params: list[Any]
    flat: Tensor
    views: list[Tensor]
    sizes: list[int]


class AdasumDelta:
    """Paper 002 Section 4.1 over a face's ``buckets`` (planned with ``plan_buckets``, ``bucket_mb``)."""

    name = "Adasum"
    options_cls = AdasumOptions

    def __init__(self, options: AdasumOptions, backend: Backend, buckets: Sequence[DeltaBucket],
                 meter: CommMeter | None, prefix: str = "DistributedOptimizer.adasum") -> None:
        self.options = options
        self.xp = backend
        self.buckets = list(buckets)
        self.meter = meter if meter is not None else CommMeter()
        self.prefix = prefix  # the collectives' names: prefix.<bucket>
        self.where = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self.written: set[int] = set()  # parameters whose delta of the coming step is in its bucket
        self.reductions = BucketReductions([len(b.params) for b in self.buckets])

    def pending(self, params: Sequence[Any]) -> list[Any]:
        """Those of ``params`` whose delta of the coming step is not written yet."""
        return [p for p in params if id(p) not in self.written]

    def gradient_final(self, params: Sequence[Any], starts: Sequence[Tensor]) -> None:
        """``params`` have taken their local step from ``starts``: each delta into its bucket view, the parameter
        back to its start; each next bucket that is complete starts reducing (in bucket order)."""
        for p, start in zip(params, starts, strict=True):
            bucket, i = self.where[id(p)]
            self.xp.sub(p, start, 1.0, out=bucket.views[i])
            self.xp.copy_(p, start)
            self.written.add(id(p))
            self.reductions.mark_ready(bucket.index)
        self.reductions.launch_ready(self.reduce_bucket)

    def reduce_bucket(self, index: int) -> None:
        """Adasum of bucket ``index``'s deltas over all ranks, in place (Algorithm 1, the core)."""
        b = self.buckets[index]
        self.meter.run(ops.adasum_fused_, b.flat, b.sizes, name=f"{self.prefix}.{b.index}",
                       hierarchical=self.options.hierarchical)

    def synchronize(self) -> None:
        """Reduce every bucket not started yet and wait for all (call once every delta is written); on any
        failure the step is dropped (``abandon``) and the error raised."""
        self.reductions.mark_all_ready()
        self.reductions.launch_ready(self.reduce_bucket)
        try:
            self.reductions.drain()
        except Exception:
            self.abandon()
            raise

    def step(self) -> None:
        """x = start + Adasum(delta), for every parameter; then the next step starts afresh."""
        for b in self.buckets:
            self.xp.foreach_add_(b.params, b.views, 1.0)
        self.abandon()

    def abandon(self) -> None:
        """Forget the coming step's deltas (the parameters hold their starts)."""
        self.written.clear()
        self.reductions.reset()

    def state_dict(self) -> dict[str, Any]:
        """Nothing: between steps the deltas are gone and the wrapped optimizer holds all the state."""
        return {}

    def load_state_dict(self, ours: dict[str, Any] | None, plain_step: int = 0) -> None:
        del ours, plain_step
        self.abandon()
