"""Loss scalers on either side of hck.DistributedOptimizer, uneven data in fit(), and what hck exports, under Keras 3
or tf_keras (``TF_USE_LEGACY_KERAS=1``). argv: out_dir face ("keras" or "tf_keras") ops (comma list).

Saves per rank:
- ``start``, ``plain/<op>`` and ``around/<op>``: the weights at the start and after 3 steps of ``model.fit`` (float32),
  with the wrapper alone and with the agreed loss scaler around it (``hck.LossScaleOptimizer``, tf_keras's
  ``legacy.LossScaleOptimizer``; initial scale 2**15), and ``scale/<op>``: that scaler's loss scale after them;
  ``factor/<op>`` (Keras 3): the same with Keras's fixed loss scale on the inner optimizer (``loss_scale_factor``);
- ``inside/<scaler>/<op>``: what making the wrapper around a loss scaler raised (Keras's own, ours), and
  ``advice/<op>``: the same for a script that had Keras's scaler and wrapped it as our refusal of Keras's scaler
  outside says (``hck.LossScaleOptimizer(hck.DistributedOptimizer(keras LossScaleOptimizer))``);
- ``outside``: what Keras's own loss scaler around the wrapper raised in ``fit`` (its skip decision is per rank);
- ``exports``: for each error class and ``DistributedGradientTape``, whether hck exports the one the faces share;
- ``uneven/<how>``: each rank with its own number of batches (rank 1 the fewest): what ``fit`` raised, whether a
  ``hck.MismatchError``, the seconds from a barrier before it, the wall-clock time it raised at, and this rank's
  batch count; ``how`` is ``known`` (arrays: fit knows the length) or ``unknown`` (a generator's ``tf.data``: rank
  1's fit ends first, then every rank must raise).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import tensorflow as tf
from tf_common import ALGORITHM_OPTIONS, inner_optimizer, outcome, save

FACE = sys.argv[2]
if FACE == "tf_keras":
    import tf_keras as keras
else:
    import keras

import hvd_compress.keras as hck
from hvd_compress.ops import errors
from hvd_compress.tensorflow.gradient_tape import DistributedGradientTape

if FACE == "tf_keras":
    from hvd_compress.keras import legacy

    AGREED = legacy.LossScaleOptimizer
    OWN_SCALER = keras.mixed_precision.LossScaleOptimizer
else:
    AGREED = hck.LossScaleOptimizer
    OWN_SCALER = keras.optimizers.LossScaleOptimizer

hck.init()
r, n = hck.rank(), hck.size()
OPS = sys.argv[3].split(",")
BATCH, STEPS = 8, 3
rng = np.random.default_rng(10 + r)  # each rank its own data
X = rng.standard_normal((BATCH * STEPS, 4)).astype(np.float32)
Y = np.tanh(X @ np.array([[0.5], [-1.0], [0.25], [2.0]], np.float32))
SGD_OPS = {"Average", "Sum", "Adasum", "PowerSGD", "SignSGD", "TopK"}
OPTIONS = {**ALGORITHM_OPTIONS, "PowerSGD": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 1},
           "TopK": {"compression": hck.Compression.topk(0.5)}}
out: dict = {}


def inner(op: str, **kwargs: object) -> object:
    return keras.optimizers.SGD(0.1, **kwargs) if op in SGD_OPS else inner_optimizer(keras, hck, op, 0.01, **kwargs)


def wrapped(op: str, optimizer: object) -> object:
    return hck.DistributedOptimizer(optimizer, op=getattr(hck, "Average" if op == "TopK" else op),
                                    **OPTIONS.get(op, {}))


def model() -> keras.Model:
    keras.utils.set_random_seed(7)  # the same start on every rank and in every run
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])


def fit(optimizer: object) -> list[np.ndarray]:
    """The weights after ``model.fit``'s steps, run eagerly: its train step scales the loss through the compiled
    optimizer as a traced one does (Keras 3's ``scale_loss``, tf_keras's ``minimize``), without a trace per run."""
    m = model()
    m.compile(optimizer=optimizer, loss="mse", jit_compile=False, run_eagerly=True)
    m.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return [np.asarray(v) for v in m.get_weights()]


out["start"] = model().get_weights()
for op in OPS:
    out[f"plain/{op}"] = fit(wrapped(op, inner(op)))
    scaler = AGREED(wrapped(op, inner(op)))
    out[f"around/{op}"] = fit(scaler)
    out[f"scale/{op}"] = float(np.asarray(scaler.loss_scale if FACE == "tf_keras" else scaler.dynamic_scale))
    if FACE == "keras":  # Keras 3's fixed loss scale, set on the inner optimizer (tf_keras's have none)
        out[f"factor/{op}"] = fit(wrapped(op, inner(op, loss_scale_factor=1024.0)))
    for kind, cls in (("keras", OWN_SCALER), ("ours", AGREED)):
        out[f"inside/{kind}/{op}"] = outcome(lambda cls=cls, op=op: wrapped(op, cls(inner(op))))
    out[f"advice/{op}"] = outcome(lambda op=op: AGREED(wrapped(op, OWN_SCALER(inner(op)))))
out["outside"] = outcome(lambda: fit(OWN_SCALER(wrapped("Average", inner("Average")))))

ERRORS = ["CommError", "CommTimeoutError", "LaunchError", "MismatchError", "NotInitializedError",
          "NotInProcessSetError", "PeerExitedError", "ProcessSetError", "RejectedInputError", "UsageError"]
WANT = {**{name: getattr(errors, name) for name in ERRORS}, "DistributedGradientTape": DistributedGradientTape}
out["exports"] = {name: getattr(hck, name, None) is want and name in hck.__all__ for name, want in WANT.items()}

save(r, out)  # what a failure in the uneven cases leaves for the other tests
# Uneven data last: rank 1 has the fewest batches, the others more (rank 0 the most).
batches = {0: 22, 1: 13}.get(r, 17)
UX = np.random.default_rng(20 + r).standard_normal((BATCH * batches, 4)).astype(np.float32)
UY = UX[:, :1].copy()


def generated() -> tf.data.Dataset:
    def rows():
        for i in range(batches):
            yield UX[i * BATCH:(i + 1) * BATCH], UY[i * BATCH:(i + 1) * BATCH]

    spec = (tf.TensorSpec((None, 4), tf.float32), tf.TensorSpec((None, 1), tf.float32))
    return tf.data.Dataset.from_generator(rows, output_signature=spec)


for how in ("known", "unknown"):
    m = model()
    m.compile(optimizer=wrapped("Average", inner("Average")), loss="mse", jit_compile=False)
    callback = (legacy if FACE == "tf_keras" else hck.callbacks).BroadcastGlobalVariablesCallback(0)
    data = {"x": UX, "y": UY, "batch_size": BATCH} if how == "known" else {"x": generated()}
    hck.allreduce(tf.ones(1), name=f"barrier.{how}")  # every rank starts fit from here
    began = time.monotonic()
    try:
        m.fit(**data, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
        got, mismatch = "no error", False
    except Exception as e:  # what each rank saw is the result
        got, mismatch = f"{type(e).__name__}: {e}", isinstance(e, errors.MismatchError)
    out[f"uneven/{how}"] = {"raised": got, "mismatch": mismatch, "seconds": time.monotonic() - began,
                            "at": time.time(), "batches": batches}
save(r, out)
