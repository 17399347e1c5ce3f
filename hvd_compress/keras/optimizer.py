"""``hck.DistributedOptimizer``: a Keras 3 optimizer wrapper in the style of ``keras.optimizers.LossScaleOptimizer``.

It holds the inner optimizer, delegates ``learning_rate`` (schedules too) and ``iterations`` to it, and adds its
own variables beside the inner ones. What each op does in ``apply``:

- ``Average``/``Sum``: the gradients reduced in buckets while backward runs (``tensorflow.bucketed``), then the
  inner optimizer's ``apply``; with top-k/random-k ``compression``, one fused reduction of all the gradients with
  the error feedback in this optimizer's variables (``tensorflow.error_feedback``).
- ``Adasum``: the inner optimizer steps on this rank's gradients, then the parameter deltas are Adasum-reduced
  (paper 002, Section 4.1; buckets as ``algorithms.adasum_delta.plan_buckets``) and applied to the start values.
- an algorithm of ``hvd_compress.algorithms.REGISTRY`` (1-bit Adam, 1-bit LAMB, SLAMB, Birder): the algorithm's
  own step over the fused segment of all trainable variables, with its state in this optimizer's variables
  (``hvd_compress.tensorflow.algorithm_step``). The inner optimizer supplies the hyper-parameters only.
Each communicating step is one ``tf.numpy_function(stateful=True)``, so ranks issue their collectives in
program order, and every step-dependent decision is taken at run time, not at trace time.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from hvd_compress import ops
from hvd_compress.keras.birder import Birder
from hvd_compress.keras.wrapped_step import (
    OpConfig,
    accumulate_then_step,
    adasum_delta_step,
    check_base_options,
    check_passes,
    check_sgd,
    compression_config,
    compression_from_config,
    error_feedback_step,
    parse_compression,
    parse_op,
    per_rank_variables,
    reset_error_feedback,
    stateful_reduction,
    synchronize_parameters,
)
from hvd_compress.ops.compression import Compression, Compressor
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.algorithm_step import FusedStep, apply_algorithm_step, make_step
from hvd_compress.tensorflow.bucketed import BucketStats, bucketed_allreduce
from hvd_compress.tensorflow.context import ensure_init
from hvd_compress.tensorflow.error_feedback import ErrorFeedbackReduction
from hvd_compress.tensorflow.functions import dense
from hvd_compress.tensorflow.powersgd import PowerSGDReduction


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


def _adam_or_lamb(op_name: str, inner: Any, lamb_opts: dict[str, Any], lamb_only: bool = False) -> tuple[
        list[Any], dict[str, Any]]:
    """(beta1, beta2, eps, weight_decay) of a Keras Adam/AdamW or Lamb and the rule's flags."""
    if lamb_only and not isinstance(inner, keras.optimizers.Lamb):
        raise TypeError(f"op={op_name} wraps keras.optimizers.Lamb, got {type(inner).__name__}")
    if isinstance(inner, keras.optimizers.Adam):
        if inner.amsgrad:
            raise ValueError(f"op={op_name} does not support amsgrad=True")
        flags = {"decoupled_weight_decay": True}  # Keras applies weight_decay decoupled (as AdamW) on every optimizer
    elif isinstance(inner, keras.optimizers.Lamb):
        flags = dict(lamb_opts)
    else:
        raise TypeError(f"op={op_name} wraps keras.optimizers.Adam/AdamW or Lamb, got {type(inner).__name__}")
    return [inner.beta_1, inner.beta_2, inner.epsilon, inner.weight_decay or 0.0], flags


def _birder(op_name: str, inner: Any, lamb_opts: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    if not isinstance(inner, Birder):
        raise TypeError(f"op={op_name} wraps hck.Birder, got {type(inner).__name__}")
    return [inner.beta, inner.epsilon, inner.birder_weight_decay], {}


#: Per kind an algorithm wraps (``algorithms.contract.Wraps``): its Keras 3 optimizers' hyper-parameters after lr
#: (``Wraps.hyper``, in order) and the rule's flags, or a TypeError/ValueError for an optimizer of another kind.
_READERS = {
    "adam": _adam_or_lamb,
    "lamb": _adam_or_lamb,
    "slamb-lamb": functools.partial(_adam_or_lamb, lamb_only=True),
    "birder": _birder,
    "sgd": lambda op_name, inner, lamb_opts: check_sgd(op_name, inner, keras.optimizers.SGD),
}


def _hyper_flags(algorithm: type, inner: keras.optimizers.Optimizer, lamb_opts: dict[str, Any]) -> tuple[
        list[Any], dict[str, Any]]:
    """The hyper-parameters after lr as read from ``inner`` (lr at run time: schedules act) and the rule's flags.
    Translation only: the update rule is the algorithm's (torch's Adam form: eps added to sqrt(v_hat))."""
    check_base_options(algorithm.name, inner)
    return _READERS[algorithm.wraps.kind](algorithm.name, inner, lamb_opts)


@keras.saving.register_keras_serializable(package="hvd_compress")
class DistributedOptimizer(keras.optimizers.Optimizer):
    """Data-parallel training over all ranks around ``optimizer`` (a Keras 3 optimizer).

    ``op``: ``Average`` (default), ``Sum``, ``Adasum``, ``OneBitAdam`` (wraps ``Adam``/``AdamW``), ``OneBitLamb``
    and ``SLAMB`` (wrap ``Lamb``; options ``min_coeff``/``max_coeff`` clip its trust ratio, defaults 0.01/10 as
    ``hc.Lamb``), ``Birder`` (wraps ``hck.Birder``), or any other algorithm of ``hvd_compress.algorithms.REGISTRY``
    (its page in docs/algorithms/ says what it wraps), with the algorithm's options (``freeze_step``,
    ``variance_floor``, SLAMB's ``compress_ratio``, ``sync_interval``, ``beta3``, ``seed``, ...; Birder's
    ``hierarchical``, ``seed``). SLAMB's parameters are alike on every rank only after a step t with
    t % sync_interval == 0 and after ``synchronize_parameters()`` (``hck.callbacks.SynchronizeParametersCallback``).
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
        config = parse_op(op, algorithm_options)
        check_passes(backward_passes_per_step)
        compressor, stateful = parse_compression(compression, config, optimizer, "hck.DistributedOptimizer")
        super().__init__(learning_rate=0.0, name=name or f"Distributed{type(optimizer).__name__}")
        self._compressor = compressor
        self._stateful_compressor: Compressor | None = stateful
        self._error_feedback: ErrorFeedbackReduction | PowerSGDReduction | None = None
        self.compression = stateful or compressor or Compression.none
        self.inner_optimizer = optimizer
        self.op = config.op
        self.backward_passes_per_step = backward_passes_per_step
        # process_set (the global set, checked) is no option to keep: get_config must stay plain data
        self.algorithm_options = {k: v for k, v in algorithm_options.items() if k != "process_set"}
        self._meter = CommMeter()
        self._buckets = BucketStats()  # Average/Sum: the gradient buckets started so far
        self._config: OpConfig = config
        self._algorithm: type | None = config.algorithm
        if config.algorithm is not None:
            self._hyper, self._flags = _hyper_flags(config.algorithm, optimizer, config.lamb_opts)
            self._options = config.options

    # -- delegation, as LossScaleOptimizer --------------------------------------------------------------
    @property
    def variables(self) -> list[Any]:
        return self._variables + self.inner_optimizer.variables

    @property
    def learning_rate(self) -> Any:
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate: Any) -> None:
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self) -> Any:
        return self.inner_optimizer.iterations

    def finalize_variable_values(self, var_list: Any) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank sent and received for this optimizer's reductions and algorithm steps since the last
        call."""
        return self._meter.take()

    @property
    def compression_started(self) -> bool:
        """True once an algorithm's steps use the compressed collective (after ``freeze_step`` steps)."""
        if self._algorithm is None or not self.built:
            return False
        freeze = getattr(self._options, "freeze_step", 0)  # SLAMB and Birder compress from the first step
        return int(self._state["step"].numpy()) >= freeze

    # -- state -------------------------------------------------------------------------------------------
    def build(self, var_list: list[Any]) -> None:
        ensure_init()
        var_list = list(var_list)
        if self.backward_passes_per_step > 1:
            self._pass_count = self.add_variable(shape=(), dtype="int64", initializer="zeros", name="hvdc_passes")
            self._accumulators = [self.add_variable_from_reference(v, name="hvdc_accumulated_grad") for v in var_list]
        if self._stateful_compressor is not None or self._config.reduction is not None:
            self._build_error_feedback(var_list)
        if self._algorithm is None:
            self.inner_optimizer.build(var_list)
        else:
            bad = [v.path for v in var_list if v.dtype != "float32"]
            if bad:
                raise ValueError(f"op={self.op.name} supports float32 variables (mixed_float16 keeps them), not {bad}")
            self._runner: FusedStep = make_step(self._algorithm, self._options, [tuple(v.shape) for v in var_list],
                                                ops.size(), self._meter, self._config.bucket_mb)
            self._state = {}
            for key, (shape, dtype, init) in self._runner.state_shapes().items():
                self._state[key] = self.add_variable(shape=shape, dtype=dtype, initializer=init, name=f"hvdc_{key}")
        super().build(var_list)

    def _build_error_feedback(self, var_list: list[Any]) -> None:
        bad = [v.path for v in var_list if v.dtype != "float32"]
        if bad:
            what = f"op={self.op.name}" if self._stateful_compressor is None else \
                f"compression={self._stateful_compressor!r}"
            raise ValueError(f"{what} supports float32 variables (mixed_float16 keeps them), not {bad}")
        self._error_feedback = stateful_reduction(self._config, self._stateful_compressor,
                                                  [tuple(v.shape) for v in var_list], self._meter)
        self._state = {key: self.add_variable(shape=shape, dtype=dtype, initializer=init, name=f"hvdc_{key}")
                       for key, (shape, dtype, init) in self._error_feedback.state_shapes().items()}

    @property
    def per_rank_variables(self) -> list[Any]:
        """Variables that differ between ranks by design (the 1-bit error feedback, the server error being this
        rank's chunk; SLAMB's local m and v; Birder's moment shards; top-k/random-k's error feedback; the gradient
        sums of ``backward_passes_per_step``; with Adasum the inner optimizer's moments): never broadcast, saved per
        rank."""
        if not self.built:
            return []
        if self._error_feedback is not None:
            keys = self._error_feedback.per_rank
        else:
            keys = self._runner.per_rank if self._algorithm is not None else ()
        return per_rank_variables(self._config, self.inner_optimizer, getattr(self, "_state", {}), keys,
                                  getattr(self, "_accumulators", ()))

    def reset_compression_state(self) -> None:
        """Zero the error feedback (worker and server error of 1-bit Adam/LAMB and Birder, top-k/random-k's error
        and velocity): what a rank does when it resumes from a checkpoint that another rank saved (the error
        buffers are per rank). SLAMB keeps no error buffer (its compensation is the local part of m)."""
        if (self._algorithm is not None or self._error_feedback is not None) and self.built:
            reset_error_feedback(self._state)

    def synchronize_parameters(self) -> None:
        """SLAMB: average the trainable variables over all ranks now (one dense allreduce), where the last step
        was not a multiple of ``sync_interval`` (end of training, before evaluating or saving). Other ops keep
        the parameters alike on every rank after every step: nothing to do. Eager or inside a ``tf.function``."""
        synchronize_parameters(getattr(self, "_runner", None), self._trainable_variables,
                               f"{self.name}.synchronize_parameters")

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
        grads = list(grads)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
        if self.backward_passes_per_step == 1:
            self._step(grads, trainable_variables)
            return
        accs = self._accumulators_for(trainable_variables)
        accumulate_then_step(grads, trainable_variables, accs, self._pass_count, self.backward_passes_per_step,
                             self._step, self._config.average_passes)

    def _accumulators_for(self, variables: list[Any]) -> list[Any]:
        index = {id(v): i for i, v in enumerate(self._trainable_variables)}
        return [self._accumulators[index[id(v)]] for v in variables]

    def _step(self, grads: list[Any], variables: list[Any]) -> None:
        if self._algorithm is not None:
            self._algorithm_step(grads, variables)
            return
        if self._error_feedback is not None:
            error_feedback_step(self._error_feedback, self._state, grads, variables, self._trainable_variables,
                                self.inner_optimizer.apply, self.name)
            return
        pairs = [(dense(g), v) for g, v in zip(grads, variables, strict=True) if g is not None]
        if not pairs:
            raise ValueError("No gradients provided for any variable.")
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self.op in (ReduceOp.Average, ReduceOp.Sum):
            reduced = bucketed_allreduce(grads, self.op, f"{self.name}.grad", self._compressor, self._config.bucket_mb,
                                         self._config.overlap, self._buckets, self._meter,
                                         self._config.predivide)
            self.inner_optimizer.apply(reduced, variables)
            return
        adasum_delta_step(grads, variables, self.inner_optimizer.apply, self._config, self._meter,
                          f"{self.name}.adasum")

    def _algorithm_step(self, grads: list[Any], variables: list[Any]) -> None:
        index = {id(v): i for i, v in enumerate(self._trainable_variables)}
        if sorted(index[id(v)] for v in variables) != list(range(len(self._trainable_variables))):
            raise ValueError(f"op={self.op.name}: apply() must get every variable the optimizer was built with")
        by_var = {id(v): g for g, v in zip(grads, variables, strict=True)}
        hyper = [self.inner_optimizer.learning_rate, *self._hyper]
        apply_algorithm_step(self._runner, self._state, self._trainable_variables, by_var, hyper, self._flags,
                             f"{self.name}.{self._algorithm.name}", self._config.overlap)
        self.inner_optimizer.iterations.assign_add(1)

    # -- serialization -----------------------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "op": int(self.op),
            "backward_passes_per_step": self.backward_passes_per_step,
            "compression": compression_config(self.compression),
            **self.algorithm_options,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> DistributedOptimizer:
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        config["compression"] = compression_from_config(config.pop("compression", "none"))
        return cls(inner, **config)
