"""mixed_float16 with hck.LossScaleOptimizer: an overflow on the last rank only (one input too large for float16 in
one batch) skips that step on every rank, alike (parameters, step counts and loss scales equal everywhere, no
hang), and the wrapper's ``comm_stats()`` counts every byte of a further epoch, the finite checks' too; Keras's own
LossScaleOptimizer around hck.DistributedOptimizer is refused on every rank. argv: out_dir."""

import keras
import numpy as np
from tf_common import digest, outcome, rank_data, save

import hvd_compress.keras as hck
from hvd_compress.ops.runtime import comm_stats

hck.init()
r, n = hck.rank(), hck.size()
keras.mixed_precision.set_global_policy("mixed_float16")
X, Y = rank_data(r)  # each rank its own data
BATCH, BAD = 16, 2
if r == n - 1:
    X[BAD * BATCH] = 1e6  # beyond float16's 65504: Inf in this rank's forward pass of batch BAD only


def make(op: str, agreed: bool = True) -> keras.Model:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    options = {"freeze_step": 2} if op == "OneBitAdam" else {}
    opt = hck.DistributedOptimizer(keras.optimizers.Adam(0.01), op=getattr(hck, op), **options)
    model.compile(optimizer=hck.LossScaleOptimizer(opt) if agreed else opt, loss="mse", jit_compile=False)
    return model


out: dict = {}
for op in ("Average", "OneBitAdam"):
    model = make(op)
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hck.callbacks.BroadcastGlobalVariablesCallback(0)])
    lso = model.optimizer
    out[op] = {"hash": digest([v.numpy() for v in model.trainable_variables]), "iterations": int(lso.iterations),
               "scale": float(lso.dynamic_scale.numpy()), "type": type(lso).__name__,
               "finite": bool(all(np.isfinite(v.numpy()).all() for v in model.trainable_variables))}
    # one more epoch (its overflow skipped again): the optimizer's bytes against the process's, all its own
    lso.comm_stats(), comm_stats(reset=True)
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    out[op]["bytes"] = (lso.comm_stats(), comm_stats(reset=True))
model = make("Average", agreed=False)
out["plain"] = outcome(lambda: model.fit(X, Y, batch_size=BATCH, epochs=1, verbose=0))
save(r, out)
