"""hck's LearningRateWarmupCallback and LearningRateScheduleCallback (Horovod's, whose own raise under Keras 3
installed): the learning rate at each batch, as the optimizer holds it when the batch begins, and whether the step
takes it (the parameters equal a run that assigns the same rates by hand, to the optimizer that 1-bit Adam's wrapper
holds, which is built with the op's name, and differ from one at a constant rate),
with hvd_compress's 1-bit Adam and a plain Keras optimizer; momentum correction where the momentum is a variable
(tf_keras's legacy SGD) and the warning where it is a number. argv: out_dir, "keras" (Keras 3) or "tf_keras"
(TF_USE_LEGACY_KERAS=1)."""

import sys
import warnings

import numpy as np
from tf_common import digest, keras_of_face, rank_data, save

import hvd_compress.keras as hck
from hvd_compress.keras import legacy

LEGACY = sys.argv[2] == "tf_keras"
keras = keras_of_face(sys.argv[2])
callbacks = legacy if LEGACY else hck.callbacks
hck.init()
r = hck.rank()
X, Y = rank_data(r)  # each rank its own data: 4 batches of 16 per epoch


class Seen(keras.callbacks.Callback):
    """The optimizer's learning rate (and momentum, where it has one) as each batch begins, after the callbacks
    before it in the list."""

    def __init__(self) -> None:
        super().__init__()
        self.lr: list[float] = []
        self.momentum: list[float] = []
        self.after: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        opt = self.model.optimizer
        self.lr.append(float(np.asarray(opt.learning_rate)))
        if hasattr(opt, "momentum"):
            self.momentum.append(float(np.asarray(opt.momentum)))

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        if hasattr(self.model.optimizer, "momentum"):
            self.after.append(float(np.asarray(self.model.optimizer.momentum)))


class Assign(keras.callbacks.Callback):
    """Assigns ``rates[i]`` as the learning rate when batch i begins (of ``optimizer``, default the model's): the
    reference for whether the step takes what the callbacks set."""

    def __init__(self, rates: list[float], optimizer: object = None) -> None:
        super().__init__()
        self.rates, self.i, self.optimizer = rates, 0, optimizer

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        (self.optimizer or self.model.optimizer).learning_rate = self.rates[self.i]
        self.i += 1


def run(opt: object, cbs: list, epochs: int = 4) -> tuple[str, list]:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    hist = model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=cbs)
    return digest([v.numpy() for v in model.trainable_variables]), [float(v) for v in hist.history.get("lr", [])]


def onebit(op: object = hck.OneBitAdam) -> object:
    return hck.DistributedOptimizer(keras.optimizers.Adam(0.02), op=op, freeze_step=3)


out: dict = {}
for name, make in (("onebit", onebit), ("adam", lambda: keras.optimizers.Adam(0.02))):
    seen = Seen()
    out[f"warmup_{name}"] = (*run(make(), [callbacks.LearningRateWarmupCallback(0.01, warmup_epochs=2), seen]),
                             seen.lr)
    # 1-bit Adam by hand: the op by its name (a string), the rates set on the optimizer the wrapper holds
    by_hand = onebit("OneBitAdam") if name == "onebit" else make()
    out[f"warmup_{name}_by_hand"] = run(by_hand, [Assign(seen.lr, getattr(by_hand, "inner_optimizer", None))])[0]
    out[f"constant_{name}"] = run(make(), [])[0]
    seen = Seen()
    out[f"schedule_{name}"] = (*run(make(), [callbacks.LearningRateScheduleCallback(
        0.01, 0.5, start_epoch=1, end_epoch=3), seen]), seen.lr)

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    seen = Seen()
    run(keras.optimizers.SGD(0.02, momentum=0.9), [callbacks.LearningRateScheduleCallback(0.01, 0.5), seen], 2)
    out["float_momentum"] = (seen.momentum, [str(w.message) for w in caught if "momentum_correction" in str(w.message)])
if LEGACY:
    seen = Seen()
    run(keras.optimizers.legacy.SGD(0.02, momentum=0.9), [callbacks.LearningRateScheduleCallback(0.01, 0.5), seen], 2)
    out["variable_momentum"] = (seen.lr, seen.momentum, seen.after)
save(r, out)
