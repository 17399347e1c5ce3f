"""tf_keras (``TF_USE_LEGACY_KERAS=1``, ``tf.keras`` of TF >= 2.16 then): ``hck.DistributedOptimizer`` given a
tf_keras optimizer returns this wrapper; ``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``,
``SynchronizeParametersCallback`` and the learning-rate callbacks are the tf_keras callbacks, ``Birder`` the
tf_keras twin of ``hck.Birder``.

A wrapper as tf_keras's own ``LossScaleOptimizer`` is one: it holds the inner optimizer, delegates ``learning_rate``
(schedules too) and ``iterations``, and adds its variables beside the inner ones. ``model.fit`` calls
``apply_gradients`` (via ``minimize``), where the step runs: the engine the Keras 3 wrapper holds too
(``hvd_compress.keras.engine``), over tf_keras's optimizer API. tf_keras has no LAMB, so
``OneBitLamb`` and ``SLAMB`` wrap a tf_keras ``Adam``/``AdamW`` that only supplies their hyper-parameters.

Under mixed_float16 compile with ``legacy.LossScaleOptimizer(hck.DistributedOptimizer(...))``: tf_keras's dynamic
loss scaling whose skip decision all ranks agree on (as ``hck.LossScaleOptimizer``); the plain tf_keras one, which
``model.compile`` puts around any optimizer under mixed_float16, is refused (a one-rank skip would deadlock).
The ops, their options and their state: docs/tensorflow-keras.md.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf
import tf_keras
from tf_keras.src.mixed_precision import loss_scale_optimizer as tf_keras_lso

from hvd_compress.algorithms import birder as birder_alg
from hvd_compress.keras import birder as keras_birder
from hvd_compress.keras.callbacks import (
    BroadcastMixin,
    GatherPerRankStateMixin,
    LearningRateScheduleMixin,
    LearningRateWarmupMixin,
    MetricAverageMixin,
    SynchronizeParametersMixin,
)
from hvd_compress.keras.engine import EngineMethods, Face, KerasEngine
from hvd_compress.keras.loss_scale import InnerExclusions, agreed_all_finite, check_meter, refuse_scaler_inside
from hvd_compress.keras.wrapped_step import check_sgd, compression_from_config, lamb_flags
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.tensorflow.functions import check_not_xla


def is_tf_keras_optimizer(optimizer: Any) -> bool:
    return isinstance(optimizer, tf_keras.optimizers.Optimizer)


class Birder(tf_keras.optimizers.Optimizer):
    """Birder's rule without compression (SoftSignSGD of paper 004) as a tf_keras optimizer: the twin of
    ``hck.Birder`` (same update, ``hvd_compress.keras.birder.update_variable``). Wrapped by
    ``hck.DistributedOptimizer(legacy.Birder(...), op=hck.Birder)`` it supplies the 1-bit algorithm's
    hyper-parameters. float32 variables."""

    hvdc_op = birder_alg.BirderAlgorithm.op  # as op=, the class names its algorithm

    def __init__(self, learning_rate: Any = 1e-3, beta: float = 0.95, epsilon: float = 1e-8,
                 weight_decay: float = 0.0, name: str = "birder", **kwargs: Any) -> None:
        lr = learning_rate if isinstance(learning_rate, (int, float)) else birder_alg.DEFAULTS["lr"]
        birder_alg.check_hyperparameters(float(lr), float(beta), float(epsilon), float(weight_decay))
        kwargs.pop("weight_decay", None)
        super().__init__(name=name, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.beta = float(beta)
        self.epsilon = float(epsilon)
        self.birder_weight_decay = float(weight_decay)  # not tf_keras's weight_decay: the rule applies its own

    def build(self, var_list: list[Any]) -> None:
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        bad = [v.name for v in var_list if v.dtype != tf.float32]
        if bad:
            raise ValueError(f"Birder supports float32 variables (mixed_float16 keeps them), not {bad}")
        self._built = True
        self._m = [self.add_variable_from_reference(model_variable=v, variable_name="exp_avg") for v in var_list]
        self._b = [self.add_variable_from_reference(model_variable=v, variable_name="exp_avg_abs") for v in var_list]

    def update_step(self, gradient: Any, variable: Any) -> None:
        i = self._index_dict[self._var_key(variable)]
        keras_birder.update_variable(f"{self.name}.update", gradient, variable, self._m[i], self._b[i],
                                     self.learning_rate, self.beta, self.epsilon, self.birder_weight_decay)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(learning_rate=self._serialize_hyperparameter(self._learning_rate), beta=self.beta,
                      epsilon=self.epsilon, weight_decay=self.birder_weight_decay)
        return config


def _adam(op_name: str, inner: Any, lamb_opts: dict[str, Any], lamb: bool = False) -> tuple[list[Any], dict[str, Any]]:
    """(beta1, beta2, eps, weight_decay) of a tf_keras Adam/AdamW and the rule's flags (LAMB's: the LAMB options
    given, at ``hc.Lamb``'s defaults otherwise)."""
    if not isinstance(inner, (tf_keras.optimizers.Adam, tf_keras.optimizers.AdamW)):
        note = " (tf_keras has no LAMB: Adam supplies LAMB's hyper-parameters)" if lamb else ""
        raise TypeError(f"op={op_name} wraps tf_keras.optimizers.Adam/AdamW{note}, got {type(inner).__name__}")
    if inner.amsgrad:
        raise ValueError(f"op={op_name} does not support amsgrad=True")
    # tf_keras applies Adam's weight_decay decoupled (as AdamW); LAMB's sits in its update (the algorithm's).
    flags = lamb_flags(lamb_opts) if lamb else {"decoupled_weight_decay": True}
    return [inner.beta_1, inner.beta_2, inner.epsilon, inner.weight_decay or 0.0], flags


def _birder(op_name: str, inner: Any, lamb_opts: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    if not isinstance(inner, Birder):
        raise TypeError(f"op={op_name} under tf_keras wraps hvd_compress.keras.legacy.Birder, got "
                        f"{type(inner).__name__}")
    return [inner.beta, inner.epsilon, inner.birder_weight_decay], {}


def _learning_rate(inner: Any) -> Any:
    """What the inner optimizer's ``apply_gradients`` does first: a schedule's value for this step."""
    inner._compute_current_learning_rate()
    return inner.learning_rate


_LAMB = functools.partial(_adam, lamb=True)
#: tf_keras's optimizers per kind an algorithm wraps (``engine.Face``).
_FACE = Face(
    readers={"adam": _adam, "lamb": _LAMB, "slamb-lamb": _LAMB, "birder": _birder,
             "sgd": lambda op_name, inner, lamb_opts: check_sgd(op_name, inner, tf_keras.optimizers.SGD)},
    apply_inner=lambda inner, grads, variables: inner.apply_gradients(zip(grads, variables, strict=True),
                                                                      skip_gradients_aggregation=True),
    learning_rate=_learning_rate,
    method="apply_gradients",
)


@tf_keras.saving.register_keras_serializable(package="hvd_compress")  # an HDF5 file names the class only
class DistributedOptimizer(EngineMethods, tf_keras.optimizers.Optimizer):
    """Data-parallel training over all ranks around a tf_keras ``optimizer``: ``op`` = ``Average`` (default),
    ``Sum``, ``Adasum``, ``OneBitAdam``, ``OneBitLamb``, ``SLAMB`` (wrap ``Adam``/``AdamW``) or ``Birder`` (wraps
    ``legacy.Birder``), with the algorithm's options, and ``backward_passes_per_step``; see the module. Not under
    XLA (``jit_compile=False``)."""

    def __init__(self, optimizer: tf_keras.optimizers.Optimizer, op: Any = ReduceOp.Average,
                 backward_passes_per_step: int = 1, name: str | None = None, compression: Any = None,
                 **algorithm_options: Any) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer.inner_optimizer
        if not is_tf_keras_optimizer(optimizer):
            raise TypeError(f"expected a tf_keras optimizer, got {type(optimizer).__name__}")
        refuse_scaler_inside(optimizer, (tf_keras_lso.BaseLossScaleOptimizer,),
                             "hvd_compress.keras.legacy.LossScaleOptimizer(hck.DistributedOptimizer(opt, op=...))")
        name = name or f"Distributed{type(optimizer).__name__}"
        engine = KerasEngine(optimizer, op, backward_passes_per_step, compression, algorithm_options, _FACE, name)
        super().__init__(name=name, jit_compile=False)
        self._hold(engine)

    # -- delegation, as LossScaleOptimizer (learning_rate, iterations: ``EngineMethods``) --------------
    @property
    def variables(self) -> list[Any]:
        own = super().variables  # tf_keras's callable list: some of its code calls optimizer.variables()
        return type(own)([*own, *self.inner_optimizer.variables])

    def _create_iteration_variable(self) -> None:
        """The counter tf_keras's base class makes for itself, which ``iterations`` (the inner optimizer's) leaves
        unused, named apart from the inner one: an HDF5 file (``model.save("....h5")``) names each variable once.
        It stays among the variables, whose count and order the ``.keras`` format keys on."""
        with tf.init_scope():
            self._iterations = tf.Variable(0, name="hvdc_unused_iteration", dtype=tf.int64, trainable=False)
        self._variables.append(self._iterations)

    def set_weights(self, weights: list[Any]) -> None:
        """Every variable's value, in the order of ``variables`` (the wrapper's, then the inner optimizer's), as an
        HDF5 file holds them; tf_keras's base class would set the wrapper's own only and drop the rest."""
        variables = list(self.variables)
        if len(weights) != len(variables):
            raise ValueError(f"{self.name}.set_weights: {len(weights)} values for {len(variables)} variables (the "
                             "file was saved by another op, options or model)")
        for variable, value in zip(variables, weights, strict=True):
            variable.assign(value)

    def build(self, var_list: list[Any]) -> None:
        if getattr(self, "_built", False):
            return
        var_list = list(var_list)
        super().build(var_list)
        self._hvdc.build(var_list, self.add_variable, self.add_variable_from_reference)
        self._built = True
        self._stamp_owner()

    def apply_gradients(self, grads_and_vars: Any, name: str | None = None, skip_gradients_aggregation: bool = False,
                        **kwargs: Any) -> Any:
        check_not_xla(self.name)
        if getattr(self, "_is_wrapped_by_loss_scale_optimizer", False) and not getattr(
                self, "_hvdc_loss_scale_agreed", False):
            raise ValueError(
                "hck.DistributedOptimizer is wrapped in tf_keras's LossScaleOptimizer (model.compile does this under "
                "mixed_float16): its overflow check is per rank, so one rank skipping a step would deadlock the "
                "others. Compile with optimizer=hvd_compress.keras.legacy.LossScaleOptimizer("
                "hck.DistributedOptimizer(...)), whose skip decision all ranks agree on"
            )
        pairs = list(grads_and_vars)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        with tf.init_scope():
            self.build(variables)
        self._hvdc.apply(grads, variables)
        return self.iterations

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "optimizer": tf_keras.optimizers.serialize(self.inner_optimizer),
                **self._hvdc.config_entries()}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> DistributedOptimizer:
        config = dict(config)
        custom_objects = {"Birder": Birder, **(custom_objects or {})}
        inner = tf_keras.optimizers.deserialize(config.pop("optimizer"), custom_objects=custom_objects)
        config["compression"] = compression_from_config(config.pop("compression", "none"))
        return cls(inner, **config)


class _AgreedDynamicLossScaleState(tf_keras_lso._DynamicLossScaleState):
    """tf_keras's dynamic loss scale whose finite check counts the ranks with an Inf/NaN gradient."""

    def update(self, grads: Any) -> Any:
        finite = agreed_all_finite(tf.nest.flatten(grads), self._hvdc_meter, "LossScaleOptimizer.check_finite")
        # tf_keras's own update then decides on this one value: non-finite exactly where some rank overflowed.
        return super().update([tf.where(finite, tf.constant(0.0), tf.constant(float("nan")))])


@tf_keras.saving.register_keras_serializable(package="hvd_compress")
class LossScaleOptimizer(InnerExclusions, tf_keras_lso.LossScaleOptimizerV3):
    """tf_keras's ``LossScaleOptimizer`` with the skip decision agreed across ranks (the tf_keras twin of
    ``hck.LossScaleOptimizer``): an overflow on one rank skips the step (tf_keras still counts it in
    ``iterations``) and halves the loss scale on every rank."""

    def __init__(self, inner_optimizer: Any, dynamic: bool = True, initial_scale: float | None = None,
                 dynamic_growth_steps: int | None = None) -> None:
        if not dynamic:
            raise ValueError("hvd_compress.keras.legacy.LossScaleOptimizer is dynamic; a fixed loss scale never "
                             "skips a step, so use tf_keras's own")
        super().__init__(inner_optimizer, dynamic=True, initial_scale=initial_scale,
                         dynamic_growth_steps=dynamic_growth_steps)
        inner_optimizer._hvdc_loss_scale_agreed = True
        # The state is made and tracked inside tf_keras's __init__; a subclass of it that changes only update()
        # keeps its checkpoint format.
        self._loss_scale.__class__ = _AgreedDynamicLossScaleState
        self._loss_scale._hvdc_meter = check_meter(inner_optimizer)

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank sent and received since the last call: the optimizer's inside (``comm_stats``) with
        the finite checks', which it counts too."""
        return self._loss_scale._hvdc_meter.take()


class SynchronizeParametersCallback(SynchronizeParametersMixin, tf_keras.callbacks.Callback):
    """tf_keras twin of ``hck.callbacks.SynchronizeParametersCallback`` (SLAMB): ``synchronize_parameters()`` at
    the end of training, and of every epoch with ``every_epoch=True``."""


class BroadcastGlobalVariablesCallback(BroadcastMixin, tf_keras.callbacks.Callback):
    """tf_keras twin of ``hck.callbacks.BroadcastGlobalVariablesCallback``: at the start of training every rank
    takes ``root_rank``'s model and optimizer variables (the optimizer built first; per-rank error feedback
    stays)."""


class GatherPerRankStateCallback(GatherPerRankStateMixin, tf_keras.callbacks.Callback):
    """tf_keras twin of ``hck.callbacks.GatherPerRankStateCallback``: every rank's per-rank optimizer state gathered
    at the end of each epoch, for rank 0's one checkpoint (list it before ``ModelCheckpoint``)."""


class LearningRateScheduleCallback(LearningRateScheduleMixin, tf_keras.callbacks.Callback):
    """tf_keras twin of ``hck.callbacks.LearningRateScheduleCallback`` (Horovod's)."""


class LearningRateWarmupCallback(LearningRateWarmupMixin, tf_keras.callbacks.Callback):
    """tf_keras twin of ``hck.callbacks.LearningRateWarmupCallback`` (Horovod's)."""


class MetricAverageCallback(MetricAverageMixin, tf_keras.callbacks.Callback):
    """tf_keras twin of ``hck.callbacks.MetricAverageCallback``: at the end of each epoch every numeric metric in
    ``logs`` becomes its average over all ranks."""
