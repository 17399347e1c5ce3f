"""op=Average gradient buckets in the TF faces reduced while backward still runs (hvd_compress.tensorflow.bucketed):
Keras 3 model.fit with hck.DistributedOptimizer, and hc.DistributedGradientTape inside a tf.function, each with
overlap=True and overlap=False. A layer between the first Dense and its ReLU slows the first layer's gradient (the
last one backward computes) by 0.3 s and records how many buckets had started when it finished. Bad options
raise at construction.

The same for op=SLAMB, Birder, OneBitAdam and OneBitLamb (model.fit), whose buckets' reductions start from per-bucket
ops (hvd_compress.tensorflow.algorithm_step), also with one bucket, with steps_per_execution and resumed from a
tf.train.Checkpoint; and a Birder state of another bucket cut.

With TF_USE_LEGACY_KERAS=1 the same under tf_keras (model.fit only). TF_OVERLAP_OPS (a comma list, default all
four) names the algorithm ops to run; Birder's other cut runs where Birder is one. Saves per rank, per (face,
overlap): the parameters after every step, those buckets-started counts, and the buckets started in all.
argv: out_dir."""

import os
import time

import numpy as np
import tensorflow as tf
from tf_common import out_dir, outcome, save

LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"  # tf_keras: model.fit only (its optimizers have no apply())
if LEGACY:
    keras = tf.keras
else:
    import keras

import hvd_compress.keras as hck
import hvd_compress.tensorflow as hctf

if LEGACY:
    from hvd_compress.keras import legacy

hck.init()
r, n = hck.rank(), hck.size()
STEPS, BATCH, LR = 3, 8, 0.05
BUCKET_MB = 0.001  # ~1 KB: every kernel its own bucket (the first layer's last)


def shard(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s batches: digits-like ReLU regression data, different per rank."""
    rng = np.random.default_rng(10 + rank)
    x = rng.standard_normal((STEPS * BATCH, 12)).astype("float32")
    y = np.maximum(x[:, :4] @ rng.standard_normal((4, 3)), 0).astype("float32")
    return x, y


class SlowGradient(keras.layers.Layer):
    """Identity forward; backward sleeps ``delay`` s, then records ``probe()`` (buckets started by then). Without a
    probe it does not sleep: the runs that record nothing need no late gradient, only the same graph."""

    def __init__(self, probe, seen: list[int], delay: float = 0.3) -> None:
        super().__init__()
        self._delay = delay if probe is not None else 0.0
        self._record = (lambda: seen.append(probe())) if probe is not None else (lambda: None)

    def call(self, x):
        @tf.custom_gradient
        def ident(t):
            def grad(dy):
                def slow(d):
                    time.sleep(self._delay)
                    self._record()
                    return d

                out = tf.numpy_function(slow, [dy], dy.dtype, stateful=False)
                out.set_shape(dy.shape)
                return out

            return tf.identity(t), grad

        return ident(x)


def model(probe=None, seen: list[int] | None = None, delay: float = 0.3) -> keras.Model:
    keras.utils.set_random_seed(7)  # the same start on every rank
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(32), SlowGradient(probe, seen, delay),
                             keras.layers.ReLU(), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)])


def fit(overlap: bool) -> dict[str, object]:
    seen: list[int] = []
    holder: list = []
    net = model(lambda: holder[0]._hvdc.buckets.launched, seen)
    opt = hck.DistributedOptimizer(keras.optimizers.SGD(LR), op=hck.Average, bucket_mb=BUCKET_MB, overlap=overlap)
    holder.append(opt)
    net.compile(optimizer=opt, loss="mse", jit_compile=False)
    x, y = shard(r)
    params = []
    for s in range(STEPS):
        net.fit(x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH], batch_size=BATCH, epochs=1,
                shuffle=False, verbose=0)
        params.append([v.numpy() for v in net.trainable_variables])
    return {"params": params, "seen": seen, "launched": opt._hvdc.buckets.launched}


def inner(op: str) -> object:
    """The algorithm's inner optimizer: Adam for 1-bit Adam, Lamb for the LAMB ops (tf_keras has none: its Adam
    supplies the hyper-parameters), Birder's own."""
    if op == "Birder":
        return legacy.Birder(LR) if LEGACY else hck.Birder(LR)
    if op == "OneBitAdam" or LEGACY:
        return keras.optimizers.Adam(LR)
    return keras.optimizers.Lamb(LR)


# 1-bit: the first step is the dense warm-up (its buckets' gradient averages), the others compressed.
ALGORITHMS = {"SLAMB": {"compress_ratio": 0.25, "sync_interval": STEPS, "grad_size_thr": 0, "seed": 3},
              "Birder": {"seed": 3}, "OneBitAdam": {"freeze_step": 1}, "OneBitLamb": {"freeze_step": 1}}


def fit_algorithm(op: str, overlap: bool, bucket_mb: float = BUCKET_MB, steps_per_execution: int = 1
                  ) -> dict[str, object]:
    """op=SLAMB (compress_ratio 0.25, the parameters averaged after the last step) or Birder: the buckets'
    reductions start from the bucket start ops (``algorithm_step``'s bucketed runners); ``seen`` as ``fit``'s,
    counted by the algorithm for the step under way."""
    seen: list[int] = []
    holder: list = []
    # One bucket holds the first layer, whose gradient needs the probe's output: it cannot have started by the probe,
    # whatever the delay.
    net = model(lambda: holder[0]._hvdc.runner.algorithm.launched, seen, 0.3 if bucket_mb == BUCKET_MB else 0.0)
    opt = hck.DistributedOptimizer(inner(op), op=getattr(hck, op), bucket_mb=bucket_mb, overlap=overlap,
                                   **ALGORITHMS[op])
    holder.append(opt)
    net.compile(optimizer=opt, loss="mse", jit_compile=False, steps_per_execution=steps_per_execution)
    x, y = shard(r)
    params = []
    if steps_per_execution > 1:
        net.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        return {"params": [[v.numpy() for v in net.trainable_variables]], "seen": seen}
    for s in range(STEPS):
        net.fit(x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH], batch_size=BATCH, epochs=1,
                shuffle=False, verbose=0)
        params.append([v.numpy() for v in net.trainable_variables])
    return {"params": params, "seen": seen, "buckets": len(opt._hvdc.runner.ranges),
            "state": {k: v.numpy() for k, v in opt._hvdc.state.items()}}


def resumed(op: str) -> bool:
    """Whether 3 steps, a ``tf.train.Checkpoint`` save, a restore into a new model and optimizer that took a step of
    its own, and 3 more steps end bit-identical to 6 steps never stopped (two buckets: per-bucket state and the cut
    restored)."""
    def make() -> tuple[keras.Model, object]:
        net = model()
        opt = hck.DistributedOptimizer(inner(op), op=getattr(hck, op), bucket_mb=BUCKET_MB, **ALGORITHMS[op])
        net.compile(optimizer=opt, loss="mse", jit_compile=False)
        return net, opt

    x, y = shard(r)

    def fit(net: keras.Model, first: int, end: int) -> None:
        net.fit(x[first:end], y[first:end], batch_size=BATCH // 2, epochs=1, shuffle=False, verbose=0)

    half = BATCH // 2 * 3  # 3 steps of half batches
    net, _ = make()
    fit(net, 0, 2 * half)
    want = [v.numpy() for v in net.trainable_variables]
    net, opt = make()
    fit(net, 0, half)
    path = tf.train.Checkpoint(model=net, optimizer=opt).save(str(out_dir() / f"{op}_rank{r}"))
    net, opt = make()
    fit(net, half, half + BATCH // 2)  # state of its own first
    tf.train.Checkpoint(model=net, optimizer=opt).restore(path)
    fit(net, half, 2 * half)
    return all(np.array_equal(a, v.numpy()) for a, v in zip(want, net.trainable_variables, strict=True))


def birder_other_layout() -> dict[str, object]:
    """A Birder state whose recorded bucket cut is not the optimizer's (a checkpoint of another bucket_mb), or that
    records none past step 0: the next step raises on every rank, state and parameters unchanged; with the cut put
    back, the step after runs."""
    net = model()
    opt = hck.DistributedOptimizer(inner("Birder"), op=hck.Birder, bucket_mb=BUCKET_MB, **ALGORITHMS["Birder"])
    net.compile(optimizer=opt, loss="mse", jit_compile=False)
    x, y = shard(r)
    net.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    good = opt._hvdc.state["buckets"].numpy()
    opt._hvdc.state["buckets"].assign(good[::-1].copy())
    before = [v.numpy() for v in net.trainable_variables] + [v.numpy() for v in opt._hvdc.state.values()]
    error = outcome(lambda: net.fit(x[BATCH:2 * BATCH], y[BATCH:2 * BATCH], batch_size=BATCH, epochs=1,
                                    shuffle=False, verbose=0))
    after = [v.numpy() for v in net.trainable_variables] + [v.numpy() for v in opt._hvdc.state.values()]
    # no cut recorded past step 0: a checkpoint of before buckets
    opt._hvdc.state["buckets"].assign(np.zeros_like(good))
    none = outcome(lambda: net.fit(x[BATCH:2 * BATCH], y[BATCH:2 * BATCH], batch_size=BATCH, epochs=1,
                                   shuffle=False, verbose=0))
    opt._hvdc.state["buckets"].assign(good)
    net.fit(x[BATCH:2 * BATCH], y[BATCH:2 * BATCH], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return {"error": error, "none": none,
            "unchanged": all(np.array_equal(a, b) for a, b in zip(before, after, strict=True)),
            "then": [v.numpy() for v in net.trainable_variables]}


def fit_steps_per_execution() -> list[np.ndarray]:
    """model.fit running all STEPS train steps in one tf.function call (steps_per_execution): the final parameters."""
    net = model()
    opt = hck.DistributedOptimizer(keras.optimizers.SGD(LR), op=hck.Average, bucket_mb=BUCKET_MB)
    net.compile(optimizer=opt, loss="mse", jit_compile=False, steps_per_execution=STEPS)
    x, y = shard(r)
    net.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert opt._hvdc.buckets.launched == 2 * STEPS, opt._hvdc.buckets.launched
    return [v.numpy() for v in net.trainable_variables]


def tape(overlap: bool) -> dict[str, object]:
    seen: list[int] = []
    holder: list = []
    net = model(lambda: holder[0].buckets.launched, seen)
    opt = keras.optimizers.SGD(LR)
    x, y = shard(r)

    @tf.function(jit_compile=False)
    def step(xb, yb):
        with tf.GradientTape() as t:
            loss = tf.reduce_mean(tf.square(net(xb) - yb))
        dt = hctf.DistributedGradientTape(t, bucket_mb=BUCKET_MB, overlap=overlap)
        holder[:] = [dt]
        grads = dt.gradient(loss, net.trainable_variables)
        opt.apply(grads, net.trainable_variables)

    params = []
    for s in range(STEPS):
        step(x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH])
        params.append([v.numpy() for v in net.trainable_variables])
    return {"params": params, "seen": seen, "launched": holder[0].buckets.launched}


def simulate() -> list[list[np.ndarray]]:
    """SGD on the gradient averaged over every rank's batch, computed here without communication."""
    net = model()
    shards = [shard(k) for k in range(n)]
    params = []
    for s in range(STEPS):
        grads = []
        for x, y in shards:
            with tf.GradientTape() as t:
                loss = tf.reduce_mean(tf.square(net(x[s * BATCH:(s + 1) * BATCH]) - y[s * BATCH:(s + 1) * BATCH]))
            grads.append([g.numpy().astype(np.float64) for g in t.gradient(loss, net.trainable_variables)])
        for v, *gs in zip(net.trainable_variables, *grads, strict=True):
            v.assign((v.numpy() - LR * np.mean(gs, axis=0)).astype(np.float32))
        params.append([v.numpy() for v in net.trainable_variables])
    return params


out: dict[str, object] = {"simulated": simulate()}
sgd = keras.optimizers.SGD(LR)
out["bad"] = {
    "bucket_mb=0": outcome(lambda: hck.DistributedOptimizer(sgd, op=hck.Average, bucket_mb=0)),
    "overlap='yes'": outcome(lambda: hck.DistributedOptimizer(sgd, op=hck.Sum, overlap="yes")),
    "freeze_step": outcome(lambda: hck.DistributedOptimizer(sgd, op=hck.Average, freeze_step=3)),
    "tape bucket_mb=-1": outcome(lambda: hctf.DistributedGradientTape(tf.GradientTape(), bucket_mb=-1)),
    "tape overlap='yes'": outcome(lambda: hctf.DistributedGradientTape(tf.GradientTape(), overlap="yes")),
}
for face, run in (("fit", fit),) if LEGACY else (("fit", fit), ("tape", tape)):
    for overlap in (True, False):
        out[f"{face}-{overlap}"] = run(overlap)
out["fit-steps_per_execution"] = fit_steps_per_execution()
for op in os.environ.get("TF_OVERLAP_OPS", ",".join(ALGORITHMS)).split(","):
    for overlap in (True, False):
        out[f"{op}-{overlap}"] = fit_algorithm(op, overlap)
    out[f"{op}-one-bucket"] = fit_algorithm(op, True, bucket_mb=100.0)
    out[f"{op}-steps_per_execution"] = fit_algorithm(op, True, steps_per_execution=STEPS)
    out[f"{op}-resumed"] = resumed(op)
    out["bad"].update({
        f"{op} bucket_mb=0": outcome(lambda op=op: hck.DistributedOptimizer(inner(op), op=getattr(hck, op),
                                                                              bucket_mb=0)),
        f"{op} overlap=1": outcome(lambda op=op: hck.DistributedOptimizer(inner(op), op=getattr(hck, op), overlap=1)),
    })
if "Birder" in os.environ.get("TF_OVERLAP_OPS", "Birder"):
    out["Birder-other-layout"] = birder_other_layout()

save(r, out)
