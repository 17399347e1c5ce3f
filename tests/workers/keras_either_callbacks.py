"""``hck.callbacks`` in tf_keras's ``model.fit`` and in Keras 3's, in one process with ``TF_USE_LEGACY_KERAS=1``
(the README's callback lines, unchanged): each rank starts from its own initialization, so identical weights after
fit show the broadcast; equal epoch losses on every rank show the metric average.

argv: out_dir. Saves per rank, per flavour: the digest of the weights and the epoch losses, or the error raised.
"""

import keras
import numpy as np
import tf_keras
from tf_common import digest, outcome, save

import hvd_compress.keras as hck

hck.init()
r = hck.rank()
x = np.random.default_rng(r).standard_normal((32, 3)).astype("float32")
y = x.sum(1, keepdims=True)


def fit(k) -> dict:
    k.utils.set_random_seed(100 + r)  # different on purpose: the broadcast callback must fix it
    model = k.Sequential([k.Input((3,)), k.layers.Dense(4), k.layers.Dense(1)])
    model.compile(optimizer=hck.DistributedOptimizer(k.optimizers.Adam(0.01)), loss="mse")
    hist = model.fit(x, y, epochs=2, verbose=0,
                     callbacks=[hck.callbacks.BroadcastGlobalVariablesCallback(0),
                                hck.callbacks.MetricAverageCallback(), hck.callbacks.SynchronizeParametersCallback()])
    return {"weights": digest(model.get_weights()), "loss": [float(v) for v in hist.history["loss"]]}


out = {}
for name, k in (("tf_keras", tf_keras), ("keras3", keras)):
    res = {}
    err = outcome(lambda k=k, res=res: res.update(fit(k)))
    out[name] = res or err
save(r, out)
