"""Adasum of the optimizer's parameter delta, overlapped with backward: paper 002 (Adasum, MLSys 2021).

Section 4.1: with an adaptive optimizer, Adasum combines the *updates* each rank's optimizer computed
from its own gradient, not the gradients: per rank ``delta_r = step(x, g_r) - x``, then
``x <- x + Adasum_r(delta_r)`` (Algorithm 1, lines 1-14, for the reduction itself, in the core).

This module holds what does not depend on a framework: the options; the bucket plan (which deltas travel
together) and the sequencing of the reductions (a bucket whose deltas are all written is reduced on the
background thread, buckets strictly in bucket order) are ``hvd_compress.ops.buckets``, shared with the
overlapped ``op=Average``/``Sum``. The face runs the local steps, owns the buffers and applies the reduced
delta.
"""

from __future__ import annotations

import dataclasses

from hvd_compress.ops.buckets import BucketReductions, plan_buckets

#: The delta buckets' pipeline is the framework-neutral one of ``hvd_compress.ops.buckets``.
DeltaReductions = BucketReductions
__all__ = ["DEFAULT_BUCKET_MB", "AdasumOptions", "DeltaReductions", "plan_buckets"]

DEFAULT_BUCKET_MB = 16.0


@dataclasses.dataclass(frozen=True)
class AdasumOptions:
    """``hierarchical``: average within each node, Adasum across nodes (None: ``HVDC_ADASUM_HIERARCHICAL``);
    ``bucket_mb``: the size at which a bucket of deltas is closed and reduced."""

    hierarchical: bool | None = None
    bucket_mb: float = DEFAULT_BUCKET_MB

    def validate(self, op_name: str = "Adasum") -> None:
        """``ValueError`` for a bad value (``build_options`` calls it)."""
        if isinstance(self.bucket_mb, bool) or not (isinstance(self.bucket_mb, (int, float)) and self.bucket_mb > 0):
            raise ValueError(f"op={op_name}: bucket_mb must be a positive number of MiB, got {self.bucket_mb!r}")

    def __post_init__(self) -> None:
        self.validate()
