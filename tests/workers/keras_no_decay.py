"""Variables excluded from weight decay (Keras's ``exclude_from_weight_decay``) under the ops that step with their
own rule, resumed from a ``tf.train.Checkpoint`` per rank. The excluded variables come first in the algorithm's
flat state, so a checkpoint written with other exclusions must be refused, not loaded in another order.

argv: out_dir face ("keras" or "tf_keras", which TF_USE_LEGACY_KERAS must match) ops (comma list)
Saves per rank, per op: ``uninterrupted``, the parameters after each of 8 steps; ``resumed``, the last 4 of them from a
run restored after step 4 with the same exclusions; ``other``, what the first step raised after a restore with another
variable excluded; ``none``, what the restore and the first step raised with none excluded; ``decayed``, whether each
variable moved over 4 steps of zero gradients from the start (weight decay alone: only those not excluded may), the
exclusions set through the wrapper (also for op=Average); ``scaled``, the same set through the loss-scaling wrapper
around it; ``late_wrapper`` and ``late_inner``, what setting them after the first step raised, through the wrapper and
through the inner optimizer (at the next step)."""

from __future__ import annotations

import sys
import tempfile

import numpy as np
import tensorflow as tf
from tf_common import outcome, save

if sys.argv[2] == "tf_keras":
    import tf_keras as keras
else:
    import keras

import hvd_compress.keras as hck

if sys.argv[2] == "tf_keras":
    from hvd_compress.keras import legacy

hck.init()
rank = hck.rank()
SIZES = [(5,), (4, 6), (6,)]
LR, WD = 0.01, 0.05
OPTIONS = {"OneBitAdam": {"freeze_step": 2}, "OneBitLamb": {"freeze_step": 2},
           "ZeroOneAdam": {"var_freeze_step": 2, "local_step_scaler": 1, "local_step_clipper": 1,
                           "variance_bias_correction": True},
           "SLAMB": {"compress_ratio": 0.5, "sync_interval": 1, "grad_size_thr": 0, "seed": 5}, "Birder": {"seed": 3}}


def inner(op: str) -> object:
    if op == "Birder":
        return (legacy.Birder if sys.argv[2] == "tf_keras" else hck.Birder)(LR, weight_decay=WD)
    if op in ("OneBitLamb", "SLAMB") and hasattr(keras.optimizers, "Lamb"):
        return keras.optimizers.Lamb(LR, weight_decay=WD)
    return keras.optimizers.AdamW(LR, weight_decay=WD)


def fresh_variables() -> list:
    """The same start on every rank and in every run."""
    rng = np.random.default_rng(7)
    return [tf.Variable(rng.standard_normal(s).astype(np.float32), name=f"v{i}") for i, s in enumerate(SIZES)]


def make(op: str, excluded: tuple[int, ...], on_wrapper: bool = False) -> tuple[list, object]:
    """The variables and the wrapped optimizer, built; the exclusions set on the inner optimizer, or on the wrapper
    (Horovod's scripts call it there)."""
    variables = fresh_variables()
    base = inner(op)
    opt = hck.DistributedOptimizer(base, op=getattr(hck, op), **OPTIONS.get(op, {}))
    (opt if on_wrapper else base).exclude_from_weight_decay(var_list=[variables[i] for i in excluded])
    opt.build(variables)
    return variables, opt


def step(opt: object, variables: list, t: int, zero: bool = False) -> list[np.ndarray]:
    rng = np.random.default_rng(100 * t + rank)
    grads = [tf.zeros(s) if zero else tf.constant(rng.standard_normal(s).astype(np.float32)) for s in SIZES]
    opt.apply_gradients(zip(grads, variables, strict=True))
    return [v.numpy().copy() for v in variables]


def checkpoint(opt: object, variables: list) -> tf.train.Checkpoint:
    return tf.train.Checkpoint(optimizer=opt, **{f"v{i}": v for i, v in enumerate(variables)})


def decayed(op: str, scaled: bool = False) -> list[bool]:
    """Whether each variable moved over 4 steps of zero gradients from the start, v0 and v2 excluded through the
    wrapper (``scaled``: through the loss-scaling wrapper around it): weight decay alone moves a variable there."""
    if scaled:
        variables = fresh_variables()
        scaler = legacy.LossScaleOptimizer if sys.argv[2] == "tf_keras" else hck.LossScaleOptimizer
        opt = scaler(hck.DistributedOptimizer(inner(op), op=getattr(hck, op), **OPTIONS.get(op, {})))
        opt.exclude_from_weight_decay(var_list=[variables[i] for i in (0, 2)])
    else:
        variables, opt = make(op, (0, 2), on_wrapper=True)
    before = [v.numpy().copy() for v in variables]
    for t in range(4):
        after = step(opt, variables, t, zero=True)
    return [not np.array_equal(a, b) for a, b in zip(before, after, strict=True)]


def reloaded(op: str) -> dict:
    """``model.fit`` with the biases excluded (set on the wrapper), ``model.save`` per rank after an epoch,
    ``load_model``: the parameters after the next epoch, continued and reloaded, and whether the reloaded optimizer
    still excludes the biases (Keras's own config drops exclusions)."""
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    opt = hck.DistributedOptimizer(inner(op), op=getattr(hck, op), **OPTIONS.get(op, {}))
    opt.exclude_from_weight_decay(var_names=["bias"])
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((32, 6)).astype(np.float32)
    y = np.sin(x.sum(1, keepdims=True)).astype(np.float32)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    path = f"{tmp}/{op}_model_{rank}.keras"
    model.save(path)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    again = keras.models.load_model(path)
    again.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    use = again.optimizer.inner_optimizer._use_weight_decay
    return {"continued": [v.numpy() for v in model.trainable_variables],
            "reloaded": [v.numpy() for v in again.trainable_variables],
            "bias_excluded": [not use(v) for v in again.trainable_variables if "bias" in v.name]}


tmp = tempfile.mkdtemp()
out = {"Average": {"decayed": decayed("Average"), **reloaded("Average")},  # the inner optimizer applies the decay
       "scaled": {op: decayed(op, scaled=True) for op in ("Average", "OneBitAdam")}}
for op in sys.argv[3].split(","):
    variables, opt = make(op, (0, 2))
    trace = []
    for t in range(8):
        if t == 4:
            path = checkpoint(opt, variables).write(f"{tmp}/{op}_{rank}")
        trace.append(step(opt, variables, t))
    res = {"uninterrupted": trace, "decayed": decayed(op), **reloaded(op)}
    variables, opt = make(op, (0, 2))
    checkpoint(opt, variables).read(path).assert_existing_objects_matched()
    res["resumed"] = [step(opt, variables, t) for t in range(4, 8)]
    variables, opt = make(op, (0,))
    checkpoint(opt, variables).read(path).expect_partial()
    res["other"] = outcome(lambda opt=opt, variables=variables: step(opt, variables, 4))
    variables, opt = make(op, ())  # none: one bucket, so only the order entry can tell

    def restore_and_step(opt=opt, variables=variables, path=path) -> None:
        checkpoint(opt, variables).read(path).expect_partial()
        step(opt, variables, 4)

    res["none"] = outcome(restore_and_step)
    # exclusions changed after the first step: refused by the wrapper, and by the algorithm's next step
    variables, opt = make(op, (0, 2))
    step(opt, variables, 0)
    res["late_wrapper"] = outcome(lambda opt=opt, variables=variables: opt.exclude_from_weight_decay(
        var_list=variables[:1]))
    opt.inner_optimizer.exclude_from_weight_decay(var_list=variables[:1])
    res["late_inner"] = outcome(lambda opt=opt, variables=variables: step(opt, variables, 1))
    out[op] = res
save(rank, out)
