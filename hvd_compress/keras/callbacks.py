"""Keras 3 callbacks: ``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``,
``LearningRateScheduleCallback`` and ``LearningRateWarmupCallback``, as Horovod's, and
``SynchronizeParametersCallback`` for SLAMB (its parameters are averaged only every ``sync_interval`` steps).

Horovod 0.28's own metric and learning-rate callbacks call ``keras.backend.constant`` and ``get_value``, which Keras 3
no longer has: with TF 2.16 or later installed they raise under either Keras, with any optimizer. Ours take the same
arguments.

``BroadcastGlobalVariablesCallback`` and ``MetricAverageCallback`` also guard ``fit()`` against uneven data
(``EvenSteps``): hvd_compress's ops run every step on every rank, so a rank with fewer batches would leave the others
waiting in a step's collective until the timeout."""

from __future__ import annotations

import warnings
from collections.abc import Collection
from typing import Any

import keras
import numpy as np

from hvd_compress import ops
from hvd_compress.algorithms import agreement
from hvd_compress.keras import per_rank_state
from hvd_compress.ops.errors import MismatchError
from hvd_compress.tensorflow.context import ensure_init
from hvd_compress.tensorflow.functions import broadcast_variables


def distributed(optimizer: Any) -> Any:
    """The optimizer inside wrappers such as ``LossScaleOptimizer`` that has hvd_compress's methods, or None."""
    while optimizer is not None and not hasattr(optimizer, "per_rank_variables"):
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return optimizer


class EitherKeras:
    """Lets a Keras 3 callback of ours run in tf_keras's ``fit`` too, so that ``hck.callbacks`` serves whichever
    Keras the model is (tf_keras's ``CallbackList`` asks these; only the learning-rate callbacks have batch hooks,
    in training)."""

    train_batch_hooks = False

    def _implements_train_batch_hooks(self) -> bool:
        return self.train_batch_hooks

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False


class EvenSteps:
    """Uneven data in ``fit()`` raises ``MismatchError`` on every rank within seconds, naming the step counts, where
    the ranks with more batches would otherwise wait in their next step's collective until the timeout. At the start
    of training every rank allgathers its batches per epoch and epochs as ``fit`` knows them (arrays, a ``tf.data``
    of known cardinality) and all raise, naming each rank's, where they differ. At the end a rank calls ``join()``
    (the core's, as torch's ``hc.join()``): where every rank finished it returns; a rank that finished while others
    are still in a step's collective (data of unknown length, a ``fit`` stopped early on some ranks) makes every rank
    raise, naming the ranks that joined, and that rank its own step count. One tiny collective at each end."""

    model: Any
    params: Any
    train_batch_hooks = True  # the count of this fit's steps (tf_keras calls batch hooks only where asked)
    async_safe = True  # Keras 3: the count may run off the training thread
    steps_taken = epoch_start = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._supports_tf_logs = True  # tf_keras: the count reads no logs, so no batch's logs are copied to NumPy

    def _check_even_steps(self) -> None:
        ensure_init()
        self.steps_taken = self.epoch_start = 0
        params = getattr(self, "params", None) or {}
        steps, epochs = params.get("steps"), params.get("epochs")
        mine = np.array([[-1 if steps is None else int(steps), -1 if epochs is None else int(epochs)]], np.int64)
        data, _ = ops.allgather(mine, name="fit.steps_per_epoch")
        everyone = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.int64).reshape(-1, 2)
        if (everyone < 0).any() or (everyone == everyone[0]).all():
            return  # a length some rank does not know: the join at the end catches what differs
        per_rank = "; ".join(f"rank {r}={s}" for r, s in enumerate(everyone[:, 0]))
        epochs_per_rank = "; ".join(f"rank {r}={e}" for r, e in enumerate(everyone[:, 1]))
        raise MismatchError(
            f"fit(): the ranks have different numbers of steps (uneven data): steps per epoch: {per_rank}; epochs: "
            f"{epochs_per_rank}. hvd_compress's ops run every step on every rank: give every rank the same number "
            "of batches (shard the data evenly and drop the remainder, or pass the same steps_per_epoch to fit on "
            "every rank)")

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch_start = self.steps_taken

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        # ``batch``: the epoch's last step run (with steps_per_execution, the last of the execution's)
        self.steps_taken = self.epoch_start + int(batch) + 1

    def _join_at_end(self) -> None:
        ensure_init()
        try:
            ops.join()
        except MismatchError as e:
            raise MismatchError(f"fit() ended on rank {ops.rank()} after {self.steps_taken} steps while other ranks "
                                f"were still in a step (uneven data): {e}") from None


class BroadcastMixin(EvenSteps):
    """The body of both Keras flavours' ``BroadcastGlobalVariablesCallback`` (Keras 3 here, tf_keras in
    ``hvd_compress.keras.legacy``): only their ``Callback`` base differs."""

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs: Any = None) -> None:
        self._check_even_steps()
        if not self.broadcast_done:
            broadcast_model(self.model, self.root_rank)
            self.broadcast_done = True

    def on_train_end(self, logs: Any = None) -> None:
        self._join_at_end()


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
    details = {"model variables": len(variables)}
    if optimizer is not None:
        if not (getattr(optimizer, "built", False) or getattr(optimizer, "_built", False)):
            optimizer.build(model.trainable_variables)
        own = {id(v) for v in getattr(distributed(optimizer), "per_rank_variables", [])}  # per-rank error feedback
        kept = [v for v in optimizer.variables if id(v) not in own]
        variables += kept
        details.update({"optimizer": optimizer_text(optimizer), "optimizer variables": len(kept)})
    # The call names carry the optimizer and the variable counts: ranks whose optimizers differ are told so (the
    # core names each that differs, with every rank's) before the first variable whose size differs.
    try:
        broadcast_variables(variables, root_rank=root_rank,
                            name=agreement.with_details("BroadcastGlobalVariablesCallback", details))
    except MismatchError as e:
        if not {"optimizer", "optimizer variables"}.intersection(agreement.differing_fields(e)):
            raise
        raise MismatchError(f"{e}\n  The ranks' optimizers differ (their op, options or wrapped optimizer, and so "
                            "the layout of their state): build the same optimizer on every rank") from e
    ours = distributed(optimizer)
    if ours is not None:  # each rank's part of a file the root loaded (per_rank_state)
        per_rank_state.broadcast(ours, root_rank, "BroadcastGlobalVariablesCallback")


def optimizer_text(optimizer: Any) -> str:
    """``optimizer`` for a message: its class and, inside hvd_compress's wrapper, its op and options, then the
    optimizers it wraps (``LossScaleOptimizer`` around ``DistributedOptimizer(op=OneBitAdam, freeze_step=10)``
    around ``Adam``)."""
    parts = []
    while optimizer is not None:
        text = type(optimizer).__name__
        if hasattr(optimizer, "per_rank_variables") and hasattr(optimizer, "op"):
            options = sorted(getattr(optimizer, "algorithm_options", {}).items())
            text += f"(op={getattr(optimizer.op, 'name', optimizer.op)}" + "".join(
                f", {k}={v!r}" for k, v in options) + ")"
        parts.append(text)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return " around ".join(parts)


class GatherPerRankStateMixin:
    """The body of both Keras flavours' ``GatherPerRankStateCallback``: at the end of each epoch every rank's
    per-rank optimizer state is gathered (``opt.gather_per_rank_state()``, a collective), so that rank 0's
    ``ModelCheckpoint`` listed after this callback saves it in its one file. ``every_epoch=False``: at the end of
    training only (a ``model.save`` after ``fit``)."""

    def __init__(self, every_epoch: bool = True) -> None:
        super().__init__()
        self.every_epoch = every_epoch

    def _gather(self) -> None:
        optimizer = distributed(getattr(self.model, "optimizer", None))
        if optimizer is not None:
            optimizer.gather_per_rank_state()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.every_epoch:
            self._gather()

    def on_train_end(self, logs: Any = None) -> None:
        self._gather()


class GatherPerRankStateCallback(GatherPerRankStateMixin, EitherKeras, keras.callbacks.Callback):
    """Every rank's per-rank optimizer state (error feedback, local moments) gathered at the end of each epoch, for
    rank 0's one checkpoint to resume every rank exactly: list it before ``ModelCheckpoint``, on every rank."""


class MetricAverageMixin(EvenSteps):
    """The body of both Keras flavours' ``MetricAverageCallback``: at the end of each epoch, replaces each numeric
    metric in ``logs`` by its average over all ranks (in the sorted order of the metric names, so every rank
    reduces the same values in the same order)."""

    def on_train_begin(self, logs: Any = None) -> None:
        self._check_even_steps()

    def on_train_end(self, logs: Any = None) -> None:
        self._join_at_end()

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


def _value(v: Any) -> float:
    return float(np.asarray(v))


class LearningRateScheduleMixin:
    """The body of both Keras flavours' ``LearningRateScheduleCallback``: Horovod's rule and arguments. Within
    epochs [``start_epoch``, ``end_epoch``) the learning rate is ``initial_lr * multiplier(epoch)``, set at each
    epoch's first batch (``staircase``) or at every batch with ``epoch`` fractional (batch / ``steps_per_epoch``,
    read from ``fit``'s parameters when not given); a number as ``multiplier`` means ``multiplier ** (epoch -
    start_epoch)``. ``momentum_correction`` (Goyal et al. 2017, section 2.1: the momentum scaled by new lr / old lr
    for the batch that changes it) applies where the optimizer's momentum is a variable; a number (Keras 3's and
    tf_keras's optimizers, which read it once into the traced step) is left alone, with a warning."""

    def __init__(self, initial_lr: float, multiplier: Any, start_epoch: int = 0, end_epoch: int | None = None,
                 staircase: bool = True, momentum_correction: bool = True, steps_per_epoch: int | None = None) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
        self.staircase, self.momentum_correction, self.steps_per_epoch = staircase, momentum_correction, steps_per_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier ** (epoch - start_epoch))
        self.train_batch_hooks = True
        self.current_epoch = 0
        self.restore_momentum: tuple[Any, float] | None = None
        self.warned = False

    def on_train_begin(self, logs: Any = None) -> None:
        if self.staircase or self.steps_per_epoch:
            return
        params = getattr(self, "params", None) or {}
        if params.get("steps"):
            self.steps_per_epoch = params["steps"]
        elif params.get("samples") and params.get("batch_size"):
            self.steps_per_epoch = params["samples"] // params["batch_size"]
        else:
            raise ValueError(f"{type(self).__name__}: could not read the number of steps per epoch from fit(); "
                             "give steps_per_epoch=")

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust(epoch)
        else:
            self._adjust(epoch + batch / self.steps_per_epoch)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.restore_momentum is not None:
            variable, value = self.restore_momentum
            variable.assign(value)
            self.restore_momentum = None

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if logs is not None:
            logs["lr"] = _value(self.model.optimizer.learning_rate)

    def _adjust(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old = _value(optimizer.learning_rate)
        new = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new
        momentum = getattr(optimizer, "momentum", None)
        if not self.momentum_correction or momentum is None or old == 0:
            return
        if hasattr(momentum, "assign"):
            value = _value(momentum)
            momentum.assign(value * new / old)
            self.restore_momentum = (momentum, value)
        elif not self.warned and new != old:
            self.warned = True
            warnings.warn(f"{type(self).__name__}: momentum_correction not applied: the optimizer's momentum is a "
                          "number, which Keras reads once into the traced step; pass momentum_correction=False",
                          stacklevel=2)


class LearningRateWarmupMixin(LearningRateScheduleMixin):
    """The body of both Keras flavours' ``LearningRateWarmupCallback``: Horovod's gradual warm-up (Goyal et al.
    2017, section 2.2) from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``, set at every batch."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            epoch += 1.0 / self.steps_per_epoch  # Horovod's: the warm-up ends at an epoch's last batch
            size = ops.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_train_begin(self, logs: Any = None) -> None:
        ensure_init()
        super().on_train_begin(logs)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and ops.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_value(self.model.optimizer.learning_rate):g}.")


class LearningRateScheduleCallback(LearningRateScheduleMixin, EitherKeras, keras.callbacks.Callback):
    """Horovod's ``LearningRateScheduleCallback``, which serves either Keras: ``initial_lr * multiplier(epoch)``
    within [``start_epoch``, ``end_epoch``), per epoch (``staircase``) or per batch."""


class LearningRateWarmupCallback(LearningRateWarmupMixin, EitherKeras, keras.callbacks.Callback):
    """Horovod's ``LearningRateWarmupCallback``, which serves either Keras: from ``initial_lr / size`` to
    ``initial_lr`` over ``warmup_epochs``, at every batch."""


class MetricAverageCallback(MetricAverageMixin, EitherKeras, keras.callbacks.Callback):
    """At the end of each epoch, every numeric metric in ``logs`` becomes its average over all ranks (as
    Horovod's); put it before callbacks that read the metrics."""


class SynchronizeParametersCallback(SynchronizeParametersMixin, EitherKeras, keras.callbacks.Callback):
    """Calls ``model.optimizer.synchronize_parameters()`` (SLAMB, 0/1 Adam: one dense average of the parameters) at
    the end of training, and at the end of every epoch with ``every_epoch=True`` (so evaluation, checkpoints and
    other callbacks see the same parameters on every rank). Put it before callbacks that read the parameters. Other
    ops: nothing to do."""
