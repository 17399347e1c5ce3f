"""Keras 3 twin of compression_fidelity.py: top-k 1% with error feedback (plain under SGD(momentum=0.9), and DGC's
``topk(0.01, momentum=0.9, momentum_masking=False)`` under SGD(momentum=0)) against dense SGD(momentum=0.9) through
hck.DistributedOptimizer, on a ReLU MLP with real data (scikit-learn's digits, 1297 training images sharded over the
ranks, 500 held out), batch 16 per rank, cosine decay from lr 0.1.

argv: out_dir steps seeds (comma list). Saves per rank, for each run and seed (key ``<run>@<seed>``): the final
held-out cross-entropy, a hash of the final parameters and the bytes this rank sent per step.
"""

import sys

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from tf_common import digest, save

import hvd_compress.keras as hck
import hvd_compress.tensorflow as hc

hck.init()
r, n = hck.rank(), hck.size()
STEPS, SEEDS = int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
BATCH, LR = 16, 0.1
digits = load_digits()
x_all, y_all = (digits.data / 16.0).astype("float32"), digits.target.astype("int64")
perm = np.random.default_rng(0).permutation(len(y_all))
test, train = perm[:500], perm[500:]
x, y = x_all[train[r::n]], y_all[train[r::n]]
x_test, y_test = x_all[test], y_all[test]
RUNS = {
    "dense": (0.9, None),
    "topk": (0.9, hck.Compression.topk(0.01)),
    "dgc-nomask": (0.0, hck.Compression.topk(0.01, momentum=0.9, momentum_masking=False)),
}


def train_run(run: str, seed: int) -> dict[str, object]:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    momentum, compression = RUNS[run]
    schedule = keras.optimizers.schedules.CosineDecay(LR, STEPS)
    opt = hck.DistributedOptimizer(keras.optimizers.SGD(schedule, momentum=momentum), compression=compression)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for v in model.trainable_variables:
        v.assign(hc.broadcast(tf.convert_to_tensor(v), 0))

    @tf.function
    def step(xb: tf.Tensor, yb: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    order = np.random.default_rng(100 * seed + r)
    opt.comm_stats()
    for _ in range(STEPS):
        idx = order.integers(0, len(y), BATCH)
        step(tf.constant(x[idx]), tf.constant(y[idx]))
    sent = opt.comm_stats()["bytes_sent"] / STEPS
    test_loss = float(loss_fn(y_test, model(x_test)))
    if r == 0:
        print(f"{run:>12} seed {seed}: held-out loss {test_loss:.4f}, {sent:,.0f} bytes sent per step", flush=True)
    return {"test_loss": test_loss, "hash": digest(model.trainable_variables), "bytes_per_step": sent}


save(r, {f"{run}@{seed}": train_run(run, seed) for run in RUNS for seed in SEEDS})
