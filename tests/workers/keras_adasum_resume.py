"""model.fit with op=Adasum and the broadcast callback, as a Keras user trains: 4 epochs in one go, against 2 epochs,
model.save per rank, load_model and 2 more epochs (the callback again at the start of the second fit). Adasum keeps
each rank's inner-optimizer moments its own, so the resumed run equals the uninterrupted one only if the callback
leaves them alone. argv: out_dir, "keras" (Keras 3) or "tf_keras" (TF_USE_LEGACY_KERAS=1)."""

import sys

from tf_common import digest, keras_of_face, rank_data, save

import hvd_compress.keras as hck
from hvd_compress.keras import legacy

keras = keras_of_face(sys.argv[2])
callbacks = legacy if sys.argv[2] == "tf_keras" else hck.callbacks
Broadcast, MetricAverage = callbacks.BroadcastGlobalVariablesCallback, callbacks.MetricAverageCallback
hck.init()
r = hck.rank()
X, Y = rank_data(r)  # each rank its own data


class Record(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.hashes: list[str] = []

    def on_epoch_end(self, epoch: int, logs: object = None) -> None:
        self.hashes.append(digest([v.numpy() for v in self.model.trainable_variables]))


def make() -> object:
    keras.utils.set_random_seed(100 + r)  # different on purpose: the broadcast callback makes the start alike
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=hck.DistributedOptimizer(keras.optimizers.Adam(0.01), op=hck.Adasum), loss="mse",
                  jit_compile=False)
    return model


def fit(model: object, epochs: int, initial_epoch: int = 0) -> tuple[list[str], list[float]]:
    rec = Record()
    hist = model.fit(X, Y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0,
                     callbacks=[Broadcast(0), MetricAverage(), rec])
    return rec.hashes, [float(v) for v in hist.history["loss"]]


out: dict = {}
out["uninterrupted"] = fit(make(), 4)
model = make()
first = fit(model, 2)
path = sys.argv[1] + f"/adasum_rank{r}.keras"  # per rank: Adasum's inner moments are each rank's own
model.save(path)
second = fit(keras.models.load_model(path), 4, initial_epoch=2)
out["resumed"] = (first[0] + second[0], first[1] + second[1])
save(r, out)
