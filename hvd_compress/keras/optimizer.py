"""``hck.DistributedOptimizer``: a Keras 3 optimizer wrapper in the style of ``keras.optimizers.LossScaleOptimizer``.

It holds the inner optimizer, delegates ``learning_rate`` (schedules too) and ``iterations`` to it, and adds its
own variables beside the inner ones. What each op does in ``apply``:

- ``Average``/``Sum``: the gradients reduced in buckets while backward runs (``tensorflow.bucketed``), then the
  inner optimizer's ``apply``; with top-k/random-k ``compression``, one fused reduction of all the gradients with
  the error feedback in this optimizer's variables (``tensorflow.error_feedback``).
- ``Adasum``: the inner optimizer steps on this rank's gradients, then the parameter deltas are Adasum-reduced
  (paper 002, Section 4.1; buckets as ``algorithms.adasum_delta.plan_buckets``) and applied to the start values.
- an algorithm of ``hvd_compress.algorithms.REGISTRY`` (1-bit Adam, 1-bit LAMB, SLAMB, Birder): the algorithm's
  own step over the fused bucket of all trainable variables, with its state in this optimizer's variables
  (``hvd_compress.tensorflow.algorithm_step``). The inner optimizer supplies the hyper-parameters only.
Each communicating step is one ``tf.numpy_function(stateful=True)``, so ranks issue their collectives in
program order, and every step-dependent decision is taken at run time, not at trace time.
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from hvd_compress.keras.birder import Birder
from hvd_compress.keras.engine import EngineMethods, Face, KerasEngine, inner_attribute
from hvd_compress.keras.loss_scale import refuse_scaler_inside
from hvd_compress.keras.wrapped_step import check_sgd, compression_from_config, lamb_flags
from hvd_compress.ops.constants import ReduceOp


def _in_xla() -> bool:
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _under_plain_loss_scaler() -> bool:
    """True if ``apply`` was called by Keras's own ``LossScaleOptimizer`` (which ``model.compile`` puts around the
    optimizer under mixed_float16): its skip decision is this rank's alone, a deadlock when one rank overflows.
    Read from the caller's frame (frames: this function, ``apply``, its caller)."""
    caller = sys._getframe(2).f_locals.get("self")
    plain = isinstance(caller, keras.optimizers.LossScaleOptimizer)
    return plain and not getattr(caller.inner_optimizer, "_hvdc_loss_scale_agreed", False)


def _check_inner(optimizer: Any) -> None:
    module = type(optimizer).__module__
    horovod_like = hasattr(optimizer, "_allreduce_grads") or hasattr(optimizer, "_aggregated_gradients")
    if module.startswith("horovod") or horovod_like:
        raise TypeError(
            "hck.DistributedOptimizer got a Horovod DistributedOptimizer: pass the plain Keras optimizer "
            "(hck.DistributedOptimizer(keras.optimizers.Adam(...), op=...)); Horovod's wrapper does not reduce "
            "anything under Keras 3"
        )
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"hck.DistributedOptimizer wraps a Keras 3 optimizer, got {type(optimizer).__module__}."
            f"{type(optimizer).__name__}"
        )
    refuse_scaler_inside(optimizer, (keras.optimizers.LossScaleOptimizer,),
                         "hck.LossScaleOptimizer(hck.DistributedOptimizer(opt, op=...))")


def _adam(op_name: str, inner: Any, lamb_opts: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """(beta1, beta2, eps, weight_decay) of a Keras Adam/AdamW and the rule's flags. Any other optimizer (a Lamb
    too) is refused: the rule is Adam's, and would step on another optimizer's hyper-parameters as if Adam's."""
    if not isinstance(inner, keras.optimizers.Adam):
        raise TypeError(f"op={op_name} wraps keras.optimizers.Adam or AdamW, got {type(inner).__name__}")
    if inner.amsgrad:
        raise ValueError(f"op={op_name} does not support amsgrad=True")
    flags = {"decoupled_weight_decay": True}  # Keras applies weight_decay decoupled (as AdamW) on every optimizer
    return [inner.beta_1, inner.beta_2, inner.epsilon, inner.weight_decay or 0.0], flags


def _lamb(op_name: str, inner: Any, lamb_opts: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """(beta1, beta2, eps, weight_decay) of a Keras Lamb and the rule's flags (the LAMB options given, at
    ``hc.Lamb``'s defaults otherwise)."""
    if not isinstance(inner, keras.optimizers.Lamb):
        raise TypeError(f"op={op_name} wraps keras.optimizers.Lamb, got {type(inner).__name__}")
    return [inner.beta_1, inner.beta_2, inner.epsilon, inner.weight_decay or 0.0], lamb_flags(lamb_opts)


def _birder(op_name: str, inner: Any, lamb_opts: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    if not isinstance(inner, Birder):
        raise TypeError(f"op={op_name} wraps hck.Birder, got {type(inner).__name__}")
    return [inner.beta, inner.epsilon, inner.birder_weight_decay], {}


#: Keras 3's optimizers per kind an algorithm wraps (``engine.Face``).
_FACE = Face(
    readers={"adam": _adam, "lamb": _lamb, "slamb-lamb": _lamb, "birder": _birder,
             "sgd": lambda op_name, inner, lamb_opts: check_sgd(op_name, inner, keras.optimizers.SGD)},
    apply_inner=lambda inner, grads, variables: inner.apply(grads, variables),
    learning_rate=lambda inner: inner.learning_rate,
    method="apply",
)


@keras.saving.register_keras_serializable(package="hvd_compress")
class DistributedOptimizer(EngineMethods, keras.optimizers.Optimizer):
    """Data-parallel training over all ranks around ``optimizer`` (a Keras 3 optimizer).

    ``op``: ``Average`` (default), ``Sum``, ``Adasum``, ``OneBitAdam`` (wraps ``Adam``/``AdamW``), ``OneBitLamb``
    and ``SLAMB`` (wrap ``Lamb``; options ``min_coeff``/``max_coeff`` clip its trust ratio, defaults 0.01/10 as
    ``hc.Lamb``), ``Birder`` (wraps ``hck.Birder``), or any other algorithm of ``hvd_compress.algorithms.REGISTRY``
    (its page in docs/algorithms/ says what it wraps), with the algorithm's options (``freeze_step``,
    ``variance_floor``, SLAMB's ``compress_ratio``, ``sync_interval``, ``beta3``, ``seed``, ...; Birder's
    ``hierarchical``, ``seed``). SLAMB's parameters are alike on every rank only after a step t with
    t % sync_interval == 0 and after ``synchronize_parameters()`` (``hck.callbacks.SynchronizeParametersCallback``);
    0/1 Adam's after a sync step and after ``synchronize_parameters()``, which the step after a change made to the
    variables after the freeze runs itself (the next sync would replace the change: spec Z20).
    ``backward_passes_per_step``: gradients are summed locally over that many calls of ``apply`` and the step runs
    on the last. ``compression`` (``Average``/``Sum``): ``hc.Compression.none``, ``fp16`` or ``bf16`` on the wire
    for the gradient buckets (Horovod's ``hvd.Compression.fp16`` too), or ``hc.Compression.topk(ratio)`` (with
    DGC's ``momentum=``: wrap ``SGD(momentum=0)``) / ``randomk(ratio, seed)``: error feedback per rank in this
    optimizer's variables (saved with it, never broadcast), float32 variables. Not under XLA: compile with
    ``jit_compile=False``. Under mixed_float16 wrap it in ``hck.LossScaleOptimizer``.
    """

    def __new__(cls, optimizer: Any = None, op: Any = ReduceOp.Average, backward_passes_per_step: int = 1,
                name: str | None = None, compression: Any = None, **algorithm_options: Any) -> Any:
        """A tf_keras optimizer (``TF_USE_LEGACY_KERAS=1``) gets ``hvd_compress.keras.legacy``'s wrapper."""
        if optimizer is not None and any(c.__module__.startswith("tf_keras")
                                         for c in type(optimizer).__mro__):
            from hvd_compress.keras import legacy  # imports tf_keras: only for its optimizers

            # Not an instance of cls, so Python does not run __init__ on it.
            return legacy.DistributedOptimizer(optimizer, op, backward_passes_per_step, name, compression,
                                               **algorithm_options)
        return super().__new__(cls)

    def __init__(self, optimizer: keras.optimizers.Optimizer, op: Any = ReduceOp.Average,
                 backward_passes_per_step: int = 1, name: str | None = None, compression: Any = None,
                 **algorithm_options: Any) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer.inner_optimizer  # re-wrapping wraps the optimizer inside (as the torch face)
        _check_inner(optimizer)
        name = name or f"Distributed{type(optimizer).__name__}"
        engine = KerasEngine(optimizer, op, backward_passes_per_step, compression, algorithm_options, _FACE, name)
        super().__init__(learning_rate=0.0, name=name)
        self._hold(engine)

    # -- delegation, as LossScaleOptimizer (learning_rate, iterations: ``EngineMethods``) --------------
    # Keras's fixed loss scale (its advice for a LossScaleOptimizer without dynamic scaling) is the inner
    # optimizer's: ``scale_loss``, which model.fit calls on this wrapper, scales the loss by it, and the inner
    # optimizer's ``apply`` (or the algorithm's step, ``engine.unscaled``) divides the gradients by it.
    loss_scale_factor = inner_attribute("loss_scale_factor", "Keras's fixed loss scale")

    @property
    def variables(self) -> list[Any]:
        return self._variables + self.inner_optimizer.variables

    def finalize_variable_values(self, var_list: Any) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)

    def build(self, var_list: list[Any]) -> None:
        if self.built:  # as Keras's own optimizers: a second build (before a checkpoint restore) keeps the state
            return
        if not list(var_list):
            # Keras's HDF5 loader builds the optimizer on a Sequential model's own variables (none) before it
            # sets the saved state, which then fails for every optimizer (Keras warns and starts it afresh). Built
            # on nothing, this one would refuse the model's variables at the first step; left unbuilt, the first
            # step builds it, as Keras's own optimizers start again.
            return
        self._hvdc.build(var_list, self.add_variable, self.add_variable_from_reference)
        super().build(var_list)
        self._stamp_owner()

    # -- the step ----------------------------------------------------------------------------------------
    def apply(self, grads: list[Any], trainable_variables: Any = None) -> None:
        if _in_xla():
            raise ValueError(
                "hvd_compress cannot run under XLA: compile the model with jit_compile=False "
                "(model.compile(..., jit_compile=False); Keras 3 turns XLA on by default where a GPU is visible) "
                "or use tf.function(jit_compile=False)"
            )
        if _under_plain_loss_scaler():
            raise ValueError(
                "hck.DistributedOptimizer is wrapped in keras.optimizers.LossScaleOptimizer (model.compile does this "
                "under mixed_float16): its overflow check is per rank, so one rank skipping a step would deadlock "
                "the others. Compile with optimizer=hck.LossScaleOptimizer(hck.DistributedOptimizer(...)), whose "
                "skip decision all ranks agree on"
            )
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        trainable_variables = list(trainable_variables)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
        self._hvdc.apply(grads, trainable_variables)

    # -- serialization -----------------------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
                **self._hvdc.config_entries()}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> DistributedOptimizer:
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        config["compression"] = compression_from_config(config.pop("compression", "none"))
        return cls(inner, **config)
