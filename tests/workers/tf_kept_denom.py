"""The TF faces keep 1-bit Adam/LAMB's frozen denominator across steps (tensorflow.algorithm_step._KeptDenom). A
checkpoint of another run restored into an optimizer that kept one must step as a fresh optimizer restored from it:
run A saves a checkpoint in its compression stage; run B (another start and data) reaches its own compression
stage, then restores A's checkpoint into its model and optimizer and fits 3 more steps; run C, fresh, restores the
same checkpoint and fits the same 3 steps. Saves per rank, per op: digests of B's and C's parameters and state.
argv: out_dir."""

import sys

import keras
import numpy as np
import tensorflow as tf
from tf_common import digest, save

import hvd_compress.keras as hck

hck.init()
r, n = hck.rank(), hck.size()


def data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed * 10 + r)
    x = rng.standard_normal((48, 8)).astype("float32")
    return x, np.maximum(x[:, :3] @ rng.standard_normal((3, 2)), 0).astype("float32")


def make(op: str, seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    inner = keras.optimizers.Lamb(0.01) if op == "OneBitLamb" else keras.optimizers.Adam(0.01)
    model.compile(optimizer=hck.DistributedOptimizer(inner, op=getattr(hck, op), freeze_step=3), loss="mse",
                  jit_compile=False)
    return model


def fit(model: keras.Model, seed: int) -> None:
    x, y = data(seed)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)  # 6 steps


out = {}
for op in ("OneBitAdam", "OneBitLamb"):
    a = make(op, 1)
    fit(a, 1)
    path = tf.train.Checkpoint(model=a, optimizer=a.optimizer).write(sys.argv[1] + f"/{op}_a_rank{r}")
    b = make(op, 2)
    fit(b, 2)  # B's own compression stage: it keeps its own d
    tf.train.Checkpoint(model=b, optimizer=b.optimizer).read(path).assert_consumed()
    fit(b, 3)
    c = make(op, 4)
    c.optimizer.build(c.trainable_variables)
    tf.train.Checkpoint(model=c, optimizer=c.optimizer).read(path).assert_consumed()
    fit(c, 3)
    out[op] = {k: digest([v.numpy() for v in m.trainable_variables + m.optimizer.variables])
               for k, m in (("restored_into_b", b), ("fresh_c", c))}
    out[op]["compression_started"] = b.optimizer.compression_started
save(r, out)
