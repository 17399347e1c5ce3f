"""make demo: what hvd_compress is for. The same training job, once with Horovod's dense step and once with each
hc op, each for the same wall-clock budget, side by side.

Every rank trains a ReLU MLP of about a million parameters (a 4.5 MB gradient per step) on scikit-learn's
handwritten digits, which ship with the package: Horovod's ``hvd.DistributedOptimizer`` around Adam, then
``hc.DistributedOptimizer`` with ``op=`` Average and Adasum (around Adam), OneBitAdam, ZeroOneAdam and PowerSGD
rank 4 (Adam), OneBitLamb and SLAMB (``hc.Lamb``) and Birder (``hc.Birder``), from the same weights on the same
batches (the methods and the training loop of ``hvd_compress.bench.e2e``). It ends with one table, each op's step
time and held-out accuracy against Horovod's dense step (with bytes per step, losses, seconds to reach the loss
Horovod's step reached in its budget), and the path of one PNG: training loss against wall-clock seconds per op,
and held-out accuracy against step time. Table and PNG are rendered from the stamped JSON it writes under
``--out`` beside them (hvd_compress/bench/tables.py, plots.py), as the benchmark pages are.
``make demo`` runs it on 4 ranks behind an emulated 100 Mbit/s link (tools/slow_link.sh: a network namespace
whose loopback tc tbf limits, MPI over TCP) where the machine allows it, else on shared memory, and says which.
By hand: ``mpirun -np 4 python examples/demo.py --out examples/out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import textwrap
from pathlib import Path

import horovod.torch as hvd
import torch
from mpi4py import MPI

import hvd_compress.torch as hc
from hvd_compress.bench import plots, tables
from hvd_compress.bench.e2e import Run, methods, summarize, train
from hvd_compress.bench.models import build, digits
from hvd_compress.bench.plots import smooth
from hvd_compress.bench.report import stamp_line
from hvd_compress.bench.stamp import stamp

HOROVOD = tables.DEMO_BASELINE
# Losses are smoothed over this many steps: few, since a window of steps is seconds long for a dense step behind a
# slow link, which would lag its curve and its time to the target behind the fast steps' by that much.
WINDOW = 3
OPS = (HOROVOD, "hc Average (Adam)", "hc Adasum (Adam)", "hc OneBitAdam", "hc ZeroOneAdam", "hc PowerSGD r4 (Adam)",
       "hc OneBitLamb", "hc SLAMB", "hc Birder")


def target_loss(horovod_loss: float) -> float:
    """Horovod's final loss rounded up to the 3 digits the table shows: hc Average, the same dense step with its
    sums in another order, ends a few ulps away and reaches the target too."""
    scale = 10.0 ** (math.floor(math.log10(horovod_loss)) - 2)
    return math.ceil(horovod_loss / scale) * scale


def notes(net: str, size: int, args: argparse.Namespace) -> str:
    link = (f"an emulated {net} link (tc tbf on a network namespace's loopback, MPI over TCP)" if net
            else "shared memory (no emulated slow link), so step times show compute and memory, not a network")
    return textwrap.fill(
        f"{size} ranks on {link}; each op trained for {args.seconds:g} s of wall-clock (at most {args.steps} steps), "
        f"batch {args.batch} per rank, ms/step the median after step {args.warmup} (the 1-bit optimizers' dense "
        f"warm-up, freeze_step) on the slowest rank. MB sent/step/rank: hvd_compress's own count; * what crossed "
        f"the link, all traffic, per rank; n/a: Horovod's bytes are not counted on shared memory. Losses: training "
        f"loss, mean over ranks, over the last {WINDOW} steps. Target: the training loss Horovod's dense step reached "
        f"at the end of its budget, to 3 digits.", width=116
    ) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="wall-clock budget of each op")
    parser.add_argument("--steps", type=int, default=2000, help="at most this many steps per op")
    parser.add_argument("--warmup", type=int, default=4, help="the 1-bit optimizers' freeze_step; untimed")
    parser.add_argument("--width", type=int, default=1024, help="the MLP's hidden width")
    parser.add_argument("--depth", type=int, default=2, help="the MLP's hidden layers")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=",".join(OPS), help=f"comma-separated, any of {list(OPS)}")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the PNG, .md and .json here (default: a new temporary directory)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    hc.init()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    net = os.environ.get("HVDC_BENCH_NET", "")
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(OPS))
    if unknown or HOROVOD not in wanted:
        parser.error(f"--only: {unknown or 'Horovod Adam is the baseline and must be in'}; known: {list(OPS)}")
    data = digits(args.seed)
    model = {"width": args.width, "depth": args.depth}
    if rank == 0:
        params = sum(p.numel() for p in build("mlp", **model).parameters())
        print(f"[demo] {size} ranks, {'link ' + net if net else 'shared memory'}; digits "
              f"({data.x_train.shape[0]} training, {data.x_test.shape[0]} held-out images), MLP of {params / 1e6:.2f}M "
              f"parameters; {len(wanted)} ops x {args.seconds:g} s", flush=True)
        if not net:
            print("[demo] no emulated slow link (make demo sets one up where root and `ip netns` allow it): "
                  "running on shared memory", flush=True)
    by_name = {m.name: m for m in methods(args.warmup)}
    # Untimed: the first op measured must not pay for page faults and cold caches.
    train(by_name["floor Adam (no comm)"], "mlp", data, comm, argparse.Namespace(**{**vars(args), "steps": 5}),
          **model)
    runs: list[Run] = []
    for name in wanted:
        run = train(by_name[name], "mlp", data, comm, args, seconds=args.seconds, **model)
        runs.append(run)
        if rank == 0:
            timed = run.step_ms[args.warmup:] or run.step_ms
            print(f"[demo] {name}: {len(run.step_ms)} steps in {run.wall_s[-1]:.1f} s, median "
                  f"{statistics.median(timed):.1f} ms/step, final loss {smooth(run.losses, WINDOW)[-1]:.4f}",
                  flush=True)
    if rank != 0:
        return
    target = target_loss(smooth(runs[wanted.index(HOROVOD)].losses, WINDOW)[-1])
    result = {"stamp": stamp("demo", "hvd_compress.bench.e2e", size), "net": net, "ranks": size, "target": target,
              "rows": summarize(runs, args.warmup, size, net, target=target, window=WINDOW),
              "runs": [r.__dict__ for r in runs]}
    result["stamp"]["command"] = ["python", "examples/demo.py", *result["stamp"]["command"][3:]]
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="hvdc_demo_"))
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"demo_{net or 'shm'}_np{size}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    # What follows is rendered from the JSON just written, as docs/benchmarks.md is from the bench's.
    result = json.loads(stem.with_suffix(".json").read_text())
    provenance = stamp_line(result["stamp"], stem.name + ".json", str(stem.with_suffix(".json")))
    text = tables.demo(result) + "\n" + notes(net, size, args) + "\n" + provenance
    stem.with_suffix(".md").write_text(text + "\n")
    png = plots.demo(result, stem.with_suffix(".png"), window=WINDOW)
    print("\n" + text + "\n")
    print(f"[demo] table: {stem}.md, results: {stem}.json")
    print(f"[demo] plot: {png}")

if __name__ == "__main__":
    main()
