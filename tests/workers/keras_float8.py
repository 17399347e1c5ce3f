"""Keras 3 float8 training (``model.quantize("float8")``) under hck.DistributedOptimizer: each rank's data has its
own scale, so its measured amax differs. Saves per rank the values its own step would give the variables Keras
overwrites with their gradient (its "gradient" of them, from a GradientTape over its own batch, or over each of
its two half-batches), the trainable variables' local gradients and the starting weights, and per op and
``backward_passes_per_step`` (1, 2) every variable after one step of ``model.fit``; all in the order of
``trainable_variables`` (``paths``: model 0's names); and the bytes of that fit by the optimizer's ``comm_stats()``
and by the process's. argv: out_dir."""

import keras
import numpy as np
import tensorflow as tf
from tf_common import save

import hvd_compress.keras as hck
from hvd_compress.ops.runtime import comm_stats

hck.init()
r = hck.rank()
LR = 0.01
OPS = ("Average", "Sum", "Adasum", "PowerSGD")


def model() -> keras.Model:
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    m.quantize("float8")
    return m


x = np.random.default_rng(r).standard_normal((32, 8)).astype("float32") * (1 + 3 * r)
y = x.sum(1, keepdims=True)


def local(m: keras.Model, xs: np.ndarray, ys: np.ndarray) -> dict[str, np.ndarray]:
    """This rank's gradient of every trainable variable on (xs, ys), in order, as model.fit's step computes it."""
    @tf.function  # as model.fit's step (Keras's float8 gradient needs a graph)
    def grads() -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = keras.losses.MeanSquaredError()(ys, m(xs, training=True))
        return tape.gradient(loss, m.trainable_variables)

    return [g.numpy() for g in grads()]


m0 = model()
out = {"start": [v.numpy() for v in m0.trainable_variables], "paths": [v.path for v in m0.trainable_variables],
       "overwritten": [i for i, v in enumerate(m0.trainable_variables) if getattr(v, "overwrite_with_gradient", False)],
       "local": {1: [local(model(), x, y)], 2: [local(model(), x[:16], y[:16]), local(model(), x[16:], y[16:])]}}
for op in OPS:
    for passes in (1, 2):
        if passes == 2 and op not in ("Average", "Sum"):
            continue
        m = model()
        m.compile(optimizer=hck.DistributedOptimizer(keras.optimizers.SGD(LR), op=getattr(hck, op),
                                                     backward_passes_per_step=passes),
                  loss="mse", jit_compile=False)
        comm_stats(reset=True)
        m.fit(x, y, batch_size=32 // passes, epochs=1, shuffle=False, verbose=0)
        out[(op, passes)] = [v.numpy() for v in m.trainable_variables]
        # the process's bytes during fit, all the optimizer's: its own count must hold all of them
        out["bytes", op, passes] = (m.optimizer.comm_stats(), comm_stats(reset=True))
save(r, out)
