"""The inner optimizer's gradient clipping (``clipnorm``, ``global_clipnorm``, ``clipvalue``) under the Keras
algorithm ops: each rank's gradient is clipped by Keras's own rule before the algorithm's step.

argv: out_dir face ("keras" or "tf_keras", which TF_USE_LEGACY_KERAS must match) cases (comma list of
``op:option``, e.g. ``OneBitAdam:clipnorm``)
Saves per rank, per case: ``clipped``, the variables after 8 steps with the option set on the inner optimizer (for
SLAMB and 0/1 Adam after ``synchronize_parameters()``); ``by_hand``, the same run without it, each rank's gradients
clipped before ``apply_gradients`` by ``_clip_gradients`` of a second, unwrapped optimizer with the option (Keras's
own rule, not a copy of it); ``on_wrapper``, the option set on the wrapper after construction (as on Horovod's, a
subclass of the optimizer); ``free``, with no clipping at all (to show it acted; one run per op); ``fit``, the
variables after one epoch of ``model.fit`` with the option, or the error it raised. Per op of ``LATE``: ``late``
(AdamW's ``weight_decay`` set on the wrapper and ``beta_1`` on the inner optimizer after wrapping, before the first
step), ``given`` (both given to AdamW) and ``default`` (neither)."""

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
#: Small enough to act on this model's gradients at every step.
CLIP = {"clipnorm": 0.05, "global_clipnorm": 0.05, "clipvalue": 0.01}
AVERAGED = ("SLAMB", "ZeroOneAdam")  # the ranks' models differ between syncs: compared after an average


def inner(op: str, **kwargs: float) -> object:
    return inner_optimizer(keras, hck, op, LR, **kwargs)


def model_and_data() -> tuple[object, list[tuple[np.ndarray, np.ndarray]]]:
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    rng = np.random.default_rng(rank)
    data = []
    for _ in range(8):
        x = rng.standard_normal((16, 6)).astype(np.float32)
        data.append((x, (np.sin(x.sum(1, keepdims=True)) + 1).astype(np.float32)))
    return model, data


def run(op: str, option: str, mode: str) -> list[np.ndarray]:
    model, data = model_and_data()
    clip = {option: CLIP[option]} if mode == "clipped" else {}
    opt = hck.DistributedOptimizer(inner(op, **clip), op=getattr(hck, op), **OPTIONS.get(op, {}))
    if mode == "on_wrapper":
        setattr(opt, option, CLIP[option])
    rule = inner(op, **{option: CLIP[option]})  # only its _clip_gradients is used

    step = mse_step(model, opt, edit=rule._clip_gradients if mode == "by_hand" else None)

    for x, y in data:
        step(tf.constant(x), tf.constant(y))
    if op in AVERAGED:
        opt.synchronize_parameters()
    return [v.numpy() for v in model.trainable_variables]


def fit(op: str, option: str) -> object:
    model, data = model_and_data()
    opt = hck.DistributedOptimizer(inner(op, **{option: CLIP[option]}), op=getattr(hck, op), **OPTIONS.get(op, {}))
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    err = outcome(lambda: model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False))
    return err if err != "no error" else [v.numpy() for v in model.trainable_variables]


LATE = ("OneBitAdam", "Average")


def late(op: str, mode: str) -> list[np.ndarray]:
    model, data = model_and_data()
    given = {"weight_decay": 0.05, "beta_1": 0.5} if mode == "given" else {}
    opt = hck.DistributedOptimizer(keras.optimizers.AdamW(LR, **given), op=getattr(hck, op), **OPTIONS.get(op, {}))
    if mode == "late":
        opt.weight_decay = 0.05
        opt.inner_optimizer.beta_1 = 0.5
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    return [v.numpy() for v in model.trainable_variables]


out = {op: {mode: late(op, mode) for mode in ("late", "given", "default")} for op in LATE}
free = {}  # the run with no clipping depends on the op only: one per op, shared by its cases
for case in sys.argv[3].split(","):
    op, option = case.split(":")
    out[case] = {mode: run(op, option, mode) for mode in ("clipped", "by_hand", "on_wrapper")}
    out[case]["free"] = free[op] = free[op] if op in free else run(op, option, "free")
    out[case]["fit"] = fit(op, option)
save(rank, out)
