"""hck.DistributedOptimizer with compression=topk/randomk (error feedback in the optimizer's variables): SGD(1) from
zeros leaves -(the reduced gradient) in the variables, step by step (the test compares with the NumPy reference);
a variable without a gradient; one step inside a tf.function; the config round trip; a NaN on the last rank only;
bad arguments. argv: out_dir."""

import functools

import keras
import numpy as np
import tensorflow as tf
from tf_common import digest, outcome, save

import hvd_compress.keras as hck

hck.init()
r, n = hck.rank(), hck.size()


def rank_input(rank: int, numel: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed * 1000 + rank).standard_normal(numel).astype("float32")


CASES = {
    "topk": (hck.Average, hck.Compression.topk(0.2)),
    "randomk": (hck.Sum, hck.Compression.randomk(0.3, seed=5)),
    "dgc": (hck.Average, hck.Compression.topk(0.2, momentum=0.9)),
    # DGC's clipping (threshold 6 / sqrt(n): some steps clipped on some ranks) and a warm-up over the 3 steps,
    # whose first density (0.56) is sent dense at every rank count, its second (0.32) at 4 ranks.
    "dgc_full": (hck.Average, hck.Compression.topk(0.1, momentum=0.9, momentum_masking=False, clip_norm=6.0,
                                                   warmup_steps=3, warmup_stages=3)),
}
out: dict = {}
for case, (op, compression) in CASES.items():
    opt = hck.DistributedOptimizer(keras.optimizers.SGD(1.0), op=op, compression=compression)
    opt = hck.DistributedOptimizer.from_config(opt.get_config())
    # The third variable never gets a gradient: its elements are zeros in the fused buffer and it is not applied.
    variables = [keras.Variable(np.zeros((4, 5), "float32")), keras.Variable(np.zeros(7, "float32")),
                 keras.Variable(np.zeros(3, "float32"))]
    opt.build(variables)
    steps = []
    for k in range(3):
        x = rank_input(r, 27, 40 + k)
        grads = [tf.constant(x[:20].reshape(4, 5)), tf.constant(x[20:]), None]
        for v in variables:
            v.assign(tf.zeros_like(v))
        if k == 1:
            tf.function(functools.partial(opt.apply, grads, variables))()
        else:
            opt.apply(grads, variables)
        steps.append(-np.concatenate([v.numpy().reshape(-1) for v in variables[:2]]))
        out[f"{case}/untouched"] = variables[2].numpy().copy()
    out[case] = {
        "steps": steps,
        "error": opt._hvdc.state["compression_error"].numpy().copy(),
        "velocity": opt._hvdc.state["compression_velocity"].numpy().copy() if compression.momentum else None,
        "step": int(opt._hvdc.state["compression_step"].numpy()),
        "config": opt.get_config()["compression"],
        "repr": repr(opt.compression),
        "per_rank": sorted(v.path.rsplit("/", 1)[-1] for v in opt.per_rank_variables),
        "comm": opt.comm_stats(),
    }
    # A NaN on the last rank only: every rank raises, no variable changes, no hang; the next step works.
    before = digest([v.numpy() for v in opt.variables] + [v.numpy() for v in variables])
    bad = [tf.ones((4, 5)) * (np.nan if r == n - 1 else 1.0), tf.ones(7), None]
    out[f"{case}/nan"] = outcome(lambda opt=opt, bad=bad, variables=variables: opt.apply(bad, variables))
    out[f"{case}/nan_unchanged"] = before == digest([v.numpy() for v in opt.variables] + [v.numpy() for v in variables])
    opt.apply([tf.ones((4, 5)), tf.ones(7), None], variables)
    out[f"{case}/after_nan"] = digest([v.numpy() for v in variables])
    opt.reset_compression_state()
    out[f"{case}/reset"] = float(np.abs(opt._hvdc.state["compression_error"].numpy()).max())

out["bad/adasum"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hck.Adasum,
                                                             compression=hck.Compression.topk(0.5)))
out["bad/second_momentum"] = outcome(lambda: hck.DistributedOptimizer(
    keras.optimizers.SGD(0.1, momentum=0.9), compression=hck.Compression.topk(0.5, momentum=0.9)))
out["bad/adam_momentum"] = outcome(lambda: hck.DistributedOptimizer(
    keras.optimizers.Adam(0.1), compression=hck.Compression.topk(0.5, momentum=0.9)))


def float64_build() -> None:
    opt = hck.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=hck.Compression.randomk(0.5))
    opt.build([keras.Variable(np.zeros(3, "float64"))])


out["bad/float64"] = outcome(float64_build)
save(r, out)
