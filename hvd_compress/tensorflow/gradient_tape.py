"""``hc.DistributedGradientTape``: Horovod's tape wrapper for TF2 custom training loops."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hvd_compress.ops.buckets import DEFAULT_BUCKET_MB
from hvd_compress.ops.collectives import check_predivide
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.horovod_args import pop_horovod_defaults
from hvd_compress.ops.process_sets import check_process_set
from hvd_compress.tensorflow.bucketed import (
    BucketStats,
    bucketed_allreduce,
    check_bucket_mb,
    check_overlap,
    none_gradients_left_out,
)
from hvd_compress.tensorflow.functions import check_group_compression


def reduce_gradients(grads: list[Any], op: Any, name: str, bucket_mb: float = DEFAULT_BUCKET_MB, overlap: bool = True,
                     stats: BucketStats | None = None, compression: Any = None, predivide: float = 1.0) -> list[Any]:
    """``grads`` with every non-None entry reduced over all ranks in buckets (``tensorflow.bucketed``: inside a
    ``tf.function`` they overlap the rest of backward; ``IndexedSlices`` densified). A None gradient (a variable the
    loss does not reach) stays None: where the program's structure decides it, every rank skips the same ones (where
    a branch differs by rank, the reduction raises ``MismatchError`` on every rank, with that cause)."""
    present = [i for i, g in enumerate(grads) if g is not None]
    with none_gradients_left_out(len(grads) - len(present)):
        reduced = bucketed_allreduce([grads[i] for i in present], op, name, compression, bucket_mb=bucket_mb,
                                     overlap=overlap, stats=stats, predivide=predivide)
    out = list(grads)
    for i, g in zip(present, reduced, strict=True):
        out[i] = g
    return out


class DistributedGradientTape:
    """Wraps a ``tf.GradientTape``: ``gradient()`` returns the gradients reduced over all ranks.

    ``op`` is ``Average`` (default) or ``Sum``; everything else is delegated to the wrapped tape, so it can
    wrap a tape after its ``with`` block (Horovod's usage) or be used as the context manager itself. Inside a
    ``tf.function`` the gradient buckets (``bucket_mb``) are reduced while backward still runs (``overlap=False``:
    after it, bit-identical); the reduced gradients are not differentiable.

    Horovod's keywords: ``compression`` (``hc.Compression.none``, ``fp16``, ``bf16``, Horovod's
    ``hvd.Compression.fp16``), ``gradient_predivide_factor`` (op=Average), ``sparse_as_dense`` (``IndexedSlices``
    are densified either way), ``process_set`` (the global set); ``device_dense``, ``device_sparse``,
    ``num_groups``, ``groups`` and ``scale_local_gradients`` at their defaults only (``bucket_mb`` sets the
    fusion here), else ``ValueError``.
    """

    def __init__(self, tape: tf.GradientTape, op: Any = ReduceOp.Average, name: str = "DistributedGradientTape",
                 bucket_mb: float = DEFAULT_BUCKET_MB, overlap: bool = True, *, compression: Any = None,
                 sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0, process_set: Any = None,
                 **horovod_options: Any):
        if op not in (ReduceOp.Average, ReduceOp.Sum):
            raise ValueError(
                f"DistributedGradientTape supports op=Average or Sum, got {getattr(op, 'name', op)}; for Adasum and "
                "the compressed optimizers wrap the optimizer: hvd_compress.keras.DistributedOptimizer"
            )
        op = ReduceOp(op)
        horovod_options = dict(horovod_options)
        pop_horovod_defaults(horovod_options, "DistributedGradientTape")
        if horovod_options:
            raise TypeError(f"DistributedGradientTape got unexpected keyword arguments {sorted(horovod_options)}")
        if not isinstance(sparse_as_dense, bool):
            raise TypeError(f"sparse_as_dense must be True or False, got {sparse_as_dense!r}")
        check_process_set(process_set)
        self._tape = tape
        self._op = op
        self._name = name
        self._bucket_mb = check_bucket_mb(bucket_mb)
        self._overlap = check_overlap(overlap)
        self._compression = check_group_compression(compression, op, name)
        self._predivide = check_predivide(gradient_predivide_factor, op)
        self.buckets = BucketStats()

    def __getattr__(self, item: str) -> Any:
        return getattr(self._tape, item)

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._tape.__exit__(*exc)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat = tf.nest.flatten(grads, expand_composites=False)
        return tf.nest.pack_sequence_as(grads, reduce_gradients(flat, self._op, self._name, self._bucket_mb,
                                                                      self._overlap, self.buckets, self._compression,
                                                                      self._predivide))
