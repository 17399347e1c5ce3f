"""``hck.LossScaleOptimizer``: Keras's dynamic loss scaling (mixed_float16) whose skip decision is agreed by all
ranks.

Keras's own ``LossScaleOptimizer`` checks the gradients of this rank only and skips the inner ``apply`` where one
is Inf/NaN. Around ``hck.DistributedOptimizer`` that is a cross-rank deadlock: the rank that overflowed skips
the step's collectives while the others wait in them. Here ``check_finite`` counts the ranks with a non-finite
gradient in one tiny allreduce (``hvd_compress.algorithms.agreement``), so an overflow on one rank skips the step
and halves the loss scale on every rank, and all ranks keep identical parameters and loss scales.

    keras.mixed_precision.set_global_policy("mixed_float16")
    opt = hck.LossScaleOptimizer(hck.DistributedOptimizer(keras.optimizers.Adam(1e-3)))
    model.compile(optimizer=opt, loss=..., jit_compile=False)  # Keras does not wrap it a second time

The scaler goes around the wrapper, for every op; one inside it is refused when the wrapper is made
(``refuse_scaler_inside``).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hvd_compress.algorithms.agreement import nonfinite_everywhere
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.backend import BACKEND
from hvd_compress.tensorflow.context import ensure_init
from hvd_compress.tensorflow.functions import dense, numpy_call


class InnerExclusions:
    """``exclude_from_weight_decay`` of the optimizer inside: loss scaling decays nothing, and Keras's own wrappers
    set it on themselves, where nothing reads it (scripts call it on the optimizer they compile with)."""

    inner_optimizer: Any

    def exclude_from_weight_decay(self, var_list: Any = None, var_names: Any = None) -> None:
        self.inner_optimizer.exclude_from_weight_decay(var_list=var_list, var_names=var_names)


@keras.saving.register_keras_serializable(package="hvd_compress")
class LossScaleOptimizer(InnerExclusions, keras.optimizers.LossScaleOptimizer):
    """``keras.optimizers.LossScaleOptimizer`` with the finite check agreed across ranks (see the module)."""

    def __init__(self, inner_optimizer: keras.optimizers.Optimizer, **kwargs: Any) -> None:
        super().__init__(inner_optimizer, **kwargs)
        inner_optimizer._hvdc_loss_scale_agreed = True  # hck.DistributedOptimizer refuses a plain wrapper
        self._hvdc_meter = check_meter(inner_optimizer)

    def check_finite(self, grads: list[Any]) -> Any:
        return agreed_all_finite(grads, self._hvdc_meter, f"{self.name}.check_finite")

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank sent and received since the last call: the optimizer's inside (``comm_stats``) with
        the finite checks', which it counts too."""
        return self._hvdc_meter.take()


def refuse_scaler_inside(optimizer: Any, scalers: tuple[type, ...], supported: str) -> None:
    """A loss scaler goes around ``hck.DistributedOptimizer``, never inside, whatever the op (``supported`` names the
    order). Keras scales the loss through the optimizer the model is compiled with (Keras 3's train step calls its
    ``scale_loss``, tf_keras's ``minimize`` its ``get_scaled_loss``) and a scaler divides the gradients by its scale
    in its own step: inside the wrapper the loss is never scaled while the gradients are still divided, so every
    update would be 1/scale of the unscaled run's; and its skip decision would be this rank's alone. Horovod's
    scripts put it outside too (``model.compile`` wraps the compiled optimizer under mixed_float16)."""
    if isinstance(optimizer, scalers):
        name = type(optimizer).__name__
        raise TypeError(
            f"hck.DistributedOptimizer got a loss scaler ({name}): put the loss scaler around it, for every op: "
            f"{supported}, with opt the optimizer the {name} wraps (its inner_optimizer). Inside, its scale never "
            "reaches the loss (Keras scales the loss through the optimizer the model is compiled with), while it "
            "still divides the gradients by it: every update would be 1/scale of what it should be"
        )


def check_meter(inner_optimizer: Any) -> CommMeter:
    """Where the finite check counts its bytes: the meter of ``inner_optimizer`` where that is an
    ``hck.DistributedOptimizer`` (its ``comm_stats`` then holds all of the step's), else one of its own."""
    engine = getattr(inner_optimizer, "_hvdc", None)
    return engine.meter if engine is not None else CommMeter()


def agreed_all_finite(grads: list[Any], meter: CommMeter, name: str) -> Any:
    """A scalar bool tensor, True where every gradient on every rank is finite (one tiny allreduce of the count
    of ranks with an Inf/NaN, ``algorithms.agreement``): the skip decision of both Kerases' loss scalers."""
    ensure_init()
    tensors = [dense(g) for g in grads if g is not None]

    def run(*arrays: np.ndarray) -> np.ndarray:
        # Reads TF's buffers only (never writes them): nonfinite_everywhere only tests them.
        return np.asarray(nonfinite_everywhere(BACKEND, [np.asarray(a) for a in arrays], meter, name), np.int64)

    bad = numpy_call(run, tensors, [tf.int64], name)[0]
    return tf.equal(bad, 0)
