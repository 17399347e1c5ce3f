"""``python -m hvd_compress.bench.keras_steps``: Keras 3 ``model.fit`` train steps with ``hck.DistributedOptimizer``,
each op with its buckets overlapped with backward (``overlap=True``) and not (``overlap=False``), and the floor (the
inner optimizer alone, no communication). ``make bench-keras``, also with ``NET=1gbit``.

The model is a ReLU MLP on scikit-learn's digits (``--width`` units per hidden layer; 64 -> w -> w -> 10), batch
``--batch`` per rank, each rank its own shard. The step time is the median, over the steps after ``--warmup`` (the
1-bit ops' ``freeze_step``: the timed steps are compressed ones), of the slowest rank's time per batch (a Keras
callback's batch begin/end). Methods run one after another in one job, in alternating order of overlap on and off.
Writes ``keras_<label>_np<n>.md`` and ``.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
from mpi4py import MPI

import hvd_compress.keras as hck
from hvd_compress.bench import tables
from hvd_compress.bench.models import digits
from hvd_compress.bench.stamp import stamp

OPS = {"Average": "adam", "OneBitAdam": "adam", "OneBitLamb": "lamb", "SLAMB": "lamb", "Birder": "birder"}


class _BatchTimes(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.times.append(time.perf_counter() - self._start)


def _inner(rule: str, lr: float) -> keras.optimizers.Optimizer:
    if rule == "birder":
        return hck.Birder(lr)
    return keras.optimizers.Lamb(lr) if rule == "lamb" else keras.optimizers.Adam(lr)


def _options(op: str, args: argparse.Namespace, overlap: bool) -> dict:
    options: dict = {"overlap": overlap}
    if op in ("OneBitAdam", "OneBitLamb"):
        options["freeze_step"] = args.warmup
    return options


def run(method: str, args: argparse.Namespace, x: np.ndarray, y: np.ndarray) -> float:
    """The median step time (s, slowest rank) of ``method``: "<op> overlap", "<op> no overlap" or "floor <rule>"."""
    keras.utils.set_random_seed(args.seed)
    model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(args.width, activation="relu"),
                              keras.layers.Dense(args.width, activation="relu"), keras.layers.Dense(10)])
    if method.startswith("floor "):
        opt = _inner(method.split()[1], args.lr)
    else:
        op, overlap = method.split(maxsplit=1)[0], not method.endswith("no overlap")
        opt = hck.DistributedOptimizer(_inner(OPS[op], args.lr), op=getattr(hck, op), **_options(op, args, overlap))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    times = _BatchTimes()
    n = args.steps * args.batch
    model.fit(x[:n], y[:n], batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[times])
    mine = statistics.median(times.times[args.warmup:])
    return MPI.COMM_WORLD.allreduce(mine, op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated op names (default: all)")
    parser.add_argument("--steps", type=int, default=45)
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps; the 1-bit ops' freeze_step")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench_results")
    parser.add_argument("--label", default="shm")
    args = parser.parse_args()
    hck.init()
    rank, size = hck.rank(), hck.size()
    data = digits(args.seed)
    x, y = data.x_train.numpy()[rank::size], data.y_train.numpy()[rank::size]
    reps = -(-args.steps * args.batch // len(x))
    x, y = np.tile(x, (reps, 1)).astype(np.float32), np.tile(y, reps)
    ops = [o for o in OPS if not args.only or o in args.only.split(",")]
    rows = []
    for i, op in enumerate(ops):
        pair = [f"{op} overlap", f"{op} no overlap"]
        for method in pair if i % 2 == 0 else pair[::-1]:
            rows.append({"method": method, "step_ms": 1e3 * run(method, args, x, y)})
    for rule in sorted({OPS[o] for o in ops}):
        rows.append({"method": f"floor {rule}", "step_ms": 1e3 * run(f"floor {rule}", args, x, y)})
    if rank != 0:
        return
    table = tables.keras_steps(rows, vars(args), args.label, size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"keras_{args.label}_np{size}"
    stem.with_suffix(".md").write_text(table)
    stem.with_suffix(".json").write_text(json.dumps({"stamp": stamp("keras", "hvd_compress.bench.keras_steps", size),
                                                     "label": args.label, "args": vars(args), "rows": rows}, indent=1))
    print(table, flush=True)


if __name__ == "__main__":
    main()
