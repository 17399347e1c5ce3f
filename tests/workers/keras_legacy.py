"""tf_keras (TF_USE_LEGACY_KERAS=1): model.fit with hck.DistributedOptimizer around a tf_keras optimizer for every op:
identical parameters on every rank after every epoch, an LR schedule honoured, a tf.train.Checkpoint restored into
a fresh model and a per-rank ``model.save(".keras")`` reloaded with ``load_model`` both resuming exactly;
legacy.MetricAverageCallback averaging the epoch loss over ranks; the same first epochs through the Keras 3 wrapper
in this process (same start, data and hyper-parameters) for the parameters to compare; backward_passes_per_step=2;
bad inner optimizers refused;
mixed_float16 with legacy.LossScaleOptimizer: an overflow on the last rank only skips that step on every rank, and
tf_keras's own LossScaleOptimizer around hck.DistributedOptimizer is refused on every rank; its comm_stats() holds every
byte of a further epoch, the finite checks' too.
argv: out_dir, ops (comma separated)."""

import os
import sys

import keras as keras3
import numpy as np
import tensorflow as tf
from tf_common import digest, outcome, rank_data, save

import hvd_compress.keras as hck
from hvd_compress.keras import legacy
from hvd_compress.ops.runtime import comm_stats

assert os.environ.get("TF_USE_LEGACY_KERAS") == "1"
keras = tf.keras
assert keras.__name__.startswith("tf_keras"), keras.__name__
hck.init()
r, n = hck.rank(), hck.size()
OPS = sys.argv[2].split(",")
X, Y = rank_data(r)  # each rank its own data
LAMB_OPS = ("OneBitLamb", "SLAMB")
OPTIONS = {"OneBitAdam": {"freeze_step": 3}, "OneBitLamb": {"freeze_step": 3},
           "SLAMB": {"compress_ratio": 0.25, "sync_interval": 3, "grad_size_thr": 0}}
# op=Average with top-k/random-k: the error feedback lives in the optimizer's variables, per rank.
COMPRESSED = {"TopK": hck.Compression.topk(0.25), "RandomK": hck.Compression.randomk(0.25, seed=3)}


class Record(keras.callbacks.Callback):
    """Hashes after each epoch and the starting weights (after the broadcast callback, which runs first)."""

    def __init__(self) -> None:
        super().__init__()
        self.hashes: list[str] = []
        self.start: list[np.ndarray] = []

    def on_train_begin(self, logs: object = None) -> None:
        self.start = [v.numpy() for v in self.model.trainable_variables]

    def on_epoch_end(self, epoch: int, logs: object = None) -> None:
        self.hashes.append(digest([v.numpy() for v in self.model.trainable_variables]))


class RawLoss(keras.callbacks.Callback):
    """This rank's own epoch loss, read before ``MetricAverageCallback`` replaces it by the average over ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.loss: list[float] = []

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.loss.append(float(logs["loss"]))


def inner(op: str, k: object) -> object:
    """The inner optimizer under tf_keras (k = tf.keras) or Keras 3 (k = keras3) with the same hyper-parameters."""
    schedule = k.optimizers.schedules.ExponentialDecay(0.02, decay_steps=4, decay_rate=0.8)
    if op == "Birder":
        return legacy.Birder(schedule) if k is keras else hck.Birder(schedule)
    if op in LAMB_OPS:  # tf_keras has no LAMB: Adam supplies its hyper-parameters
        return keras.optimizers.Adam(schedule) if k is keras else keras3.optimizers.Lamb(schedule)
    return k.optimizers.Adam(schedule)


def make(op: str, k: object = keras, passes: int = 1) -> object:
    k.utils.set_random_seed(100 + r)  # different on purpose: the broadcast callback must fix it
    model = k.Sequential([k.Input((6,)), k.layers.Dense(16, activation="tanh"), k.layers.Dense(1)])
    opt = hck.DistributedOptimizer(inner(op, k), op=hck.Average if op in COMPRESSED else getattr(hck, op),
                                   backward_passes_per_step=passes, compression=COMPRESSED.get(op),
                                   **OPTIONS.get(op, {}))
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    return model


def fit(model: object, epochs: int) -> tuple[Record, list[float], list[float]]:
    """Records, the epoch losses averaged over ranks (in the History) and this rank's own."""
    rec, raw = Record(), RawLoss()
    hist = model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=[legacy.BroadcastGlobalVariablesCallback(0),
                                legacy.SynchronizeParametersCallback(every_epoch=True), raw,
                                legacy.MetricAverageCallback(), rec])
    return rec, [float(v) for v in hist.history["loss"]], raw.loss


def fit_keras3(op: str, start: list[np.ndarray], epochs: int) -> list[np.ndarray]:
    """The Keras 3 wrapper from the same start (alike on every rank already) on the same data."""
    model = make(op, keras3)
    model.set_weights(start)
    model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hck.callbacks.SynchronizeParametersCallback(every_epoch=True)])
    return [np.asarray(v) for v in model.get_weights()]


out: dict = {}
for op in OPS:
    model = make(op)
    first, loss1, raw1 = fit(model, 2)
    after2 = [v.numpy() for v in model.trainable_variables]
    keras_path = sys.argv[1] + f"/{op}_rank{r}.keras"  # per rank: the error feedback differs between ranks
    model.save(keras_path)
    saved = [digest([v.numpy() for v in model.optimizer.per_rank_variables]),
             digest([v.numpy() for v in model.optimizer.variables])]
    ckpt_path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(sys.argv[1] + f"/{op}_rank{r}")
    cont, loss2, raw2 = fit(model, 2)
    opt = model.optimizer
    fresh = make(op)
    fresh.optimizer.build(fresh.trainable_variables)
    tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).read(ckpt_path).assert_consumed()
    restored, _, _ = fit(fresh, 2)
    reloaded = keras.models.load_model(keras_path)
    loaded = [digest([v.numpy() for v in reloaded.optimizer.per_rank_variables]),
              digest([v.numpy() for v in reloaded.optimizer.variables])]
    resumed, _, _ = fit(reloaded, 2)
    out[op] = {"hashes": first.hashes + cont.hashes, "restored": restored.hashes, "resumed": resumed.hashes,
               "reloaded_type": type(reloaded.optimizer).__module__, "reloaded_op": reloaded.optimizer.op.name,
               "reloaded_compression": repr(reloaded.optimizer.compression),
               "saved_state": saved, "loaded_state": loaded, "n_per_rank": len(opt.per_rank_variables),
               "loss": loss1 + loss2, "raw_loss": raw1 + raw2,
               "type": type(opt).__module__, "iterations": int(opt.iterations), "lr": float(opt.learning_rate),
               "want_lr": float(opt.inner_optimizer._learning_rate(opt.iterations - 1)),  # the last step's
               "compression_started": opt.compression_started,
               "tf_keras": after2, "keras3": fit_keras3(op, first.start, 2)}
for op in ("Average", "Adasum"):  # gradients summed over two calls before each step
    model = make(op, passes=2)
    rec, _, _ = fit(model, 2)
    out[f"{op}/passes2"] = {"hashes": rec.hashes, "iterations": int(model.optimizer.iterations)}
# compression=fp16 (Average) on the fused gradient reduction: SGD(1) from zeros leaves -(the reduced gradient).
opt = hck.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hck.Average, compression=hck.Compression.fp16)
opt = legacy.DistributedOptimizer.from_config(opt.get_config())
g = np.random.default_rng(30 * 1000 + r).standard_normal(27).astype("float32")  # the test's _inputs(n, 27, 30)
variables = [tf.Variable(np.zeros((4, 5), "float32")), tf.Variable(np.zeros(7, "float32"))]
opt.apply_gradients(zip([tf.constant(g[:20].reshape(4, 5)), tf.constant(g[20:])], variables, strict=True))
out["fp16"] = {"got": -np.concatenate([v.numpy().reshape(-1) for v in variables]), "kind": opt.compression.kind}
out["bad_lamb_inner"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hck.SLAMB))
out["bad_birder_inner"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.Adam(0.1), op=hck.Birder))
out["bad_passes"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.Adam(0.1), backward_passes_per_step=0))

keras.mixed_precision.set_global_policy("mixed_float16")
XM = X.copy()
if r == n - 1:
    XM[2 * 16] = 1e6  # beyond float16's 65504: Inf in this rank's forward pass of batch 2 only


def make_mixed(op: str, agreed: bool = True) -> object:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    opt = hck.DistributedOptimizer(keras.optimizers.Adam(0.01), op=getattr(hck, op), **OPTIONS.get(op, {}))
    model.compile(optimizer=legacy.LossScaleOptimizer(opt) if agreed else opt, loss="mse", jit_compile=False)
    return model


for op in ("Average", "OneBitAdam"):
    model = make_mixed(op)
    model.fit(XM, Y, batch_size=16, epochs=1, shuffle=False, verbose=0,
              callbacks=[legacy.BroadcastGlobalVariablesCallback(0)])
    lso = model.optimizer
    steps = lso.inner_optimizer._hvdc.state["step"] if op == "OneBitAdam" else None
    out[f"mixed/{op}"] = {
        "hash": digest([v.numpy() for v in model.trainable_variables]), "type": type(lso).__name__,
        "steps": None if steps is None else int(steps.numpy()), "scale": float(lso.loss_scale.numpy()),
        "finite": bool(all(np.isfinite(v.numpy()).all() for v in model.trainable_variables))}
    lso.comm_stats(), comm_stats(reset=True)  # one more epoch: all its bytes the optimizer's, finite checks too
    model.fit(XM, Y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    out[f"mixed/{op}"]["bytes"] = (lso.comm_stats(), comm_stats(reset=True))
model = make_mixed("Average", agreed=False)
out["mixed/plain"] = outcome(lambda: model.fit(XM, Y, batch_size=16, epochs=1, verbose=0))
keras.mixed_precision.set_global_policy("float32")
save(r, out)
