"""A variable the loss reaches on rank 0 only (a branch taken by rank): its gradient is None elsewhere and is left
out of the reduction there, as Keras leaves it. Three steps of a custom loop, eagerly, through
``hck.DistributedOptimizer(op=Average)`` and through ``hc.DistributedGradientTape``: once with the None gradients
(the reduction must raise ``MismatchError`` on every rank, naming the cause), once with zero gradients in their place
(the fixes the message names: ``unconnected_gradients=ZERO`` for the tape, zeros by hand before
``apply_gradients``): every rank ends with the same variables.

argv: out_dir
Saves per rank, per (path, gradients): the error raised or the digest of the variables.
"""

import keras
import numpy as np
import tensorflow as tf
from tf_common import digest, save

import hvd_compress.keras as hck
import hvd_compress.tensorflow as hctf

hck.init()
r = hck.rank()


def run(path: str, unconnected: tf.UnconnectedGradients) -> str:
    keras.utils.set_random_seed(0)
    a, b, c = keras.layers.Dense(8), keras.layers.Dense(1), keras.layers.Dense(1)
    a.build((None, 4))
    b.build((None, 8))
    c.build((None, 8))
    variables = a.trainable_variables + b.trainable_variables + c.trainable_variables
    opt = keras.optimizers.Adam(0.01)
    if path == "optimizer":
        opt = hck.DistributedOptimizer(opt, op=hck.Average)
    x = np.random.default_rng(r).standard_normal((16, 4)).astype("float32")
    try:
        for _ in range(3):
            with tf.GradientTape() as tape:
                h = a(x)
                loss = tf.reduce_mean(b(h) ** 2) + (tf.reduce_mean(c(h) ** 2) if r == 0 else 0.0)
            if path == "tape":
                tape = hctf.DistributedGradientTape(tape)
            if path == "tape":  # TF's unconnected_gradients=ZERO needs tf.Variable sources: Keras 3's v.value
                grads = tape.gradient(loss, [v.value for v in variables], unconnected_gradients=unconnected)
            else:  # zeros by hand, as the message says
                grads = tape.gradient(loss, variables)
                if unconnected == tf.UnconnectedGradients.ZERO:
                    grads = [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables, strict=True)]
            opt.apply_gradients(zip(grads, variables, strict=True))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return digest([v.numpy() for v in variables])


save(r, {(path, unconnected.name): run(path, unconnected) for path in ("optimizer", "tape")
         for unconnected in (tf.UnconnectedGradients.NONE, tf.UnconnectedGradients.ZERO)})
