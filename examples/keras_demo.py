"""make demo, Keras part: a regression task (a fixed random teacher network plus noise of variance NOISE^2, the
lowest loss any model can reach; the teacher task of tests/workers/teacher_task.py) trained with Keras 3
``model.fit`` on N ranks through ``hvd_compress.keras.DistributedOptimizer``: dense Adam, Adasum over each rank's
own SGD step, 1-bit Adam, SLAMB and Birder.
Per reduction it prints the global training loss per epoch, the held-out loss, and whether every rank ends with
the same parameters. Launch: ``mpirun -np 4 python examples/keras_demo.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import keras
import numpy as np

import hvd_compress.keras as hck

FEATURES, OUTPUTS, HIDDEN = 32, 4, 64
NOISE = 0.5
FREEZE_FRACTION = 0.2  # dense warm-up of 1-bit Adam: 20% of the run's steps (paper 003: 15-25%)


def teacher_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    teacher = np.random.default_rng(0)
    w1 = teacher.standard_normal((FEATURES, 16)) / FEATURES**0.5
    w2 = teacher.standard_normal((16, OUTPUTS)) / 4
    g = np.random.default_rng(seed)
    x = g.standard_normal((n, FEATURES))
    y = np.tanh(x @ w1) @ w2 + NOISE * g.standard_normal((n, OUTPUTS))
    return x.astype("float32"), y.astype("float32")


REDUCTIONS = {
    "Adam": lambda: (keras.optimizers.Adam(5e-3), {"op": hck.Average}),
    # Adasum combines each rank's own SGD update; no learning-rate rescaling for the rank count.
    "Adasum": lambda: (keras.optimizers.SGD(0.05, momentum=0.9), {"op": hck.Adasum}),
    "OneBitAdam": lambda: (keras.optimizers.Adam(5e-3), {"op": hck.OneBitAdam}),
    # 10% of the momentum per step, parameters averaged every 20 steps (and at the end of training).
    "SLAMB": lambda: (keras.optimizers.Lamb(5e-3), {"op": hck.SLAMB, "compress_ratio": 0.1, "sync_interval": 20}),
    "Birder": lambda: (hck.Birder(1e-3), {"op": hck.Birder}),
}


def train(name: str, epochs: int, batch: int, shard: int) -> dict[str, object]:
    r = hck.rank()
    x, y = teacher_data(shard, seed=1 + r)
    x_test, y_test = teacher_data(2048, seed=10_000)
    keras.utils.set_random_seed(42 + r)  # different per rank: the broadcast callback makes them equal
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(OUTPUTS)])
    inner, options = REDUCTIONS[name]()
    if options["op"] == hck.OneBitAdam:
        options["freeze_step"] = max(1, int(FREEZE_FRACTION * epochs * (shard // batch)))
    model.compile(optimizer=hck.DistributedOptimizer(inner, **options), loss="mse", jit_compile=False)
    start = time.perf_counter()
    callbacks = [hck.callbacks.BroadcastGlobalVariablesCallback(0), hck.callbacks.MetricAverageCallback(),
                 hck.callbacks.SynchronizeParametersCallback()]
    hist = model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, shuffle=False, callbacks=callbacks)
    seconds = time.perf_counter() - start
    test = float(hck.allreduce(np.float32(model.evaluate(x_test, y_test, verbose=0))).numpy())
    digest = hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in model.trainable_variables)).hexdigest()
    same = all_equal(digest)
    return {"loss": [float(v) for v in hist.history["loss"]], "test_loss": test, "seconds": seconds,
            "identical_on_every_rank": same}


def all_equal(digest: str) -> bool:
    """True when every rank's digest is rank 0's (one small allreduce of a 0/1 flag)."""
    mine = np.frombuffer(bytes.fromhex(digest), dtype=np.uint8).astype(np.float64)
    first = hck.allreduce(mine * (hck.rank() == 0), op=hck.Sum).numpy()
    return float(hck.allreduce(np.float64(np.array_equal(first, mine)), op=hck.Sum).numpy()) == hck.size()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reductions", default=",".join(REDUCTIONS), help=f"any of {list(REDUCTIONS)}")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--shard", type=int, default=2048)
    parser.add_argument("--out", type=Path, default=None, help="write keras_results.json here")
    args = parser.parse_args()
    hck.init()
    results = {}
    for name in args.reductions.split(","):
        results[name] = res = train(name, args.epochs, args.batch, args.shard)
        if hck.rank() == 0:
            losses = " ".join(f"{v:.4f}" for v in res["loss"])
            print(f"keras {name:10s} n={hck.size()} train loss per epoch {losses} | held-out {res['test_loss']:.4f} "
                  f"(noise floor {NOISE**2:.2f}) | identical on every rank: {res['identical_on_every_rank']} | "
                  f"{res['seconds']:.1f} s", flush=True)
    if args.out is not None and hck.rank() == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "keras_results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
