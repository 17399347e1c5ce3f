"""hck.DistributedOptimizer(opt, op=hck.PowerSGD) in Keras 3 or tf_keras (TF_USE_LEGACY_KERAS=1), one process per
rank: per step the reduced gradients (through SGD with learning rate 1 on variables starting at zero) and the state
variables (error, P, Q); a run resumed from the optimizer's variables after step RESUME_AT; bad options.
argv: out_dir, matrix_approximation_rank."""

import os
import sys

import numpy as np
import tensorflow as tf
from tf_common import outcome, save

import hvd_compress.keras as hck

LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
if LEGACY:
    import tf_keras as keras
else:
    import keras

SHAPES = [(24, 16), (16,), (12, 4, 3, 2), (24, 16), (3, 2), (20, 30), (30,)]
STEPS, START, RESUME_AT = 5, 2, 3
hck.init()
rank, size = hck.rank(), hck.size()
RANK_R = int(sys.argv[2])


def gradients(step: int) -> list[np.ndarray]:
    """A part alike on every rank plus rank noise, float32."""
    gen = np.random.default_rng(1000 * step + rank)
    return [(np.random.default_rng(i).standard_normal(s) + 0.3 * gen.standard_normal(s)).astype(np.float32)
            for i, s in enumerate(SHAPES)]


def variables() -> list:
    if LEGACY:
        return [tf.Variable(np.zeros(s, np.float32)) for s in SHAPES]
    return [keras.Variable(np.zeros(s, np.float32)) for s in SHAPES]


def make(**options):
    return hck.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), op=hck.PowerSGD, **options)


OPTIONS = {"matrix_approximation_rank": RANK_R, "start_powerSGD_iter": START, "random_seed": 7}


def opt_variables(opt) -> list:
    found = opt.variables
    return list(found() if callable(found) else found)


def apply(opt, grads: list[np.ndarray], vs: list) -> None:
    if LEGACY:
        opt.apply_gradients(zip([tf.constant(g) for g in grads], vs, strict=True))
    else:
        opt.apply([tf.constant(g) for g in grads], vs)


def run(vs: list, opt, steps: range) -> tuple[list[dict], list[np.ndarray] | None]:
    out, snapshot = [], None
    for t in steps:
        if t == RESUME_AT:
            snapshot = [v.numpy() for v in opt_variables(opt)]
        before = [v.numpy() for v in vs]
        apply(opt, gradients(t), vs)
        state = {k: v.numpy() for k, v in opt._hvdc.state.items()}
        out.append({"reduced": [b - v.numpy() for b, v in zip(before, vs, strict=True)],
                    "values": [v.numpy() for v in vs], **state})
    return out, snapshot


def main() -> None:
    vs = variables()
    opt = make(**OPTIONS)
    steps, snapshot = run(vs, opt, range(STEPS))
    # Resume: fresh variables holding the values after step RESUME_AT - 1, the optimizer's variables restored.
    vs2 = variables()
    for v, x in zip(vs2, steps[RESUME_AT - 1]["values"], strict=True):
        v.assign(x)
    opt2 = make(**OPTIONS)
    opt2.build(vs2)
    for v, x in zip(opt_variables(opt2), snapshot, strict=True):
        v.assign(x)
    resumed, _ = run(vs2, opt2, range(RESUME_AT, STEPS))
    bad = {
        "rank0": outcome(lambda: make(matrix_approximation_rank=0)),
        "unknown": outcome(lambda: make(compression_rank=2)),
        "bucket_mb": outcome(lambda: make(bucket_mb=1.0)),
        "topk": outcome(lambda: make(compression=hck.Compression.topk(0.1))),
    }
    save(rank, {"steps": steps, "resumed": resumed, "bad": bad, "inputs": [gradients(t) for t in range(STEPS)],
                "per_rank": sorted(v.name for v in opt.per_rank_variables)})


main()
