"""``model.save("....h5")`` (Horovod's Keras examples checkpoint so) with hck's optimizer: 2 epochs, the file (one per
rank: the error feedback is each rank's), ``load_model`` and 1 more epoch, against the saved model's own third epoch.
tf_keras keeps the optimizer's state there: the resumed run equals the uninterrupted one. Keras 3's HDF5 loader keeps
no optimizer's state (it builds the optimizer on a Sequential model's own variables, none, and then cannot set the
saved values): the loaded model trains on from a fresh optimizer, as Keras's own optimizers do. Horovod's
``hvd.load_model`` of the same file: Keras's own load (Horovod's would wrap the inner optimizer in its
DistributedOptimizer), the same results.
argv: out_dir, "keras" (Keras 3) or "tf_keras" (TF_USE_LEGACY_KERAS=1)."""

import sys

import horovod.tensorflow.keras as hvd
from tf_common import digest, keras_of_face, outcome, rank_data, save

import hvd_compress.keras as hck

LEGACY = sys.argv[2] == "tf_keras"
keras = keras_of_face(sys.argv[2])
hck.init()
r = hck.rank()
X, Y = rank_data(r)  # each rank its own data
OPS = {"Average": {}, "OneBitAdam": {"freeze_step": 3}, "PowerSGD": {"start_powerSGD_iter": 2}, "Adasum": {}}


def make(op: str) -> object:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    opt = hck.DistributedOptimizer(keras.optimizers.Adam(0.01), op=getattr(hck, op), **OPS[op])
    model.compile(optimizer=opt, loss=keras.losses.MeanSquaredError(), jit_compile=False)
    return model


def fit(model: object, epochs: int) -> str:
    model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0)
    return digest([v.numpy() for v in model.trainable_variables])


out: dict = {}
for op in OPS:
    model = make(op)
    fit(model, 2)
    path = f"{sys.argv[1]}/{op}_rank{r}.h5"
    loaded: dict = {}

    def resume(model=model, path=path, loaded=loaded) -> None:
        model.save(path)
        loaded["model"] = keras.models.load_model(path)
        loaded["class"] = type(loaded["model"].optimizer).__module__
        loaded["hash"] = fit(loaded["model"], 1)

    out[f"{op}_resume"] = outcome(resume)
    out[f"{op}_resumed"] = loaded.get("hash")
    out[f"{op}_class"] = loaded.get("class")

    def resume_horovods(path=path, loaded=loaded) -> None:
        model = hvd.load_model(path)
        loaded["hvd_inner"] = type(model.optimizer.inner_optimizer).__module__
        loaded["hvd_hash"] = fit(model, 1)

    out[f"{op}_hvd_resume"] = outcome(resume_horovods)
    out[f"{op}_hvd_resumed"] = loaded.get("hvd_hash")
    out[f"{op}_hvd_inner"] = loaded.get("hvd_inner")
    out[f"{op}_uninterrupted"] = fit(model, 1)  # the saved model's own third epoch
save(r, out)
