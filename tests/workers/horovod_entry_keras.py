"""Horovod's Keras entry point with hvd_compress's ops, after hvd.init(): horovod.tensorflow.keras (and
horovod.keras) DistributedOptimizer(op=hck.Adasum / hck.OneBitAdam) return hck's wrapper and model.fit keeps the
ranks identical; Horovod's own ops and calls without op stay Horovod's; the switch turns the routing off (argv[2]
"on") or, started with HVDC_HOROVOD_ENTRY=0 (argv[2] "off"), on."""

import sys

import horovod.keras as hvd_legacy
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import keras
import numpy as np
from tf_common import digest, outcome, save

import hvd_compress.keras as hck

hvd.init()
r = hvd.rank()
rng = np.random.default_rng(r)  # each rank its own data
X = rng.standard_normal((48, 6)).astype("float32")
Y = np.sin(X.sum(1, keepdims=True)).astype("float32")


def kind(make) -> str:
    """"hck" when ``make()`` returned our wrapper, else the type it returned or what it raised."""
    try:
        opt = make()
    except Exception as e:
        return f"raised {type(e).__name__}: {e}"
    return "hck" if isinstance(opt, hck.DistributedOptimizer) else f"{type(opt).__module__}.{type(opt).__name__}"


class Hashes(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.hashes: list[str] = []

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.hashes.append(digest([v.numpy() for v in self.model.trainable_variables]))


def fit(opt) -> tuple[list[str], bool]:
    keras.utils.set_random_seed(7)  # the same start on every rank
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    start = digest([v.numpy() for v in model.trainable_variables])
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    h = Hashes()
    model.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[h])
    return h.hashes, h.hashes[0] != start


def adam() -> keras.optimizers.Optimizer:
    return keras.optimizers.Adam(0.01)


out: dict = {}
if sys.argv[2] == "on":
    opt = hvd.DistributedOptimizer(adam(), op=hck.Adasum, sparse_as_dense=True, compression=hvd.Compression.none,
                                   process_set=hvd.global_process_set)
    out["adasum_type"] = kind(lambda: opt)
    out["adasum"] = fit(opt)
    opt = hvd.DistributedOptimizer(adam(), op=hck.OneBitAdam, freeze_step=1)  # step 2 on: compressed
    out["onebit_type"] = kind(lambda: opt)
    out["onebit"] = fit(opt)
    out["onebit_compressed"] = opt.compression_started
    out["onebit_hck"] = fit(hck.DistributedOptimizer(adam(), op=hck.OneBitAdam, freeze_step=1))
    out["legacy"] = kind(lambda: hvd_legacy.DistributedOptimizer(adam(), op=hck.Adasum))
    out["hvd_plain"] = kind(lambda: hvd.DistributedOptimizer(adam()))
    out["hvd_average"] = kind(lambda: hvd.DistributedOptimizer(adam(), op=hvd.Average))
    out["hc_average"] = kind(lambda: hvd.DistributedOptimizer(adam(), op=hck.Average))
    out["hvd_adasum"] = kind(lambda: hvd.DistributedOptimizer(adam(), op=hvd_tf.Adasum))
    opt = hvd.DistributedOptimizer(adam(), op=hck.OneBitAdam, freeze_step=1, backward_passes_per_step=2,
                                   average_aggregated_gradients=True)
    out["averaged_passes"] = (kind(lambda: opt), opt._hvdc.config.average_passes, opt.backward_passes_per_step)
    out["refused"] = outcome(lambda: hvd.DistributedOptimizer(adam(), op=hck.Adasum, gradient_predivide_factor=2.0))
    hck.horovod_entry(False)
    out["switched_off"] = kind(lambda: hvd.DistributedOptimizer(adam(), op=hck.Adasum))
    out["switched_off_legacy"] = kind(lambda: hvd_legacy.DistributedOptimizer(adam(), op=hck.Adasum))
else:
    out["env_off"] = kind(lambda: hvd.DistributedOptimizer(adam(), op=hck.Adasum))
    out["switched_on"] = hck.horovod_entry(True)
    out["after_switch_on"] = kind(lambda: hvd.DistributedOptimizer(adam(), op=hck.Adasum))
save(r, out)
