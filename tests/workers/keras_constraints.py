"""Variable constraints (``kernel_constraint=MaxNorm(..)``, ``NonNeg()``) under every Keras op. Keras's own
optimizers apply them after their update (in ``apply``); the algorithm ops step the variables themselves and Adasum
moves them again after the inner optimizer, so the wrapper applies them there.

argv: out_dir face ("keras" or "tf_keras", which TF_USE_LEGACY_KERAS must match) ops (comma list)
Saves per rank, per op: ``constrained``, the variables after 8 steps of a model whose layers have constraints (and,
for SLAMB, after ``synchronize_parameters()``); ``by_hand``, the same model without constraints, each constraint
applied by hand after each of those calls; ``free``, without constraints at all (to show they were active); with
Keras 3, ``float8``: what fitting a model quantized for float8 training raised, per op (and top-k)."""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf
from tf_common import ALGORITHM_OPTIONS, inner_optimizer, keras_of_face, mse_step, outcome, save

import hvd_compress.keras as hck

keras = keras_of_face(sys.argv[2])

hck.init()
rank = hck.rank()
LR = 0.05
OPTIONS = ALGORITHM_OPTIONS
CONSTRAINTS = (keras.constraints.MaxNorm(0.3), keras.constraints.NonNeg())


def inner(op: str, **kwargs: float) -> object:
    return inner_optimizer(keras, hck, op, LR, **kwargs)


def run(op: str, constrained: bool, by_hand: bool) -> list[np.ndarray]:
    keras.utils.set_random_seed(11)
    given = CONSTRAINTS if constrained else (None, None)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu", kernel_constraint=given[0]),
                              keras.layers.Dense(1, kernel_constraint=given[1])])
    opt = hck.DistributedOptimizer(inner(op), op=getattr(hck, op), **OPTIONS.get(op, {}))
    kernels = [model.layers[0].kernel, model.layers[1].kernel]

    def constrain() -> None:
        if by_hand:
            for v, c in zip(kernels, CONSTRAINTS, strict=True):
                v.assign(c(v))

    step = mse_step(model, opt, after=constrain)

    rng = np.random.default_rng(rank)
    for _ in range(8):
        x = rng.standard_normal((16, 6)).astype(np.float32)
        step(tf.constant(x), tf.constant(np.sin(x.sum(1, keepdims=True)) + 1))
    if op == "SLAMB":
        opt.synchronize_parameters()
        constrain()
    return [v.numpy() for v in model.trainable_variables]


def float8(op: str, compression: object = None) -> str:
    """What fitting a model quantized for float8 training raised (its scales and amax histories are overwritten
    with their gradients)."""
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.quantize("float8")
    extra = {} if compression is None else {"compression": compression}
    opt = hck.DistributedOptimizer(inner(op), op=getattr(hck, op), **OPTIONS.get(op, {}), **extra)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    x = np.random.default_rng(rank).standard_normal((16, 6)).astype(np.float32)
    return outcome(lambda: model.fit(x, np.sin(x.sum(1, keepdims=True)), batch_size=8, epochs=1, verbose=0))


out = {op: {"constrained": run(op, True, False), "by_hand": run(op, False, True), "free": run(op, False, False)}
       for op in sys.argv[3].split(",")}
if hasattr(keras.Model, "quantize"):  # Keras 3
    out["float8"] = {op: float8(op) for op in ("Average", "OneBitAdam", "ZeroOneAdam")}
    out["float8"]["topk"] = float8("Average", hck.Compression.topk(0.5))
save(rank, out)
