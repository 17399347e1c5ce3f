"""Keras 3 twin of bn_fidelity.py: ``model.fit`` of a CNN with BatchNorm after biased layers (Conv2D and Dense with
their default biases) on scikit-learn's digits, through hck.DistributedOptimizer with dense Adam / Lamb (op=Average)
and 1-bit Adam / 1-bit LAMB; eval-mode accuracy on 500 held-out images (each rank with its own BatchNorm
statistics, as Horovod's Keras leaves them).

argv: out_dir epochs freeze_step runs (comma list of Adam, Lamb, OneBitAdam, OneBitLamb).
Saves per rank, per run: eval accuracy, the largest |weight| and a digest of the trainable weights.
"""

import sys

import keras
import numpy as np
from sklearn.datasets import load_digits
from tf_common import digest, save

import hvd_compress.keras as hck

hck.init()
r, n = hck.rank(), hck.size()
EPOCHS, FREEZE, RUNS = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
BATCH = 32
digits = load_digits()
x_all = (digits.images / 16.0).astype("float32")[..., None]
y_all = digits.target.astype("int64")
perm = np.random.default_rng(0).permutation(len(y_all))
test, train = perm[:500], perm[500:]
per_rank = len(train) // n  # equal shards: every rank takes the same number of steps
x, y = x_all[train[r::n][:per_rank]], y_all[train[r::n][:per_rank]]


def run(name: str) -> dict[str, object]:
    keras.utils.set_random_seed(1)
    layers = keras.layers
    norm = lambda: layers.BatchNormalization(momentum=0.9)  # noqa: E731 (as torch's BatchNorm, 0.1)
    model = keras.Sequential([
        keras.Input((8, 8, 1)), layers.Conv2D(16, 3, padding="same"), norm(), layers.ReLU(),
        layers.Conv2D(32, 3, padding="same"), norm(), layers.ReLU(), layers.MaxPooling2D(2), layers.Flatten(),
        layers.Dense(64), norm(), layers.ReLU(), layers.Dense(10)])
    inner = keras.optimizers.Adam(1e-3) if name.endswith("Adam") else keras.optimizers.Lamb(1e-2)
    options = {"op": getattr(hck, name), "freeze_step": FREEZE} if name.startswith("OneBit") else {}
    model.compile(optimizer=hck.DistributedOptimizer(inner, **options), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=True,
              callbacks=[hck.callbacks.BroadcastGlobalVariablesCallback(0)])
    _, acc = model.evaluate(x_all[test], y_all[test], verbose=0)
    weights = [v.numpy() for v in model.trainable_variables]
    out = {"accuracy": float(acc), "max_abs": float(max(np.abs(w).max() for w in weights)), "hash": digest(weights)}
    if r == 0:
        print(f"keras {name:>10} {n} ranks: eval accuracy {acc:.3f} max|x| {out['max_abs']:.3g}", flush=True)
    return out


save(r, {name: run(name) for name in RUNS})
