"""``hck.Birder``: Birder's rule without compression (SoftSignSGD of paper 004) as a Keras 3 optimizer, the Keras
twin of ``hvd_compress.torch.Birder``. Alone (or under ``op=Average``) it steps on the gradient it is given;
wrapped by ``hck.DistributedOptimizer(hck.Birder(...), op=hck.Birder)`` it supplies the hyper-parameters of
the 1-bit algorithm. The update is ``hvd_compress.algorithms.birder.uncompressed_step`` (on NumPy copies, one
``tf.numpy_function`` per variable), so both faces run the same code."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hvd_compress.algorithms import birder as alg
from hvd_compress.tensorflow.backend import BACKEND, aligned_copy
from hvd_compress.tensorflow.functions import numpy_call


@keras.saving.register_keras_serializable(package="hvd_compress")
class Birder(keras.optimizers.Optimizer):
    """m and b moving averages of g and |g| with one ``beta``; x = x - lr m / (b + epsilon) - lr weight_decay x
    (decoupled, on the old x). Defaults: specs/birder.md section 5. float32 variables."""

    hvdc_op = alg.BirderAlgorithm.op  # as op=, the class names its algorithm

    def __init__(self, learning_rate: Any = 1e-3, beta: float = 0.95, epsilon: float = 1e-8,
                 weight_decay: float = 0.0, name: str = "birder", **kwargs: Any) -> None:
        lr = learning_rate if isinstance(learning_rate, (int, float)) else alg.DEFAULTS["lr"]
        alg.check_hyperparameters(float(lr), float(beta), float(epsilon), float(weight_decay))
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.beta = float(beta)
        self.epsilon = float(epsilon)
        self.birder_weight_decay = float(weight_decay)  # not Keras's weight_decay: the rule applies its own

    def build(self, var_list: list[Any]) -> None:
        if self.built:
            return
        bad = [v.path for v in var_list if v.dtype != "float32"]
        if bad:
            raise ValueError(f"hck.Birder supports float32 variables (mixed_float16 keeps them), not {bad}")
        super().build(var_list)
        self._m = [self.add_variable_from_reference(v, name="exp_avg") for v in var_list]
        self._b = [self.add_variable_from_reference(v, name="exp_avg_abs") for v in var_list]

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        i = self._get_variable_index(variable)
        update_variable(f"{self.name}.update", gradient, variable, self._m[i], self._b[i], learning_rate, self.beta,
                        self.epsilon, self.birder_weight_decay)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(beta=self.beta, epsilon=self.epsilon, weight_decay=self.birder_weight_decay)
        return config


def update_variable(name: str, gradient: Any, variable: Any, m: Any, b: Any, learning_rate: Any, beta: float,
                    epsilon: float, weight_decay: float) -> None:
    """One uncompressed Birder step of ``variable`` and its moments ``m``, ``b`` (``algorithms.birder``), as one
    ``tf.numpy_function``: the update of ``hck.Birder`` and of tf_keras's ``legacy.Birder``."""
    hyper = tf.stack([tf.cast(learning_rate, tf.float64), *(tf.constant(h, tf.float64) for h in (
        beta, epsilon, weight_decay))])

    def run(h: np.ndarray, g: np.ndarray, x: np.ndarray, m_a: np.ndarray, b_a: np.ndarray) -> list[np.ndarray]:
        lr, beta_, eps, wd = (float(v) for v in h)
        group = {"lr": lr, "beta": beta_, "eps": eps, "weight_decay": wd}
        x, m_a, b_a = (aligned_copy(np.asarray(a)) for a in (x, m_a, b_a))
        alg.uncompressed_step(BACKEND, [x], [np.asarray(g, np.float32)], [m_a], [b_a], [BACKEND.zeros_like(x)], group)
        return [x, m_a, b_a]

    g = tf.cast(tf.convert_to_tensor(gradient), variable.dtype)
    outs = numpy_call(run, [hyper, g, variable, m, b], [tf.float32] * 3, name)
    for target, value in zip((variable, m, b), outs, strict=True):
        target.assign(tf.reshape(value, variable.shape))
