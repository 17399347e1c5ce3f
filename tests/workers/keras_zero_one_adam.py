"""hck.DistributedOptimizer(op=ZeroOneAdam) around Keras 3's AdamW, or tf_keras's with TF_USE_LEGACY_KERAS=1, with
given per-rank gradients (``apply_gradients``), for the test to feed the same ones to the NumPy reference: every
step's parameters and their hash. Then what each rank's constructor says to LAMB's options (``min_coeff``,
``max_coeff``, ``bias_correction``) around an Adam/AdamW (op=OneBitAdam, ZeroOneAdam) and to op=OneBitLamb around
an Adam. With ``edits`` (steps a,b,c): a second run in which every rank halves the first variable before step a,
calls ``synchronize_parameters()`` before step b, and rank 1 adds 0.25 to the second variable before step c (spec
Z20), its parameters as ``edited``. With ``lrs`` (one learning rate per step, colon-separated): a third run that sets
the wrapper's ``learning_rate`` to them before each step, as ``LearningRateScheduler`` does (spec Z21), its
parameters as ``scheduled``.

argv: out_dir steps sizes(comma list) options(k=v,...) [edits(a,b,c) [lrs(a:b:...)]]
"""

import os
import sys

import numpy as np
import tensorflow as tf
from tf_common import digest, outcome, save

import hvd_compress.keras as hck

legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
if legacy:
    keras = tf.keras
    assert keras.__name__.startswith("tf_keras"), keras.__name__
else:
    import keras
steps = int(sys.argv[2])
sizes = [int(s) for s in sys.argv[3].split(",")]
BOOLS = ("variance_bias_correction", "reset_momentum_at_sync")
options = {k: v == "1" if k in BOOLS else int(v)
           for k, v in (kv.split("=") for kv in sys.argv[4].split(",") if kv)}
hck.init()
r = hck.rank()
total = sum(sizes)


def given(seed: int, rank: int) -> np.ndarray:
    """The test's inputs: float32 normal draws from (seed, rank)."""
    return np.random.default_rng(1000 * seed + rank).standard_normal(total).astype(np.float32)


edits = [int(s) for s in sys.argv[5].split(",")] if len(sys.argv) > 5 else []
schedule = [float(s) for s in sys.argv[6].split(":")] if len(sys.argv) > 6 else []


def run(edited: bool, lrs: list[float] | None = None) -> list[np.ndarray]:
    """Every step's parameters, flat; ``edited``: with the change and the calls of ``edits``; ``lrs``: the learning
    rate of each step."""
    x0 = np.split(given(777, 0), np.cumsum(sizes)[:-1])
    variables = [tf.Variable(x) if legacy else keras.Variable(x) for x in x0]
    inner = keras.optimizers.AdamW(learning_rate=0.01, weight_decay=0.05, epsilon=1e-8)
    opt = hck.DistributedOptimizer(inner, op=hck.ZeroOneAdam, **options)
    trace = []
    for step in range(steps):
        if edited and step == edits[0]:  # seen at the step (spec Z20)
            variables[0].assign(variables[0] * 0.5)
        if edited and step == edits[1]:
            opt.synchronize_parameters()
        if edited and step == edits[2] and r == 1:  # on one rank, before a sync step
            variables[1].assign_add(tf.fill(variables[1].shape, 0.25))
        if lrs:
            opt.learning_rate = lrs[step]
        grads = np.split(given(step + 1, r), np.cumsum(sizes)[:-1])
        opt.apply_gradients(zip([tf.constant(g) for g in grads], variables, strict=True))
        trace.append(np.concatenate([np.asarray(v.numpy()).reshape(-1) for v in variables]))
    return trace


trace = run(False)
hashes = [digest([flat]) for flat in trace]

lamb_options = {}
for op, needs in ((hck.OneBitAdam, {"freeze_step": 2}), (hck.ZeroOneAdam, {})):
    for option, value in (("min_coeff", 0.1), ("max_coeff", 5.0), ("bias_correction", False)):
        lamb_options[(op.name, option)] = outcome(lambda op=op, needs=needs, option=option, value=value: (
            hck.DistributedOptimizer(keras.optimizers.AdamW(0.01), op=op, **needs, **{option: value})))
lamb_over_adam = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.Adam(0.01), op=hck.OneBitLamb,
                                                          freeze_step=2, min_coeff=0.5))
# Each op around an inner optimizer of another kind than the one it wraps: what the constructor says (item 10).
if legacy:
    from hvd_compress.keras.legacy import Birder as FaceBirder
else:
    FaceBirder = hck.Birder
INNER = {"AdamW": lambda: keras.optimizers.AdamW(0.01), "Birder": lambda: FaceBirder(0.01)}
if not legacy:
    INNER["Lamb"] = lambda: keras.optimizers.Lamb(0.01)
MISMATCHED = {"OneBitAdam": ("Lamb", "Birder"), "ZeroOneAdam": ("Lamb", "Birder"), "OneBitLamb": ("Birder",),
              "SLAMB": ("Birder",), "Birder": ("AdamW", "Lamb")}
needs = {"OneBitAdam": {"freeze_step": 2}, "OneBitLamb": {"freeze_step": 2}}
inner_mismatch = {(op, name): outcome(lambda op=op, name=name: hck.DistributedOptimizer(
    INNER[name](), op=getattr(hck, op), **needs.get(op, {})))
    for op, names in MISMATCHED.items() for name in names if name in INNER}
if not legacy:  # Keras 3's LAMB ops wrap a Lamb only (tf_keras has none: an Adam supplies LAMB's hyper-parameters)
    for op in ("OneBitLamb", "SLAMB"):
        inner_mismatch[(op, "AdamW")] = outcome(lambda op=op: hck.DistributedOptimizer(
            INNER["AdamW"](), op=getattr(hck, op), **needs.get(op, {})))
save(r, {"inner_mismatch": inner_mismatch, "trace": trace, "hashes": hashes, "legacy": legacy,
         "lamb_options": lamb_options,
         "lamb_over_adam": lamb_over_adam, "edited": run(True) if edits else None,
         "scheduled": run(False, schedule) if schedule else None})
