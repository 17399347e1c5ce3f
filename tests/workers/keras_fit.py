"""model.fit with hck.DistributedOptimizer for each op: identical parameters on every rank after every epoch, an LR
schedule on the inner optimizer honoured, save (per rank) and load_model mid-training resuming exactly, the same
with a tf.train.Checkpoint restored into a fresh model and optimizer, backward_passes_per_step, and jit_compile=True
refused on every rank. argv: out_dir, ops (comma separated)."""

import sys

import keras
import numpy as np
import tensorflow as tf
from tf_common import digest, outcome, save

import hvd_compress.keras as hck

hck.init()
r, n = hck.rank(), hck.size()
OPS = sys.argv[2].split(",")
rng = np.random.default_rng(r)
X = rng.standard_normal((96, 6)).astype("float32")
Y = np.sin(X.sum(1, keepdims=True)).astype("float32")


class Hashes(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.hashes: list[str] = []

    def on_epoch_end(self, epoch: int, logs: object = None) -> None:
        self.hashes.append(digest([v.numpy() for v in self.model.trainable_variables]))


# SLAMB: masks over the (6, 16) and (16, 1) kernels; parameters averaged every 4 steps and at each epoch's end.
OPTIONS = {"OneBitAdam": {"freeze_step": 5}, "OneBitLamb": {"freeze_step": 5},
           "SLAMB": {"compress_ratio": 0.25, "sync_interval": 4, "grad_size_thr": 0}}
# op=Average with top-k/random-k: the error feedback lives in the optimizer's variables, per rank.
COMPRESSED = {"TopK": hck.Compression.topk(0.25), "RandomK": hck.Compression.randomk(0.25, seed=3)}


def make(op: str, passes: int = 1) -> keras.Model:
    keras.utils.set_random_seed(100 + r)  # different on purpose: the broadcast callback must fix it
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=4, decay_rate=0.8)
    if op in ("OneBitLamb", "SLAMB"):
        inner = keras.optimizers.Lamb(schedule)
    elif op == "Birder":
        inner = hck.Birder(schedule)
    else:
        inner = keras.optimizers.Adam(schedule)
    options = OPTIONS.get(op, {})
    opt = hck.DistributedOptimizer(inner, op=hck.Average if op in COMPRESSED else getattr(hck, op),
                                   backward_passes_per_step=passes, compression=COMPRESSED.get(op), **options)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    return model


def fit(model: keras.Model, epochs: int) -> tuple[list[str], list[float]]:
    h = Hashes()
    hist = model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=[hck.callbacks.BroadcastGlobalVariablesCallback(0),
                                hck.callbacks.SynchronizeParametersCallback(every_epoch=True),
                                hck.callbacks.MetricAverageCallback(), h])
    return h.hashes, [float(v) for v in hist.history["loss"]]


out: dict = {}
for op in OPS:
    model = make(op)
    first, loss1 = fit(model, 2)
    path = sys.argv[1] + f"/{op}_rank{r}.keras"  # per rank: the 1-bit error feedback differs between ranks
    model.save(path)
    ckpt_path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
        sys.argv[1] + f"/{op}_ckpt_rank{r}")
    cont, loss2 = fit(model, 2)
    opt = model.optimizer
    reloaded = keras.models.load_model(path)
    resumed, _ = fit(reloaded, 2)
    fresh = make(op)  # another initialization: everything must come from the checkpoint
    fresh.optimizer.build(fresh.trainable_variables)
    tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).read(ckpt_path).assert_consumed()
    restored, _ = fit(fresh, 2)
    lr = float(keras.ops.convert_to_numpy(opt.learning_rate))
    want_lr = float(keras.ops.convert_to_numpy(opt.inner_optimizer._learning_rate(opt.iterations)))
    out[op] = {"hashes": first + cont, "resumed": resumed, "restored": restored, "loss": loss1 + loss2,
               "iterations": int(opt.iterations),
               "lr": lr, "want_lr": want_lr, "reloaded_type": type(reloaded.optimizer).__name__,
               "compression_started": opt.compression_started, "n_per_rank": len(opt.per_rank_variables),
               "per_rank": digest([v.numpy() for v in opt.per_rank_variables]),
               "reloaded_compression": repr(reloaded.optimizer.compression)}
# Gradients summed over two calls before each step.
model = make("Average", passes=2)
out["Average/passes2"] = {"hashes": fit(model, 2)[0], "iterations": int(model.optimizer.iterations)}
# XLA refused with the fix in the message, on every rank.
model = make("Average")
model.compile(optimizer=model.optimizer, loss="mse", jit_compile=True)
out["jit"] = outcome(lambda: model.fit(X, Y, batch_size=16, epochs=1, verbose=0))
out["bad_inner"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hck.OneBitAdam,
                                                            freeze_step=2))
out["bad_slamb_inner"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.Adam(0.1), op=hck.SLAMB))
out["bad_birder_option"] = outcome(lambda: hck.DistributedOptimizer(hck.Birder(), op=hck.Birder, freeze_step=2))
# A NaN gradient on the last rank only: every rank raises, no state changes, no hang; the next step works.
for op in ("SLAMB", "Birder"):
    opt = make(op).optimizer
    variables = [keras.Variable(np.ones((3, 4), "float32")), keras.Variable(np.ones(4, "float32"))]
    grads = [tf.ones((3, 4)) * (np.nan if r == n - 1 else 1.0), tf.ones(4)]
    opt.build(variables)
    before = digest([v.numpy() for v in opt.variables])
    out[f"{op}/nan"] = outcome(lambda opt=opt, variables=variables, grads=grads: opt.apply(grads, variables))
    out[f"{op}/nan_unchanged"] = before == digest([v.numpy() for v in opt.variables])
    opt.apply([tf.ones((3, 4)), tf.ones(4)], variables)
    out[f"{op}/after_nan"] = digest([v.numpy() for v in variables])
save(r, out)
