"""Top-k / random-k gradient reduction for the Keras wrappers (``hck.DistributedOptimizer(opt, op=Average,
compression=hc.Compression.topk(ratio))`` or ``randomk(ratio, seed)``), with the error feedback kept in the
optimizer's own variables, so that Keras checkpoints keep it.

As the torch face's: one fused float32 buffer over all trainable variables (a variable without a gradient
contributes zeros), one ``hvd_compress.ops.compression`` call per step, the selection over the whole buffer
(global top-k; the torch face's comment on why). The state is the error (and DGC's velocity with
``topk(ratio, momentum=mu)``), per rank, and the step count (random-k's RNG position), alike on every rank.
One call per step (``tensorflow.stateful_reduction``): a call that any rank rejects (NaN/Inf, mismatched ranks)
raises on every rank before any variable is assigned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hvd_compress import ops
from hvd_compress.ops.compression import Compressor
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.algorithm_step import StateShapes
from hvd_compress.tensorflow.backend import aligned_copy
from hvd_compress.tensorflow.functions import CompressionState
from hvd_compress.tensorflow.stateful_reduction import StatefulReduction


class ErrorFeedbackReduction(StatefulReduction):
    """The stateful-compressor reduction of one wrapper: ``compressor`` (top-k or random-k) under ``op`` (Average
    or Sum) over the float32 variables of ``shapes``, in order."""

    #: State variables that differ between ranks by design (never broadcast).
    per_rank = ("compression_error", "compression_velocity")

    def __init__(self, compressor: Compressor, op: ReduceOp, shapes: Sequence[tuple[int, ...]],
                 meter: CommMeter) -> None:
        super().__init__(shapes)
        self.compressor, self.op, self.meter = compressor, ReduceOp(op), meter
        self.what = f"compression={compressor!r}"
        self.numel = self.layout.numel
        self._state = CompressionState(self.numel, compressor)  # its buffers are replaced by each call's copies

    def state_shapes(self) -> StateShapes:
        n = self.numel
        shapes = {"compression_error": ((n,), "float32", "zeros")}
        if self.compressor.momentum:
            shapes["compression_velocity"] = ((n,), "float32", "zeros")
        shapes["compression_step"] = ((), "int64", "zeros")
        return shapes

    def run(self, name: str, grads: Sequence[np.ndarray], saved: Sequence[np.ndarray]) -> list[np.ndarray]:
        flat = self.layout.flatten(grads)
        # Fresh arrays every call: TF adopts what is returned (no copy) and the inputs alias its buffers.
        state = self._state
        state.error = aligned_copy(np.asarray(saved[0]).reshape(-1))
        if self.compressor.momentum:
            state.velocity = aligned_copy(np.asarray(saved[1]).reshape(-1))
        state.step = int(saved[-1])
        self.meter.run(ops.allreduce_, flat, op=self.op, name=name, compression=self.compressor, state=state)
        out = self.layout.views(flat)
        out.append(state.error)
        if self.compressor.momentum:
            out.append(state.velocity)
        out.append(np.asarray(state.step, dtype=np.int64))
        return out


def check_inner_momentum(compressor: Compressor, inner: Any) -> None:
    """With DGC momentum the reduced gradient already carries the momentum: an inner optimizer with its own (SGD's
    ``momentum``, Adam's ``beta_1``) would apply it twice, so it is refused (as the torch face does)."""
    if not compressor.momentum:
        return
    own = getattr(inner, "momentum", 0.0) or getattr(inner, "beta_1", 0.0)
    if not isinstance(own, (int, float)) or own:
        raise ValueError(
            f"compression={compressor!r} applies momentum {compressor.momentum} inside the compression (DGC "
            f"momentum correction); the wrapped {type(inner).__name__} has its own momentum {own}, which would apply "
            "it twice: wrap keras.optimizers.SGD(learning_rate, momentum=0.0)"
        )
