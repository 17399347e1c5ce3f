"""Hyper-parameters that differ between ranks under a Keras algorithm op, and under op=Average (wrapping Adam),
with top-k and op=PowerSGD wrapping SGD with momentum (whose every hyper-parameter counts): each op trains three
equal steps in a ``tf.function``; then the last rank's learning rate changes (as ``ReduceLROnPlateau`` fed that
rank's own validation loss would), and the next step that communicates must raise on every rank, naming the
hyper-parameters, with the variables as they were; with the learning rate equal again the step is taken. Then
optimizer wrappers that differ between ranks (``differs``).

argv: out_dir face ("keras" or "tf_keras", which TF_USE_LEGACY_KERAS must match)."""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf
from tf_common import ALGORITHM_OPTIONS, digest, inner_optimizer, keras_of_face, mse_step, outcome, save

import hvd_compress.keras as hck

keras = keras_of_face(sys.argv[2])
hck.init()
r, n = hck.rank(), hck.size()


#: The reductions any optimizer steps after (case: op, options, the wrapped optimizer). Adam's hyper-parameters
#: sort before ``learning_rate`` by name: the message must still list the learning rate first.
REDUCTIONS = {"Average": ("Average", {}, "Adam"),
              "TopK": ("Average", {"compression": hck.Compression.topk(0.25)}, "SGD"),
              "PowerSGD": ("PowerSGD", {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}, "SGD")}


def run(case: str) -> dict[str, str]:
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    if case in REDUCTIONS:
        op, options, wrapped = REDUCTIONS[case]
        inner = keras.optimizers.Adam(0.01) if wrapped == "Adam" else keras.optimizers.SGD(0.01, momentum=0.9)
    else:
        op, options = case, ALGORITHM_OPTIONS[case]
        inner = inner_optimizer(keras, hck, op, 0.01)
    opt = hck.DistributedOptimizer(inner, op=getattr(hck, op), **options)

    step = mse_step(model, opt)
    rng = np.random.default_rng(r)

    def one() -> None:
        x = rng.standard_normal((16, 6)).astype(np.float32)
        step(tf.constant(x), tf.constant(np.sin(x.sum(1, keepdims=True))))

    for _ in range(3):
        one()
    if r == n - 1:
        inner.learning_rate.assign(0.03)
    res, caught, s = {}, "no error", 3
    while caught == "no error" and s < 12:  # 0/1 Adam's local steps: the first that communicates
        res["before"] = digest([v.numpy() for v in model.trainable_variables])
        caught = outcome(one)
        s += 1
    res["caught"] = caught
    res["after_error"] = digest([v.numpy() for v in model.trainable_variables])
    inner.learning_rate.assign(0.01)
    res["next"] = outcome(one)
    return res


def differs(case: str) -> str:
    """What the first step raises when rank 0's optimizer wrapper differs from the others': another op ("op":
    OneBitAdam against Average), another option ("freeze_step": 10 against 20), or another op under model.fit with
    the broadcast callback ("callback", whose broadcast of the optimizer's variables comes first)."""
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    inner = keras.optimizers.Adam(0.01)
    if case == "freeze_step":
        opt = hck.DistributedOptimizer(inner, op=hck.OneBitAdam, freeze_step=10 if r == 0 else 20)
    elif r == 0:
        opt = hck.DistributedOptimizer(inner, op=hck.OneBitAdam, freeze_step=10)
    else:
        opt = hck.DistributedOptimizer(inner, op=hck.Average)
    x = np.random.default_rng(r).standard_normal((16, 6)).astype(np.float32)
    y = np.sin(x.sum(1, keepdims=True))
    if case == "callback":
        model.compile(optimizer=opt, loss="mse", jit_compile=False)
        return outcome(lambda: model.fit(x, y, batch_size=16, epochs=1, verbose=0,
                                         callbacks=[hck.callbacks.BroadcastGlobalVariablesCallback(0)]))
    return outcome(lambda: mse_step(model, opt)(tf.constant(x), tf.constant(y)))


save(r, {"results": {case: run(case) for case in [*ALGORITHM_OPTIONS, *REDUCTIONS]},
         "differs": {case: differs(case) for case in ("op", "freeze_step", "callback")}})
