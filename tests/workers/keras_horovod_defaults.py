"""A Keras model.fit script that spells out Horovod's DistributedOptimizer arguments at their defaults, with each
hvd_compress op: hck.DistributedOptimizer takes them and trains; a value other than the default, or an unknown
option, is refused with a message naming everything the op takes."""

import horovod.tensorflow.keras as hvd
import keras
import numpy as np
from tf_common import digest, outcome, save

import hvd_compress.keras as hck

hvd.init()
r = hvd.rank()
rng = np.random.default_rng(r)  # each rank its own data
X = rng.standard_normal((32, 6)).astype("float32")
Y = np.sin(X.sum(1, keepdims=True)).astype("float32")

HOROVOD_DEFAULTS = dict(compression=hvd.Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                        backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None,
                        process_set=hvd.global_process_set, device_dense="", device_sparse="",
                        scale_local_gradients=True)
OPS = {
    "Average": (lambda: keras.optimizers.SGD(0.05), {}),
    "Adasum": (lambda: keras.optimizers.Adam(0.01), {}),
    "OneBitAdam": (lambda: keras.optimizers.Adam(0.01), {"freeze_step": 2}),
    "OneBitLamb": (lambda: keras.optimizers.Lamb(0.01), {"freeze_step": 2}),
    "SLAMB": (lambda: keras.optimizers.Lamb(0.01), {"sync_interval": 2}),
    "Birder": (lambda: hck.Birder(0.001), {}),
}


def fit(name: str) -> list[str]:
    make, options = OPS[name]
    opt = hck.DistributedOptimizer(make(), op=getattr(hck, name), **HOROVOD_DEFAULTS, **options)
    keras.utils.set_random_seed(7)  # the same start on every rank
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    model.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0,
              callbacks=[hck.callbacks.SynchronizeParametersCallback()])
    return [digest([v.numpy() for v in model.trainable_variables])]


def build(name: str, **changed) -> str:
    make, options = OPS[name]
    return outcome(lambda: hck.DistributedOptimizer(make(), op=getattr(hck, name),
                                                    **{**HOROVOD_DEFAULTS, **options, **changed}))


out = {"trained": {}, "refused": {}}
for name in OPS:
    out["trained"][name] = outcome(lambda name=name: out.setdefault(name, fit(name)))
    out["refused"][f"{name} num_groups=2"] = build(name, num_groups=2)
    out["refused"][f"{name} unknown"] = build(name, no_such_option=1)
    if name != "Average":
        out["refused"][f"{name} gradient_predivide_factor=2"] = build(name, gradient_predivide_factor=2.0)
save(r, out)
