"""``hc.DistributedGradientTape``: Horovod's tape wrapper for TF2 custom training loops."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hvd_compress.ops.constants import ReduceOp
from hvd_compress.tensorflow.functions import grouped_allreduce


def reduce_gradients(grads: list[Any], op: Any, name: str) -> list[Any]:
    """``grads`` with every non-None entry reduced over all ranks in one stateful call (``IndexedSlices``
    densified). A None gradient (a variable the loss does not reach) stays None: that is decided by the
    program's structure, so every rank skips the same ones."""
    present = [i for i, g in enumerate(grads) if g is not None]
    reduced = grouped_allreduce([grads[i] for i in present], op=op, name=name)
    out = list(grads)
    for i, g in zip(present, reduced, strict=True):
        out[i] = g
    return out


class DistributedGradientTape:
    """Wraps a ``tf.GradientTape``: ``gradient()`` returns the gradients reduced over all ranks.

    ``op`` is ``Average`` (default) or ``Sum``; everything else is delegated to the wrapped tape, so it can
    wrap a tape after its ``with`` block (Horovod's usage) or be used as the context manager itself.
    """

    def __init__(self, tape: tf.GradientTape, op: Any = ReduceOp.Average, name: str = "DistributedGradientTape"):
        op = ReduceOp(op)
        if op not in (ReduceOp.Average, ReduceOp.Sum):
            raise ValueError(
                f"DistributedGradientTape supports op=Average or Sum, got {op.name}; for Adasum and the "
                "compressed optimizers wrap the optimizer: hvd_compress.keras.DistributedOptimizer"
            )
        self._tape = tape
        self._op = op
        self._name = name

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
        return tf.nest.pack_sequence_as(grads, reduce_gradients(flat, self._op, self._name))
