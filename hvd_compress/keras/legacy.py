"""tf_keras (``TF_USE_LEGACY_KERAS=1``, ``tf.keras`` of TF >= 2.16 then): ``hck.DistributedOptimizer`` given a
tf_keras optimizer returns this wrapper, and ``BroadcastGlobalVariablesCallback`` is the tf_keras callback.

A wrapper as tf_keras's own ``LossScaleOptimizer`` is one: it holds the inner optimizer, delegates ``learning_rate``
(schedules too) and ``iterations``, and adds its variables beside the inner ones. ``model.fit`` calls
``apply_gradients`` (via ``minimize``), which is where the step runs:

- ``Average``/``Sum``: one fused reduction of the gradients (``hvd_compress.tensorflow.grouped_allreduce``), then
  the inner optimizer's ``apply_gradients``.
- ``OneBitAdam`` (wraps ``tf_keras.optimizers.Adam``/``AdamW``): the algorithm layer's step over the fused segment
  (``hvd_compress.tensorflow.algorithm_step``, the same code as the Keras 3 face), state in this optimizer's
  variables (so ``tf.train.Checkpoint`` keeps it).

Not here (they raise ``NotImplementedError``): Adasum, OneBitLamb and SLAMB (tf_keras has no LAMB), Birder,
``backward_passes_per_step`` > 1. Use Keras 3 for those.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras

from hvd_compress import ops
from hvd_compress.algorithms.onebit import parse_options
from hvd_compress.algorithms.onebit_adam import OneBitAdam
from hvd_compress.keras.callbacks import broadcast_model
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.algorithm_step import FusedStep, apply_algorithm_step, make_step
from hvd_compress.tensorflow.context import ensure_init
from hvd_compress.tensorflow.functions import check_not_xla, dense, grouped_allreduce


def is_tf_keras_optimizer(optimizer: Any) -> bool:
    return isinstance(optimizer, tf_keras.optimizers.Optimizer)


class DistributedOptimizer(tf_keras.optimizers.Optimizer):
    """Data-parallel training over all ranks around a tf_keras ``optimizer``: ``op`` = ``Average`` (default),
    ``Sum`` or ``OneBitAdam`` (with its options, ``freeze_step`` required). Not under XLA (``jit_compile=False``)."""

    def __init__(self, optimizer: tf_keras.optimizers.Optimizer, op: Any = ReduceOp.Average,
                 backward_passes_per_step: int = 1, name: str | None = None, **algorithm_options: Any) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer.inner_optimizer
        if not is_tf_keras_optimizer(optimizer):
            raise TypeError(f"expected a tf_keras optimizer, got {type(optimizer).__name__}")
        try:
            op = ReduceOp(op)
        except ValueError:
            raise ValueError(f"unknown op {op!r}; use one of {[o.name for o in ReduceOp]}") from None
        if backward_passes_per_step != 1:
            raise NotImplementedError("backward_passes_per_step > 1 is in the Keras 3 face only")
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", jit_compile=False)
        self.inner_optimizer = optimizer
        self.op = op
        self.algorithm_options = dict(algorithm_options)
        self._meter = CommMeter()
        self._runner: FusedStep | None = None
        if op in (ReduceOp.Average, ReduceOp.Sum):
            if algorithm_options:
                raise TypeError(f"op={op.name} takes no algorithm options, got {sorted(algorithm_options)}")
        elif op == ReduceOp.OneBitAdam:
            if not isinstance(optimizer, tf_keras.optimizers.Adam) or optimizer.amsgrad:
                raise TypeError(f"op=OneBitAdam wraps tf_keras.optimizers.Adam/AdamW (amsgrad=False), got "
                                f"{type(optimizer).__name__}")
            for attr in ("clipnorm", "clipvalue", "global_clipnorm", "use_ema"):
                if getattr(optimizer, attr, None) not in (None, False):
                    raise ValueError(f"op=OneBitAdam: the inner optimizer's {attr} is not applied; unset it")
            self._options = parse_options(OneBitAdam.options_cls, OneBitAdam.name, dict(algorithm_options))
            self._hyper = [optimizer.beta_1, optimizer.beta_2, optimizer.epsilon, optimizer.weight_decay or 0.0]
            self._flags = {"decoupled_weight_decay": True}  # tf_keras applies weight_decay decoupled, as AdamW
        else:
            raise NotImplementedError(f"op={op.name} under tf_keras: use Average, Sum or OneBitAdam, or Keras 3")

    # -- delegation, as LossScaleOptimizer --------------------------------------------------------------
    @property
    def iterations(self) -> Any:
        return self.inner_optimizer.iterations

    @iterations.setter
    def iterations(self, variable: Any) -> None:
        self.inner_optimizer.iterations = variable

    @property
    def learning_rate(self) -> Any:
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate: Any) -> None:
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def variables(self) -> list[Any]:
        own = super().variables  # tf_keras's callable list: some of its code calls optimizer.variables()
        return type(own)([*own, *self.inner_optimizer.variables])

    @property
    def per_rank_variables(self) -> list[Any]:
        """The 1-bit error feedback: differs between ranks by design, never broadcast."""
        if self._runner is None:
            return []
        return [self._state[k] for k in self._runner.per_rank]

    def synchronize_parameters(self) -> None:
        """Nothing to do: every op here keeps the parameters alike on every rank after every step."""

    def build(self, var_list: list[Any]) -> None:
        if getattr(self, "_built", False):
            return
        ensure_init()
        var_list = list(var_list)
        super().build(var_list)
        self._trainable = var_list
        if self.op != ReduceOp.OneBitAdam:
            self.inner_optimizer.build(var_list)
        else:
            bad = [v.name for v in var_list if v.dtype != tf.float32]
            if bad:
                raise ValueError(f"op=OneBitAdam supports float32 variables, not {bad}")
            self._runner = make_step(OneBitAdam, self._options, [tuple(v.shape) for v in var_list], ops.size(),
                                     self._meter)
            self._state = {}
            for key, (shape, dtype, init) in self._runner.state_shapes().items():
                initializer = tf_keras.initializers.get(init)
                self._state[key] = self.add_variable(shape=list(shape), dtype=dtype, initializer=initializer,
                                                     name=f"hvdc_{key}")
        self._built = True

    def apply_gradients(self, grads_and_vars: Any, name: str | None = None, skip_gradients_aggregation: bool = False,
                        **kwargs: Any) -> Any:
        check_not_xla(self.name)
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        with tf.init_scope():
            self.build(variables)
        if self._runner is None:
            pairs = [(dense(g), v) for g, v in pairs if g is not None]
            reduced = grouped_allreduce([g for g, _ in pairs], op=self.op, name=f"{self.name}.grad")
            return self.inner_optimizer.apply_gradients(zip(reduced, [v for _, v in pairs], strict=True), name=name,
                                                        skip_gradients_aggregation=True, **kwargs)
        if sorted(id(v) for v in variables) != sorted(id(v) for v in self._trainable):
            raise ValueError("op=OneBitAdam: apply_gradients() must get every variable the optimizer was built with")
        by_var = {id(v): g for g, v in pairs}
        # What the inner optimizer's apply_gradients does first: a schedule's value for this step.
        self.inner_optimizer._compute_current_learning_rate()
        apply_algorithm_step(self._runner, self._state, self._trainable, by_var,
                             [self.inner_optimizer.learning_rate, *self._hyper], self._flags,
                             f"{self.name}.{OneBitAdam.name}")
        return self.inner_optimizer.iterations.assign_add(1)

    @property
    def compression_started(self) -> bool:
        return self._runner is not None and int(self._state["step"].numpy()) >= self._options.freeze_step

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "optimizer": tf_keras.optimizers.serialize(self.inner_optimizer),
                "op": int(self.op), **self.algorithm_options}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> DistributedOptimizer:
        config = dict(config)
        inner = tf_keras.optimizers.deserialize(config.pop("optimizer"), custom_objects=custom_objects)
        return cls(inner, **config)


class BroadcastGlobalVariablesCallback(tf_keras.callbacks.Callback):
    """tf_keras twin of ``hck.callbacks.BroadcastGlobalVariablesCallback``: at the start of training every rank
    takes ``root_rank``'s model and optimizer variables (the optimizer built first; per-rank error feedback
    stays)."""

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs: Any = None) -> None:
        if not self.broadcast_done:
            broadcast_model(self.model, self.root_rank)
            self.broadcast_done = True
