"""Keras 3 callbacks: ``BroadcastGlobalVariablesCallback`` and ``MetricAverageCallback``, as Horovod's, and
``SynchronizeParametersCallback`` for SLAMB (its parameters are averaged only every ``sync_interval`` steps)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import keras
import numpy as np

from hvd_compress import ops
from hvd_compress.tensorflow.context import ensure_init
from hvd_compress.tensorflow.functions import broadcast_variables


def distributed(optimizer: Any) -> Any:
    """The optimizer inside wrappers such as ``LossScaleOptimizer`` that has hvd_compress's methods, or None."""
    while optimizer is not None and not hasattr(optimizer, "per_rank_variables"):
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return optimizer


class EitherKeras:
    """Lets a Keras 3 callback of ours run in tf_keras's ``fit`` too, so that ``hck.callbacks`` serves whichever
    Keras the model is (tf_keras's ``CallbackList`` asks these; none of our callbacks has batch hooks)."""

    def _implements_train_batch_hooks(self) -> bool:
        return False

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False


class BroadcastMixin:
    """The body of both Keras flavours' ``BroadcastGlobalVariablesCallback`` (Keras 3 here, tf_keras in
    ``hvd_compress.keras.legacy``): only their ``Callback`` base differs."""

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs: Any = None) -> None:
        if not self.broadcast_done:
            broadcast_model(self.model, self.root_rank)
            self.broadcast_done = True


class SynchronizeParametersMixin:
    """The body of both Keras flavours' ``SynchronizeParametersCallback``."""

    def __init__(self, every_epoch: bool = False) -> None:
        super().__init__()
        self.every_epoch = every_epoch

    def _sync(self) -> None:
        optimizer = distributed(getattr(self.model, "optimizer", None))
        if optimizer is not None:
            optimizer.synchronize_parameters()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.every_epoch:
            self._sync()

    def on_train_end(self, logs: Any = None) -> None:
        if not self.every_epoch:
            self._sync()


class BroadcastGlobalVariablesCallback(BroadcastMixin, EitherKeras, keras.callbacks.Callback):
    """At the start of training, every rank takes ``root_rank``'s model and optimizer variables.

    The optimizer is built first (on the model's trainable variables), so its variables (iterations, moments,
    compression state) are broadcast too: a model loaded on one rank continues alike on all of them."""


def broadcast_model(model: Any, root_rank: int, local: Collection[Any] = ()) -> None:
    """Every rank takes ``root_rank``'s variables of ``model`` and of its optimizer (built first on the model's
    trainable variables), except the optimizer's ``per_rank_variables`` and the model variables whose ``ref()``
    is in ``local`` (Horovod's callback's ``local_variables``). Keras 3 and tf_keras models alike."""
    ensure_init()
    variables = [v for v in model.variables if not (local and hasattr(v, "ref") and v.ref() in local)]
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        if not (getattr(optimizer, "built", False) or getattr(optimizer, "_built", False)):
            optimizer.build(model.trainable_variables)
        own = {id(v) for v in getattr(distributed(optimizer), "per_rank_variables", [])}  # per-rank error feedback
        variables += [v for v in optimizer.variables if id(v) not in own]
    broadcast_variables(variables, root_rank=root_rank, name="BroadcastGlobalVariablesCallback")


class MetricAverageMixin:
    """The body of both Keras flavours' ``MetricAverageCallback``: at the end of each epoch, replaces each numeric
    metric in ``logs`` by its average over all ranks (in the sorted order of the metric names, so every rank
    reduces the same values in the same order)."""

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not logs:
            return
        ensure_init()
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and isinstance(float(v), float))
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        if values.size:
            ops.allreduce_(values, op=ops.Average, name="MetricAverageCallback")
            for k, v in zip(keys, values, strict=True):
                logs[k] = float(v)


class MetricAverageCallback(MetricAverageMixin, EitherKeras, keras.callbacks.Callback):
    """At the end of each epoch, every numeric metric in ``logs`` becomes its average over all ranks (as
    Horovod's); put it before callbacks that read the metrics."""


class SynchronizeParametersCallback(SynchronizeParametersMixin, EitherKeras, keras.callbacks.Callback):
    """Calls ``model.optimizer.synchronize_parameters()`` (SLAMB, 0/1 Adam: one dense average of the parameters) at
    the end of training, and at the end of every epoch with ``every_epoch=True`` (so evaluation, checkpoints and
    other callbacks see the same parameters on every rank). Put it before callbacks that read the parameters. Other
    ops: nothing to do."""
