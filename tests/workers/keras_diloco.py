"""hck.DistributedOptimizer(opt, op=hck.DiLoCo) in Keras 3 or tf_keras (TF_USE_LEGACY_KERAS=1), one process per rank,
on the task of diloco_task.py (SGD at lr 1/2 on the same gradients as the torch worker): each rank's variables after
every step of every config; runs resumed from the optimizer's variables mid-phase (a sync in flight: its average is
made again from what this rank sent); one config inside a tf.function; bad options. argv: out_dir."""

import os

import numpy as np
import tensorflow as tf
from diloco_task import CONFIGS, RESUMES, SHAPES, SIZES, STEPS, gradient, initial
from tf_common import outcome, save

import hvd_compress.keras as hck

LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
if LEGACY:
    import tf_keras as keras
else:
    import keras

hck.init()
rank = hck.rank()


def variables(flat: np.ndarray) -> list:
    out, offset = [], 0
    for shape, size in zip(SHAPES, SIZES, strict=True):
        value = flat[offset : offset + size].reshape(shape).copy()
        out.append(tf.Variable(value) if LEGACY else keras.Variable(value))
        offset += size
    return out


def flat_of(vs: list) -> np.ndarray:
    return np.concatenate([np.asarray(v.numpy()).reshape(-1) for v in vs])


def make(options: dict):
    return hck.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.5), op=hck.DiLoCo, **options)


def opt_variables(opt) -> list:
    found = opt.variables
    return list(found() if callable(found) else found)


def apply(opt, vs: list, t: int, traced=None) -> None:
    g = gradient(rank, t, flat_of(vs))
    grads, offset = [], 0
    for shape, size in zip(SHAPES, SIZES, strict=True):
        grads.append(tf.constant(g[offset : offset + size].reshape(shape)))
        offset += size
    if traced is not None:
        traced(grads)
    elif LEGACY:
        opt.apply_gradients(zip(grads, vs, strict=True))
    else:
        opt.apply(grads, vs)


def run(opt, vs: list, start: int, stop: int, traced=None) -> list[np.ndarray]:
    out = []
    for t in range(start, stop):
        apply(opt, vs, t, traced)
        out.append(flat_of(vs))
    return out


def resumed(opt, vs: list, name: str, at: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(the run's variables after each step from ``at`` on, a new optimizer's resumed from the run's variables and
    the optimizer's variables after step ``at``): one run serves as the config's run and the uninterrupted one."""
    values, snapshot = flat_of(vs), [v.numpy() for v in opt_variables(opt)]
    want = run(opt, vs, at, STEPS)
    vs2 = variables(values)
    opt2 = make(CONFIGS[name])
    opt2.build(vs2)
    for v, x in zip(opt_variables(opt2), snapshot, strict=True):
        v.assign(x)
    return want, run(opt2, vs2, at, STEPS)


def in_function(name: str) -> list[np.ndarray]:
    vs = variables(initial())
    opt = make(CONFIGS[name])

    @tf.function
    def step(grads):
        if LEGACY:
            opt.apply_gradients(zip(grads, vs, strict=True))
        else:
            opt.apply(grads, vs)

    return run(opt, vs, 0, STEPS, traced=step)


def bad() -> dict:
    def built(**options):
        opt = make(options)
        apply(opt, variables(initial()), 0)

    return {
        "sync_every0": outcome(lambda: make({"sync_every": 0})),
        "mix1": outcome(lambda: make({"mix": 1.0})),
        "compression": outcome(lambda: make({"outer_compression": "int2"})),
        "unknown": outcome(lambda: make({"outer_beta": 0.9})),
        "bucket": outcome(lambda: make({"bucket_mb": 1.0})),
        "fragments_over_variables": outcome(lambda: built(sync_every=8, fragments=6)),
    }


def main() -> None:
    runs, resumes, copies = {}, {}, {}
    for name, options in CONFIGS.items():
        vs = variables(initial())
        opt = make(options)
        at = dict(RESUMES).get(name, STEPS)
        runs[name] = run(opt, vs, 0, at)
        if at < STEPS:
            resumes[f"{name}@{at}"] = resumed(opt, vs, name, at)
            runs[name] += resumes[f"{name}@{at}"][0]
        copies[name] = opt._hvdc.local.copies  # the copies of the variables to NumPy, over all STEPS steps
        if name == "int4":
            per_rank = sorted(v.name for v in opt.per_rank_variables)
    save(rank, {"runs": runs, "resumed": resumes, "function": in_function("stream"), "bad": bad(),
                "per_rank": per_rank, "copies": copies})


main()
