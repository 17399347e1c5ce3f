"""tf_keras (TF_USE_LEGACY_KERAS=1): model.fit with hck.DistributedOptimizer around a tf_keras Adam for Average and
OneBitAdam: identical parameters on every rank after every epoch, an LR schedule honoured, a tf.train.Checkpoint
restored into a fresh model resuming exactly. argv: out_dir."""

import os
import sys

import numpy as np
import tensorflow as tf
from tf_common import digest, outcome, save

import hvd_compress.keras as hck
from hvd_compress.keras import legacy

assert os.environ.get("TF_USE_LEGACY_KERAS") == "1"
keras = tf.keras
assert keras.__name__.startswith("tf_keras"), keras.__name__
hck.init()
r, n = hck.rank(), hck.size()
rng = np.random.default_rng(r)
X = rng.standard_normal((64, 6)).astype("float32")
Y = np.sin(X.sum(1, keepdims=True)).astype("float32")


class Hashes(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.hashes: list[str] = []

    def on_epoch_end(self, epoch: int, logs: object = None) -> None:
        self.hashes.append(digest([v.numpy() for v in self.model.trainable_variables]))


def make(op: str) -> keras.Model:
    keras.utils.set_random_seed(100 + r)  # different on purpose: the broadcast callback must fix it
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=4, decay_rate=0.8)
    options = {"freeze_step": 3} if op == "OneBitAdam" else {}
    opt = hck.DistributedOptimizer(keras.optimizers.Adam(schedule), op=getattr(hck, op), **options)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    return model


def fit(model: keras.Model, epochs: int) -> tuple[list[str], list[float]]:
    h = Hashes()
    hist = model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=[legacy.BroadcastGlobalVariablesCallback(0), h])
    return h.hashes, [float(v) for v in hist.history["loss"]]


out: dict = {}
for op in ("Average", "OneBitAdam"):
    model = make(op)
    first, loss1 = fit(model, 2)
    ckpt_path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(sys.argv[1] + f"/{op}_rank{r}")
    cont, loss2 = fit(model, 2)
    opt = model.optimizer
    fresh = make(op)
    fresh.optimizer.build(fresh.trainable_variables)
    tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).read(ckpt_path).assert_consumed()
    restored, _ = fit(fresh, 2)
    out[op] = {"hashes": first + cont, "restored": restored, "loss": loss1 + loss2, "type": type(opt).__module__,
               "iterations": int(opt.iterations), "lr": float(opt.learning_rate),
               "want_lr": float(opt.inner_optimizer._learning_rate(opt.iterations - 1)),  # the last step's
               "compression_started": getattr(opt, "compression_started", None)}
out["bad_op"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.Adam(0.1), op=hck.Adasum))
save(r, out)
