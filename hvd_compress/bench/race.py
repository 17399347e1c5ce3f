"""``python -m hvd_compress.bench.race``: the race behind a slow link, judged by held-out loss against wall-clock
time over several model seeds (docs/benchmarks.md, "Race").

Per model seed every method starts from the same weights and trains on the same per-rank batches
(``e2e.train``, the end-to-end bench's loop and methods) for ``--steps`` or ``--budget`` seconds of training, its
held-out loss recorded every ``--eval-every`` steps with the clock stopped (``Run.test_curve``). The target of a
seed is the held-out loss of the dense reference (``e2e.dense_reference``: dense Adam on every rank's batches in
one process, Horovod's dense step to rounding) at ``--target-step``. Per seed and method: the training time to the
target (the first evaluation at or below it; none: censored), the held-out loss at ``--equal-time`` seconds, the
held-out loss at the last evaluated step against the dense reference's at that step, and the mean step against the
floor's (the same step without communication). Per method: the mean over seeds with a 95% Student-t interval.

DiLoCo's settings here (``RACE_DILOCO``) are sized for the 4.8M-parameter MLP behind 100 Mbit/s at 2 ranks: a sync
of 4-bit outer gradients moves about 2.4 MB per rank through reduce-scatter and all-gather, 4.8 MB over the one
shared link, about 0.4 s, under a tenth of 80 of its floor steps on one core; 8 bits would need twice
the interval; behind 1 Gbit/s H = 16 keeps the same tenth (``--sync-every``).
Streaming DiLoCo (``RACE_STREAMING``) syncs 4 strided fragments, the largest about half the model
(the MLP's two big matrices fall into two fragments), about 0.2 s of wire, hidden behind ``sync_delay`` = 6 inner
steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import hvd_compress.torch as hc
from hvd_compress.bench import e2e
from hvd_compress.bench.models import MODELS, digits
from hvd_compress.bench.stamp import stamp

RACE_DILOCO = {"sync_every": 80, "outer_compression": "int4"}
RACE_STREAMING = {"sync_every": 80, "fragments": 4, "sync_delay": 6, "mix": 0.5, "outer_compression": "int4"}
#: The e2e bench's methods that run in the race, in its order; DiLoCo's two join with the settings above.
E2E_METHODS = ("Horovod Adam", "Horovod fp16 Adam", "DDP+PowerSGD r4 Adam", "hc PowerSGD r4 (Adam)", "hc OneBitAdam",
               "hc ZeroOneAdam")
FLOOR = "floor Adam (no comm)"


def race_methods(warmup: int, sync_every: int | None = None) -> list[e2e.Method]:
    """e2e's methods of ``E2E_METHODS``, DiLoCo's two (``sync_every``: H in place of the settings' 80) and the
    floor."""
    by_name = {m.name: m for m in e2e.methods(warmup)}
    diloco = {**RACE_DILOCO, "sync_every": sync_every or RACE_DILOCO["sync_every"]}
    streaming = {**RACE_STREAMING, "sync_every": sync_every or RACE_STREAMING["sync_every"]}
    h, p, tau = streaming["sync_every"], streaming["fragments"], streaming["sync_delay"]
    return [by_name[n] for n in E2E_METHODS] + [
        e2e.Method(f"hc DiLoCo H{diloco['sync_every']} int4 (Adam)", "adam", e2e._diloco(**diloco), True),
        e2e.Method(f"hc Streaming DiLoCo H{h} P{p} tau{tau} int4 (Adam)", "adam", e2e._diloco(**streaming),
                   True),
        by_name[FLOOR],
    ]


# The arithmetic: a curve is [[step, wall_s, held-out loss], ...] in training order.

def time_to_target(curve: list[list[float]], target: float) -> float | None:
    """The training time of the first evaluation at or below ``target``; None where none is (censored)."""
    return next((wall for _, wall, loss in curve if loss <= target), None)


def loss_at_time(curve: list[list[float]], seconds: float) -> float | None:
    """The held-out loss of the last evaluation at or before ``seconds`` of training (what a user stopping then
    would have); None where the first evaluation comes later."""
    before = [loss for _, wall, loss in curve if wall <= seconds]
    return before[-1] if before else None


def mean_interval(values: list[float], level: float = 0.95) -> tuple[float, float | None, float | None] | None:
    """The mean and its two-sided ``level`` Student-t interval; the interval None under two values, all None for
    none."""
    values = [v for v in values if math.isfinite(v)]  # a diverged run's loss is not a figure to average
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None, None
    from scipy.stats import t as student_t

    half = student_t.ppf(0.5 + level / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def seed_record(run: e2e.Run, seed: int, warmup: int, dense: list[float], target: float,
                equal_time: float) -> dict:
    """One method's figures for one seed, against that seed's dense reference curve (held-out loss per step)."""
    curve = run.test_curve
    last_step, _, last_loss = curve[-1] if curve else (0, 0.0, math.nan)
    last_step = int(last_step)
    return {
        "seed": seed, "method": run.method, "steps": len(run.step_ms), "diverged": run.diverged,
        "mean_step_ms": statistics.fmean(e2e._measured_ms(run, warmup)) if run.step_ms else None,
        "test_curve": curve, "target": target, "time_to_target_s": time_to_target(curve, target),
        "test_loss_at_equal_time": loss_at_time(curve, equal_time),
        "last_eval_step": last_step, "test_loss_at_last_eval": last_loss,
        "dense_test_loss_at_last_eval": dense[last_step - 1] if 0 < last_step <= len(dense) else None,
    }


def summarize(records: list[dict], target_step: int) -> list[dict]:
    """Per method (in ``records``' order) the means over seeds [95%]: time to target over the seeds that reached
    it (and how many did), held-out loss at equal time, the held-out loss at equal steps against dense (the
    per-seed ratios' geometric mean, ``tables.paired_ratio``), mean step and its ratio to the floor's of the same
    seed, and ``target_step`` times the mean step (a projection, not a measurement)."""
    from hvd_compress.bench.tables import paired_ratio

    floors = {r["seed"]: r["mean_step_ms"] for r in records if r["method"] == FLOOR}
    rows = []
    for method in dict.fromkeys(r["method"] for r in records):
        mine = [r for r in records if r["method"] == method]
        reached = [r["time_to_target_s"] for r in mine if r["time_to_target_s"] is not None]
        steps_ms = [r["mean_step_ms"] for r in mine if r["mean_step_ms"] is not None]
        paired = [(r["test_loss_at_last_eval"], r["dense_test_loss_at_last_eval"]) for r in mine
                  if r["dense_test_loss_at_last_eval"] is not None and math.isfinite(r["test_loss_at_last_eval"])]
        rows.append({
            "method": method, "seeds": len(mine), "reached": len(reached),
            "diverged": sum(1 for r in mine if r.get("diverged")),
            "time_to_target_s": mean_interval(reached),
            "test_loss_at_equal_time": mean_interval([r["test_loss_at_equal_time"] for r in mine
                                                      if r["test_loss_at_equal_time"] is not None]),
            "equal_steps_vs_dense": paired_ratio(*map(list, zip(*paired, strict=True))) if len(paired) > 1 else None,
            "last_eval_steps": [r["last_eval_step"] for r in mine],
            "mean_step_ms": mean_interval(steps_ms),
            "ratio_to_floor": mean_interval([r["mean_step_ms"] / floors[r["seed"]] for r in mine
                                             if r["mean_step_ms"] is not None and floors.get(r["seed"])]),
            "projected_s_to_target_step": (target_step * statistics.fmean(steps_ms) / 1e3) if steps_ms else None,
        })
    return rows


def _cell(v, fmt: str = "{:.3g}") -> str:
    if v is None:
        return "—"
    mean, lo, hi = v
    return fmt.format(mean) + ("" if lo is None else f" [{fmt.format(lo)}, {fmt.format(hi)}]")


def markdown(rows: list[dict], model: str, args: dict) -> str:
    """One table: the rows of one model, link and rank count."""
    s, t = args["target_step"], args["equal_time"]
    lines = [
        f"`{model}`, {args['n_seeds']} model seeds, {args['steps']} steps or {args['budget']:g} s of training, "
        f"held-out loss every {args['eval_every']} steps; target: the dense reference's held-out loss at step {s} "
        "(per seed); means [95% Student-t interval]",
        "",
        f"| method | s to target | reached | {s} x mean step, projected s | held-out at {t:g} s "
        "| held-out at equal steps vs dense | mean step ms | / floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        eq = r["equal_steps_vs_dense"]
        eq_cell = "—" if eq is None else "{:+.1%} [{:+.1%}, {:+.1%}]".format(*eq)
        proj = r["projected_s_to_target_step"]
        lines.append(
            f"| {r['method']} | {_cell(r['time_to_target_s'])} | {r['reached']}/{r['seeds']}"
            f"{' (' + str(r['diverged']) + ' diverged)' if r.get('diverged') else ''} | "
            f"{'—' if proj is None else format(proj, '.3g')} | {_cell(r['test_loss_at_equal_time'], '{:.4f}')} | "
            f"{eq_cell} | {_cell(r['mean_step_ms'], '{:.1f}')} | {_cell(r['ratio_to_floor'], '{:.2f}')} |")
    return "\n".join(lines) + "\n"


def mean_curve(curves: list[list[list[float]]], points: int = 60) -> tuple[list[float], list[float]]:
    """The mean over seeds of held-out loss against training time, each seed's curve interpolated linearly onto
    a grid up to the time every seed reached."""
    import numpy as np

    curves = [c for c in curves if c]
    if not curves:
        return [], []
    end = min(c[-1][1] for c in curves)
    start = max(c[0][1] for c in curves)
    grid = np.linspace(start, end, points) if end > start else np.array([end])
    values = [np.interp(grid, [p[1] for p in c], [p[2] for p in c]) for c in curves]
    return grid.tolist(), np.mean(values, axis=0).tolist()


def plot(result: dict, model: str, path: Path) -> Path:
    """Mean held-out loss over seeds against training time, one line per method; the mean target dashed."""
    from hvd_compress.bench import plots

    records = [r for r in result["records"] if r["model"] == model]
    methods = list(dict.fromkeys(r["method"] for r in records))
    colors = plots.palette(methods)
    with plots.context():
        fig, ax = plots.pyplot().subplots(figsize=(9, 5.5))
        for m in methods:
            mine = [r for r in records if r["method"] == m]
            kept = [r["test_curve"] for r in mine if not r.get("diverged")]
            gone = len(mine) - len(kept)  # a diverged seed's loss would swamp the mean: left out, and said
            label = m if not gone else f"{m} ({gone}/{len(mine)} seeds diverged, left out)"
            x, y = mean_curve(kept)
            ax.plot(x, y, label=label, color=colors[m], linestyle=plots.style(m), linewidth=1.2)
        targets = [r["target"] for r in records if r["method"] == methods[0]]
        ax.axhline(statistics.fmean(targets), color="black", linewidth=0.8, linestyle="--",
                   label=f"target (dense at step {result['args']['target_step']}, mean)")
        ax.set_xlabel("training s (rank 0; evaluation off the clock)")
        ax.set_ylabel(f"held-out loss, mean over {result['args']['n_seeds']} seeds")
        ax.set_yscale("log")
        ax.grid(True, which="major", linewidth=0.3)
        ax.legend(ncol=2, loc="best")
        ax.set_title(f"{model}: {result['label']}, {result['stamp']['ranks']} ranks")
        return plots.save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--only", default="", help="comma-separated method names or shell patterns (default: all)")
    parser.add_argument("--seeds", type=int, default=6, help="model seeds 0..N-1")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of training per method and seed")
    parser.add_argument("--target-step", type=int, default=150)
    parser.add_argument("--equal-time", type=float, default=None, help="seconds (default: half the budget)")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=15, help="steps before timing; the 1-bit freeze_step")
    parser.add_argument("--burnin", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default="bench_results")
    parser.add_argument("--label", default=os.environ.get("HVDC_BENCH_NET") or "shm")
    parser.add_argument("--sync-every", type=int, default=RACE_DILOCO["sync_every"],
                        help="DiLoCo's H for both DiLoCo rows: 80 keeps a 4-bit sync of the MLP under a tenth of H "
                        "floor steps behind 100 Mbit/s; 16 does behind 1 Gbit/s")
    parser.add_argument("--race", action="store_true", help="accepted for tools/bench.sh's BENCH_ARGS; no effect")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or set(models) - set(MODELS):
        parser.error(f"--models: {args.models!r}; the models are {', '.join(MODELS)}")
    if args.equal_time is None:
        args.equal_time = args.budget / 2
    if not args.budget > 0 or not 0 < args.equal_time <= args.budget:
        parser.error(f"--budget > 0 and 0 < --equal-time <= --budget, got {args.budget}, {args.equal_time}")
    if args.seeds < 1 or not 0 < args.target_step <= args.steps or args.eval_every < 1 or \
            args.target_step % args.eval_every:
        parser.error("--seeds >= 1, 0 < --target-step <= --steps, --eval-every >= 1 dividing --target-step (the "
                     "dense reference is evaluated where the methods are)")
    try:
        if not RACE_STREAMING["sync_delay"] < args.sync_every:
            raise ValueError(f"--sync-every: more than Streaming DiLoCo's sync_delay {RACE_STREAMING['sync_delay']}")
        chosen = e2e.select(race_methods(args.warmup, args.sync_every), args.only)
    except ValueError as e:
        parser.error(str(e))
    import torch

    torch.set_num_threads(1)
    if e2e.hvd is not None:
        e2e.hvd.init()
    hc.init()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    e2e._init_gloo(comm)
    data = digits(0)
    runnable = [m for m in chosen if e2e.hvd is not None or not m.needs_horovod]
    records, dense_curves = [], {}
    for model in models:
        if args.burnin > 0 and runnable:
            e2e.train(runnable[-1], model, data, comm, argparse.Namespace(**{**vars(args), "steps": args.burnin,
                                                                             "eval_every": 0, "seed": 0}))
        for seed in range(args.seeds):
            began = time.perf_counter()
            seeded = argparse.Namespace(**{**vars(args), "seed": seed})
            runs = []
            for method in runnable:
                run = e2e.train(method, model, data, comm, seeded, seconds=args.budget)
                runs.append(run)
                if comm.Get_rank() == 0:
                    print(f"[race] {model} seed {seed} / {method.name}: {len(run.step_ms)} steps, last held-out "
                          f"{run.test_curve[-1][2] if run.test_curve else float('nan'):.4f}", flush=True)
            if comm.Get_rank() == 0:
                steps = max([args.target_step] + [len(r.step_ms) for r in runs])
                dense = e2e.dense_reference("adam", model, data, seeded, comm.Get_size(), steps, args.eval_every,
                                           frozenset(len(r.step_ms) for r in runs))
                dense_curves.setdefault(model, {})[str(seed)] = [None if math.isnan(v) else v for v in dense]
                for run in runs:
                    rec = seed_record(run, seed, args.warmup, dense, dense[args.target_step - 1], args.equal_time)
                    records.append({"model": model, **rec})
            comm.Barrier()
            if comm.Get_rank() == 0:
                print(f"[race] {model} seed {seed}: {time.perf_counter() - began:.0f} s in all", flush=True)
                # every seed's records as they come: a failure later loses no measured seed
                Path(args.out).mkdir(parents=True, exist_ok=True)
                (Path(args.out) / f"race_{args.label}_np{comm.Get_size()}_{'-'.join(models)}.partial.json").write_text(
                    json.dumps({"args": vars(args), "records": records, "dense_reference": dense_curves}))
    if comm.Get_rank() == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"race_{args.label}_np{comm.Get_size()}_{'-'.join(models)}"
        settings = {**vars(args), "n_seeds": args.seeds, "diloco": {**RACE_DILOCO, "sync_every": args.sync_every},
                    "streaming": {**RACE_STREAMING, "sync_every": args.sync_every}}
        result = {"stamp": stamp("race", "hvd_compress.bench.race", comm.Get_size()), "label": args.label,
                  "args": settings, "records": records, "dense_reference": dense_curves,
                  "rows": {m: summarize([r for r in records if r["model"] == m], args.target_step) for m in models}}
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
        text = "\n".join(markdown(result["rows"][m], m, settings) for m in models)
        stem.with_suffix(".md").write_text(text)
        pngs = [plot(result, m, stem.parent / f"{stem.name}_{m}.png") for m in models]
        print(text)
        print(f"[race] wrote {stem}.json, {stem}.md and {', '.join(map(str, pngs))}")
    e2e.dist.destroy_process_group()


if __name__ == "__main__":
    main()
