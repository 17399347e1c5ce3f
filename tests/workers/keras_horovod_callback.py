"""Horovod's own ``hvd.callbacks.BroadcastGlobalVariablesCallback`` (a training script kept from Horovod) on a model
whose optimizer hvd_compress wrapped: it broadcasts when training begins and leaves the per-rank variables alone.
Each case against a reference that reaches the same state another way (parameter hashes after ``model.fit``):

- "start": each rank its own initial weights; the reference starts every rank from rank 0's, no callback;
- "slamb": SLAMB (moments each rank's own) from alike weights; the reference runs without the callback;
- "resume": Horovod's resume, rank 0 alone reads 1-bit Adam's checkpoint (past the warm-up) and the others start
  fresh; the reference reads it on every rank and the ranks but 0 drop its error feedback
  (``reset_compression_state``), the state the broadcast leaves them; "file": every rank loads rank 0's ``.keras``
  file of it, and "ckpt" its ``tf.train.Checkpoint``, against the same reference (the ranks but 0 warn and zero
  their error feedback themselves);
- "plain" (tf_keras): Horovod's own optimizer, where the callback stays Horovod's (routing on, then off);
- "loop" (tf_keras): Horovod's TF2 custom loop, ``hvd.broadcast_variables`` of the model's and the optimizer's
  variables after the first step, SLAMB; the reference broadcasts the model's only (the optimizer's others are
  alike).

argv: out_dir, "keras" (Keras 3) or "tf_keras" (TF_USE_LEGACY_KERAS=1)."""

import sys
import warnings

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import tensorflow as tf
from tf_common import digest, inner_optimizer, keras_of_face, outcome, rank_data, save

import hvd_compress.keras as hck

LEGACY = sys.argv[2] == "tf_keras"
keras = keras_of_face(sys.argv[2])

hvd.init()
r = hvd.rank()
X, Y = rank_data(r)  # each rank its own data
ONEBIT = {"op": hck.OneBitAdam, "freeze_step": 3}


def make(seed: int, op: object = None, **options: object) -> object:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    inner = inner_optimizer(keras, hck, "Adam" if op is None else op.name, 0.01)
    opt = hvd.DistributedOptimizer(inner) if op is None else hvd.DistributedOptimizer(inner, op=op, **options)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    return model


def fit(model: object, callbacks: list, epochs: int = 1) -> str:
    model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return digest([v.numpy() for v in model.trainable_variables])


def horovods() -> object:
    return hvd.callbacks.BroadcastGlobalVariablesCallback(0)


def checkpoint(model: object) -> tf.train.Checkpoint:
    model.optimizer.build(model.trainable_variables)  # restored into variables that exist
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


out: dict = {}
out["start"] = outcome(lambda: out.__setitem__("start_hash", fit(make(7 + r, **ONEBIT), [horovods()], 2)))
out["start_ref"] = fit(make(7, **ONEBIT), [], 2)
out["slamb"] = fit(make(7, hck.SLAMB, sync_interval=3), [horovods()], 1)
out["slamb_ref"] = fit(make(7, hck.SLAMB, sync_interval=3), [], 1)

trained = make(7, **ONEBIT)
fit(trained, [], 2)  # 8 steps: past the warm-up, error feedback in every rank's own state
state = digest([v.numpy() for v in trained.optimizer.variables])
ckpt = checkpoint(trained)  # builds the optimizer again, as before a restore: its state stays
out["rebuilt_kept"] = digest([v.numpy() for v in trained.optimizer.variables]) == state
path = ckpt.write(f"{sys.argv[1]}/onebit") if r == 0 else None
path = hvd_tf.broadcast_object(path, root_rank=0)
resumed = make(7 + r, **ONEBIT)
if r == 0:
    checkpoint(resumed).read(path).assert_existing_objects_matched()
out["resume"] = outcome(lambda: out.__setitem__("resume_hash", fit(resumed, [horovods()], 1)))
out["resume_compressed"] = resumed.optimizer.compression_started
reference = make(7 + r, **ONEBIT)
checkpoint(reference).read(path).assert_existing_objects_matched()
if r != 0:
    reference.optimizer.reset_compression_state()
out["resume_ref"] = fit(reference, [], 1)
# Every rank loads rank 0's .keras file: the ranks but 0 start their error feedback from zero by themselves, warned,
# which is the reference's state.
if r == 0:
    trained.save(f"{sys.argv[1]}/onebit.keras")
hvd_tf.broadcast_object(0, root_rank=0)  # the file is written
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loaded = keras.models.load_model(f"{sys.argv[1]}/onebit.keras")
out["file_warnings"] = [str(w.message) for w in caught if "error feedback" in str(w.message)]
loaded.compile(optimizer=loaded.optimizer, loss="mse", jit_compile=False)
out["file_hash"] = fit(loaded, [], 1)
# Every rank restores rank 0's tf.train.Checkpoint: the checkpoint names the rank that wrote it, so the ranks but 0
# start their error feedback from zero at their first step, warned: the reference's state again.
restored = make(7 + r, **ONEBIT)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    checkpoint(restored).read(path).assert_existing_objects_matched()
    out["ckpt_hash"] = fit(restored, [], 1)
out["ckpt_warnings"] = [str(w.message) for w in caught if "error feedback" in str(w.message)]




def custom_loop(optimizer_too: bool) -> str:
    """Horovod's TF2 loop: after the first step ``hvd.broadcast_variables`` of the model's variables and (with
    ``optimizer_too``) the optimizer's (SLAMB: its moments are each rank's, its parameters too between syncs)."""
    model = make(7, hck.SLAMB, sync_interval=3)
    opt = model.optimizer
    for i in range(4):
        xb, yb = X[16 * i: 16 * (i + 1)], Y[16 * i: 16 * (i + 1)]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        if i == 0:
            hvd_tf.broadcast_variables(model.variables, root_rank=0)
            if optimizer_too:
                hvd_tf.broadcast_variables(list(opt.variables), root_rank=0)
    return digest([v.numpy() for v in model.trainable_variables])


if LEGACY:  # Horovod 0.28's broadcast_variables cannot assign Keras 3's variables
    out["loop"] = custom_loop(True)
    out["loop_ref"] = custom_loop(False)
class FirstBatch(keras.callbacks.Callback):
    """The hashes of ``variables`` when the first batch begins (after the broadcast of training's begin)."""

    def __init__(self, variables: list) -> None:
        super().__init__()
        self.variables, self.seen = variables, None

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if self.seen is None:
            self.seen = [digest([v.numpy()]) for v in self.variables]


if LEGACY:  # Horovod checks local_variables are tf.Variables; its own optimizer under Keras 3 is not 0.28's to run
    model = make(7 + r, **ONEBIT)
    kernel, local = model.layers[0].kernel, model.layers[-1].kernel  # initialized from each rank's seed
    own = digest([local.numpy()])
    first = FirstBatch([kernel, local])
    fit(model, [hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[local]), first])
    out["local"] = (first.seen, own)
    out["plain"] = fit(make(7 + r), [horovods()], 1)
    hck.horovod_entry(False)
    out["plain_horovod"] = fit(make(7 + r), [horovods()], 1)
save(r, out)
