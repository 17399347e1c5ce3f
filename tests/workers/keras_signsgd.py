"""hck.DistributedOptimizer(SGD(lr), op=hck.SignSGD) under Keras 3 or tf_keras (``TF_USE_LEGACY_KERAS=1``): each
rank's gradients and the variables after every step of a custom loop (the test replays them through the NumPy
reference), a resume from a tf.train.Checkpoint, a run whose ``learning_rate`` is set before each step to
``SCHEDULE`` (through 0, restored, dropped 10x) as ``LearningRateScheduler`` sets it, bad options. Pickles one dict
per rank.

argv: out_dir, bucket_mb.
"""

import os
import sys

import numpy as np
import tensorflow as tf
from tf_common import outcome, save

import hvd_compress.keras as hck

LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
if LEGACY:
    keras = tf.keras
    assert keras.__name__.startswith("tf_keras"), keras.__name__
else:
    import keras
hck.init()
r, n = hck.rank(), hck.size()
bucket_mb = float(sys.argv[2])
STEPS, RESUME_AT, LR = 5, 2, 0.05
SCHEDULE = [LR, LR, 0.0, 0.0, LR, LR / 10, LR / 10]  # the lr of each step of the scheduled run


def model() -> "keras.Model":
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    return m


def batch(t: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 * t + r)
    x = rng.standard_normal((16, 6)).astype("float32")
    return x, np.sin(x.sum(1, keepdims=True)).astype("float32")


def wrapped(**options) -> object:
    return hck.DistributedOptimizer(keras.optimizers.SGD(LR), op=hck.SignSGD, bucket_mb=bucket_mb, **options)


def train(net, opt, steps, lrs=None) -> tuple[list, list]:
    params, grads = [], []
    for t in steps:
        if lrs is not None:
            opt.learning_rate = lrs[t]
        x, y = batch(t)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((net(x) - y) ** 2)
        g = tape.gradient(loss, net.trainable_variables)
        grads.append([np.asarray(a).ravel().copy() for a in g])
        opt.apply_gradients(zip(g, net.trainable_variables, strict=True))
        params.append([v.numpy().ravel().copy() for v in net.trainable_variables])
    return params, grads


out = {}
net = model()
out["initial"] = [v.numpy().ravel().copy() for v in net.trainable_variables]
opt = wrapped()
params, grads = train(net, opt, range(RESUME_AT))
ckpt = tf.train.Checkpoint(model=net, optimizer=opt)
path = ckpt.write(os.path.join(sys.argv[1], f"ckpt{r}"))
more, more_grads = train(net, opt, range(RESUME_AT, STEPS))
out["params"], out["grads"] = params + more, grads + more_grads
net2 = model()
opt2 = wrapped()
opt2.build(net2.trainable_variables)
tf.train.Checkpoint(model=net2, optimizer=opt2).read(path).expect_partial()
out["resumed"], _ = train(net2, opt2, range(RESUME_AT, STEPS))
out["scheduled"], out["scheduled_grads"] = train(model(), wrapped(), range(len(SCHEDULE)), SCHEDULE)
out["schedule"] = [float(np.float32(lr)) for lr in SCHEDULE]  # the float32 rates the optimizer holds
out["unknown_option"] = outcome(lambda: wrapped(seed=1))
out["lamb_option"] = outcome(lambda: wrapped(min_coeff=0.1))
out["momentum"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9), op=hck.SignSGD))
out["not_sgd"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.Adam(LR), op=hck.SignSGD))
save(r, out)
