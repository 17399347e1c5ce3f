"""model.fit with op=Adasum and the broadcast callback, as a Keras user trains: 4 epochs in one go, against 2 epochs,
model.save per rank, load_model and 2 more epochs (the callback again at the start of the second fit). Adasum keeps
each rank's inner-optimizer moments its own, so the resumed run equals the uninterrupted one only if the callback
leaves them alone. argv: out_dir, "keras" (Keras 3) or "tf_keras" (TF_USE_LEGACY_KERAS=1).

Then, per op with per-rank state (``ONE_FILE``), rank 0's one file: ``<op> gathered`` (GatherPerRankStateCallback
before rank 0's save, every rank loads that file), ``<op> gathered_root`` (the same file loaded on rank 0 alone, the
other ranks fresh, the broadcast callback hands each its part), ``<op> plain_root`` (rank 0's file without the
gathering, loaded on rank 0 alone), each with the warnings of its resume; ``<op> uninterrupted`` the run never
stopped."""

import sys
import warnings

from tf_common import digest, inner_optimizer, keras_of_face, rank_data, save

import hvd_compress.keras as hck
from hvd_compress.keras import legacy
from hvd_compress.ops.errors import PerRankStateWarning

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

#: Ops whose optimizer holds per-rank state, with options that sync the parameters at each epoch's end (4 steps; 0/1
#: Adam past var_freeze_step there)
ONE_FILE = {"Adasum": {}, "ZeroOneAdam": {"var_freeze_step": 2, "local_step_clipper": 1}, "Birder": {},
            "SLAMB": {"sync_interval": 2}}
Gather = callbacks.GatherPerRankStateCallback


def make_op(name: str, seed: int) -> object:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
    opt = hck.DistributedOptimizer(inner_optimizer(keras, hck, name, 0.01), op=getattr(hck, name), **ONE_FILE[name])
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    return model


def fit_op(model: object, epochs: int, initial_epoch: int = 0, extra: tuple = ()) -> list[str]:
    rec = Record()
    model.fit(X, Y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0,
              callbacks=[Broadcast(0), *extra, rec])
    return rec.hashes


def resume(name: str, path: str, everywhere: bool) -> tuple[list[str], list[str]]:
    """One more epoch from rank 0's file at ``path``: loaded on every rank, or on rank 0 alone (the others start
    from a fresh model of another seed, as a new launch would)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.models.load_model(path) if everywhere or r == 0 else make_op(name, 200 + r)
        hashes = fit_op(model, 2, initial_epoch=1)
    return hashes, [str(w.message) for w in caught if issubclass(w.category, PerRankStateWarning)]


for name in ONE_FILE:
    out[f"{name} uninterrupted"] = fit_op(make_op(name, 7), 2)
    for kind in ("gathered", "plain"):
        model = make_op(name, 7)
        first = fit_op(model, 1, extra=(Gather(),) if kind == "gathered" else ())
        path = sys.argv[1] + f"/{name}_{kind}.keras"
        if r == 0:  # rank 0 alone saves
            model.save(path)
        hck.join()  # the file is written before any rank reads it
        modes = ("gathered", "gathered_root") if kind == "gathered" else ("plain_root",)
        for mode in modes:
            hashes, seen = resume(name, path, everywhere=mode == "gathered")
            out[f"{name} {mode}"], out[f"{name} {mode} warnings"] = first + hashes, seen
save(r, out)
