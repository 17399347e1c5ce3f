"""``python -m hvd_compress.bench.e2e``: real training steps, end to end, for every hvd_compress op against
what a user would pick instead (``make bench-e2e``, ``make bench-e2e NET=1gbit``).

For each model of ``hvd_compress.bench.models`` and each method (every ``hc`` op, Horovod's
``DistributedOptimizer`` (dense and with ``Compression.fp16``), DiLoCo and Streaming DiLoCo, torch DDP, DDP with the
PowerSGD hook of rank 4 beside ``hc.PowerSGD`` with the same
options, and the floor: the same step with the local optimizer and no communication at all), from the same initial
weights and the same per-rank batches: the median step time of the slowest rank after ``--warmup``, its ratio to the
floor of its rule and, under ``NET=...``, to max(floor, wire time), the speed-up over Horovod's step of the same
rule, bytes per step and rank (our counts, and under ``NET=...`` the namespace loopback's), held-out loss and
accuracy (also against the dense rule's at the same step count: ``dense_reference``; with ``--fidelity-seeds``,
the mean over several model seeds against the dense rule's mean, since one seed's held-out loss after the MLP has
memorized its data moves by a factor of several between seeds), and the time to reach the dense run's final
training loss. Writes ``e2e_<label>_np<n>.json``/``.md`` and
one PNG per model under ``--out``. Methods run one after another in one job, so they share the machine's state.
Without Horovod its rows say "skipped: no Horovod"; DDP runs over gloo on CPU tensors on any machine.
``--models``, ``--only`` (names or shell patterns) and ``--budget`` (seconds per run) size a run. Columns:
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import hvd_compress.torch as hc
from hvd_compress.bench.e2e_results import link_bits_per_s
from hvd_compress.bench.models import E2E_MODELS, MODELS, Data, build, digits
from hvd_compress.bench.plots import smooth
from hvd_compress.bench.stamp import stamp
from hvd_compress.bench.tables import e2e_seeds, vs_dense

try:
    import horovod.torch as hvd
except ImportError:  # a machine without Horovod: its methods' rows say so
    hvd = None

LO_STATS = Path("/sys/class/net/lo/statistics")


@dataclass
class Method:
    """How to wrap a model's optimizer for one method; ``rule`` names the uncompressed rule it follows."""

    name: str
    rule: str  # "adam", "lamb" or "birder": the local optimizer it is built on
    wrap: Callable[[nn.Module, torch.optim.Optimizer], tuple[nn.Module, torch.optim.Optimizer]]
    hc_bytes: bool = False  # hvd_compress counts its bytes
    needs_horovod: bool = False


@dataclass
class Run:
    method: str
    model: str
    rule: str = "adam"
    step_ms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    hc_bytes_per_step: float | None = None
    wire_bytes_per_step: float | None = None
    test_loss: float = float("nan")
    test_accuracy: float = float("nan")
    skipped: str | None = None  # why the method did not run here ("no Horovod")
    #: ``--fidelity-seeds``: per model seed (the timed run's first) the steps run and the held-out loss
    seeds: list[dict] = field(default_factory=list)
    #: every ``--eval-every`` steps: [step, wall_s, held-out loss] (``held_out``), wall_s training time only
    test_curve: list[list[float]] = field(default_factory=list)
    #: the step whose update the method refused for a non-finite gradient (raised on every rank): the run ends there
    diverged: int | None = None


def _local_optimizer(rule: str, params, lr: float) -> torch.optim.Optimizer:
    if rule == "birder":
        return hc.Birder(params, lr=lr)
    return torch.optim.Adam(params, lr=lr) if rule == "adam" else hc.Lamb(params, lr=10 * lr)


def _hc(op, **options) -> Callable:
    def wrap(model, opt):
        return model, hc.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=op, **options)

    return wrap


def _diloco(**options) -> Callable:
    """DiLoCo over the model's parameters, averaging its floating-point buffers (BatchNorm's running statistics) at
    each merge, so that the synced model a user keeps has one set of statistics (docs/algorithms/diloco.md)."""
    def wrap(model, opt):
        return model, hc.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hc.DiLoCo,
                                              buffers=model.buffers(), **options)

    return wrap


def _zero_one_adam(freeze: int, clipper: int = 16, **options: bool) -> Callable:
    """0/1 Adam with its frozen v bias-corrected (``variance_bias_correction``): DeepSpeed's uncorrected v makes every
    step after a short dense warm-up 1 / sqrt(1 - b2^n_v) times Adam's (8x after 15 steps) and the MLP diverges at
    the shared lr (docs/algorithms/zero-one-adam.md, "A short var_freeze_step")."""
    return _hc(hc.ZeroOneAdam, var_freeze_step=freeze, local_step_scaler=1, local_step_clipper=clipper,
               variance_bias_correction=True, **options)


def _hvd(model, opt):
    return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())


#: The PowerSGD of both PowerSGD rows (torch's hook under DDP and hc.PowerSGD): torch's option names; the other
#: options keep torch's defaults in both.
POWERSGD = {"matrix_approximation_rank": 4, "start_powerSGD_iter": 2}


def _hvd_fp16(model, opt):
    """Horovod with its 16-bit wire format: the strong 16-bit baseline."""
    return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                           compression=hvd.Compression.fp16)


#: DiLoCo's rows: a sync every 16 steps; Streaming DiLoCo's: 4 fragments, a sync overlapping one inner step, the
#: paper's mix of 0.5 and 4-bit outer gradients (docs/algorithms/diloco.md).
DILOCO = {"sync_every": 16}
STREAMING_DILOCO = {"sync_every": 16, "fragments": 4, "sync_delay": 1, "mix": 0.5, "outer_compression": "int4"}


def _ddp(powersgd: bool) -> Callable:
    def wrap(model, opt):
        from torch.nn.parallel import DistributedDataParallel

        # PowerSGD chains several gloo allreduces per bucket from future callbacks; with more than one bucket
        # in flight the ranks can issue them in different orders (gloo then aborts on a size mismatch), so the
        # PowerSGD baseline runs with one bucket.
        ddp = DistributedDataParallel(model, bucket_cap_mb=1024 if powersgd else 25)
        if powersgd:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

            state = psgd.PowerSGDState(process_group=None, **POWERSGD)
            ddp.register_comm_hook(state, psgd.powerSGD_hook)
        return ddp, opt

    return wrap


def _floor(model, opt):
    return model, opt


def methods(freeze: int) -> list[Method]:
    """Every method, dense first (its final loss is the target of the others)."""
    out = [
        Method("hc Average (Adam)", "adam", _hc(hc.Average), True),
        Method("hc Average no overlap (Adam)", "adam", _hc(hc.Average, overlap=False), True),
        Method("Horovod Adam", "adam", _hvd, needs_horovod=True),
        Method("DDP Adam", "adam", _ddp(False)),
        Method(f"DDP+PowerSGD r{POWERSGD['matrix_approximation_rank']} Adam", "adam", _ddp(True)),
        Method(f"hc PowerSGD r{POWERSGD['matrix_approximation_rank']} (Adam)", "adam", _hc(hc.PowerSGD, **POWERSGD),
               True),
        Method("hc Adasum (Adam)", "adam", _hc(hc.Adasum), True),
        Method("hc OneBitAdam", "adam", _hc(hc.OneBitAdam, freeze_step=freeze), True),
        Method("hc OneBitAdam no overlap", "adam", _hc(hc.OneBitAdam, freeze_step=freeze, overlap=False), True),
        # Dense variance steps up to the freeze, then a 1-bit sync every 16 steps (once the interval has doubled
        # up to the clipper: the tutorial's constant interval), at the lr that steps as bias-corrected Adam would.
        Method("hc ZeroOneAdam", "adam", _zero_one_adam(freeze), True),
        # A sync every 4 steps: about four times the bytes, for fewer local steps (they cost held-out loss).
        Method("hc ZeroOneAdam sync/4", "adam", _zero_one_adam(freeze, clipper=4), True),
        # The same bytes as the first row; m = 0 after each sync (Z18) rather than the 1-bit ubar / lrs.
        Method("hc ZeroOneAdam reset m", "adam", _zero_one_adam(freeze, reset_momentum_at_sync=True), True),
        Method("Horovod fp16 Adam", "adam", _hvd_fp16, needs_horovod=True),
        Method("hc DiLoCo (Adam)", "adam", _diloco(**DILOCO), True),
        Method("hc Streaming DiLoCo (Adam)", "adam", _diloco(**STREAMING_DILOCO), True),
        Method("hc Average (Lamb)", "lamb", _hc(hc.Average), True),
        Method("Horovod Lamb", "lamb", _hvd, needs_horovod=True),
        Method("hc OneBitLamb", "lamb", _hc(hc.OneBitLamb, freeze_step=freeze), True),
    ]
    # Algorithms that exist in this build (SLAMB, Birder) join without a change here.
    if getattr(hc, "SLAMB", None) is not None:
        out.append(Method("hc SLAMB", "lamb", _hc(hc.SLAMB, compress_ratio=0.1, sync_interval=100), True))
    if getattr(hc, "Birder", None) is not None:
        out += [
            Method("hc Average (Birder)", "birder", _hc(hc.Average), True),
            Method("Horovod Birder", "birder", _hvd, needs_horovod=True),
            Method("hc Birder", "birder", _hc(hc.Birder), True),
        ]
    # The floor of each rule: its local optimizer alone, no communication.
    out += [Method(f"floor {name} (no comm)", name.lower(), _floor) for name in ("Adam", "Lamb", "Birder")]
    return out


def select(candidates: list[Method], only: str) -> list[Method]:
    """The methods whose name matches one of the comma-separated ``only`` (exact names or shell patterns such as
    ``*PowerSGD*``), in their order; all of them for an empty ``only``. ValueError naming a pattern that matches
    no method (a typo would otherwise measure nothing)."""
    patterns = [s.strip() for s in only.split(",") if s.strip()]
    if not patterns:
        return list(candidates)
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(m.name, p) for m in candidates)]
    if unmatched:
        raise ValueError(f"--only: {', '.join(map(repr, unmatched))} match no method; the methods are "
                         f"{', '.join(m.name for m in candidates)}")
    return [m for m in candidates if any(fnmatch.fnmatchcase(m.name, p) for p in patterns)]


def _wire_bytes() -> int:
    return int((LO_STATS / "tx_bytes").read_text()) if LO_STATS.exists() else 0


def _kept_model(kept: nn.Module, model: nn.Module, opt) -> nn.Module:
    """``kept`` (a model of the same shape) made the model a user would keep at this step: this rank's, with
    DiLoCo's synced copy (``diloco_state``) in place of the parameters under DiLoCo, whose local parameters drift
    between syncs. Read only: training goes on from the model and optimizer untouched."""
    inner = model.module if hasattr(model, "module") else model
    kept.load_state_dict(inner.state_dict())  # BatchNorm's running statistics included
    state = getattr(opt, "diloco_state", None)
    if state is not None and state.synced is not None:
        from hvd_compress.algorithms.diloco import fragment_members
        from hvd_compress.torch.diloco import TorchFragments

        params = [p for p in kept.parameters() if p.requires_grad]  # the optimizer's order: built from parameters()
        members = [[params[i] for i in m] for m in fragment_members(len(params), len(state.synced))]
        io = TorchFragments(members)
        for f, synced in enumerate(state.synced):
            io.write(f, synced)
    return kept


def held_out(model: nn.Module, data: Data) -> tuple[float, float]:
    """Held-out loss and accuracy in eval mode (BatchNorm on its running statistics), the mode restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(data.x_test)
            return (float(nn.functional.cross_entropy(logits, data.y_test)),
                    float((logits.argmax(1) == data.y_test).double().mean()))
    finally:
        model.train(was_training)


def train(method: Method, model_name: str, data: Data, comm, args, seconds: float | None = None,
          **model_options) -> Run:
    """``args.steps`` steps of ``method``, or fewer where ``seconds`` of wall-clock (rank 0's, every rank stops
    at the same step) run out first. Every ``args.eval_every`` steps (0: never) each rank evaluates the model it
    would keep (``_kept_model``; rank 0's is recorded in ``test_curve``) with the clock stopped, so the step times,
    the wall-clock axis and the budget count training alone."""
    from mpi4py import MPI  # here and in main: importing it starts MPI, which the table helpers do without

    rank, size = comm.Get_rank(), comm.Get_size()
    model = build(model_name, seed=args.seed, **model_options)
    opt = _local_optimizer(method.rule, model.parameters(), args.lr)
    model, opt = method.wrap(model, opt)
    loss_fn = nn.CrossEntropyLoss()
    run = Run(method.name, model_name, method.rule)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank's own batches, the same for every method
    n_train = data.x_train.shape[0]
    wire0 = _wire_bytes()
    hc.comm_stats()  # resets: what follows is this method's traffic
    eval_every = getattr(args, "eval_every", 0)
    kept = None
    comm.Barrier()
    start = time.perf_counter()
    paused = 0.0  # seconds spent evaluating: off the clock
    for step in range(args.steps):
        if seconds is not None and comm.bcast(time.perf_counter() - start - paused >= seconds, root=0):
            break
        if step == args.warmup:
            comm.Barrier()
            wire0 = _wire_bytes()
            hc.comm_stats()  # resets: what follows is the measured steps' traffic
        idx = torch.randint(0, n_train, (args.batch,), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(data.x_train[idx]), data.y_train[idx])
        loss.backward()
        try:
            opt.step()
        except hc.UsageError as e:
            # The ops agree on a non-finite gradient before raising, so every rank stops here alike.
            if "non-finite" not in str(e):
                raise
            run.diverged = step + 1
            break
        run.step_ms.append((time.perf_counter() - t0) * 1e3)
        run.losses.append(float(loss.detach()))
        run.wall_s.append(time.perf_counter() - start - paused)
        if eval_every and (step + 1) % eval_every == 0:
            # On the clock: the ranks catch up with the slowest (without a collective per step, as the floor and
            # DiLoCo, they drift apart); the step ends when every rank has run it. Then off the clock: evaluating.
            comm.Barrier()
            t_eval = time.perf_counter()
            run.wall_s[-1] = t_eval - start - paused
            if kept is None:
                with torch.random.fork_rng():  # leaves the global generator as training left it
                    kept = build(model_name, seed=args.seed, **model_options)
            loss_now, _ = held_out(_kept_model(kept, model, opt), data)
            run.test_curve.append([step + 1, run.wall_s[-1], loss_now])
            comm.Barrier()  # every rank resumes together: no rank's evaluation lands in another's step
            paused += time.perf_counter() - t_eval
    comm.Barrier()
    if eval_every and run.step_ms and (not run.test_curve or run.test_curve[-1][0] != len(run.step_ms)):
        # a run its budget or step count ended between evaluations: its last model too (a capped run's only one)
        if kept is None:
            with torch.random.fork_rng():
                kept = build(model_name, seed=args.seed, **model_options)
        run.wall_s[-1] = time.perf_counter() - start - paused
        run.test_curve.append([len(run.step_ms), run.wall_s[-1], held_out(_kept_model(kept, model, opt), data)[0]])
    # The steps the counts cover: those after the warm-up, or all of a run whose time ran out before its end.
    measured = len(run.step_ms) - args.warmup if len(run.step_ms) > args.warmup else len(run.step_ms)
    wire = _wire_bytes() - wire0
    hc_sent = hc.comm_stats()["bytes_sent"]
    if method.hc_bytes:
        run.hc_bytes_per_step = comm.allreduce(hc_sent, op=MPI.SUM) / size / measured
    if LO_STATS.exists() and os.environ.get("HVDC_BENCH_NET"):
        run.wire_bytes_per_step = wire / size / measured  # lo counts every rank's traffic once
    # The slowest rank's time per step; the mean loss over ranks.
    run.step_ms = _reduce(comm, run.step_ms, MPI.MAX)
    run.losses = [v / size for v in _reduce(comm, run.losses, MPI.SUM)]
    if hasattr(opt, "synchronize_parameters"):
        opt.synchronize_parameters()  # SLAMB, 0/1 Adam: the ranks' models differ between syncs; evaluate their average
    inner = model.module if hasattr(model, "module") else model
    run.test_loss, run.test_accuracy = held_out(inner, data)
    return run


def dense_reference(rule: str, model_name: str, data: Data, args, size: int, steps: int,
                    eval_every: int = 1, also: frozenset[int] = frozenset()) -> list[float]:
    """The held-out loss after each of ``steps`` steps of ``rule`` trained densely over ``size`` ranks, in one
    process: each step's batch is every rank's batch of that step (``train``'s generators, in rank order). With
    equal batches the gradient of its mean loss is the average of the ranks' gradients, the step of hc Average,
    Horovod and DDP to rounding, so a method's held-out loss is judged against the dense rule's at its own step
    count without a dense run behind the slow link. Each rank's batch goes through the model on its own, as on its
    rank, so BatchNorm normalizes over the same samples as there; its running statistics are rank 0's (one update
    per step, from rank 0's batch), as in the model rank 0 evaluates. The loss is the mean of the ranks'. Held out:
    in eval mode, after every ``eval_every``-th step, the steps in ``also`` and the last (NaN after the others)."""
    model = build(model_name, seed=args.seed)
    opt = _local_optimizer(rule, model.parameters(), args.lr)
    loss_fn = nn.CrossEntropyLoss()
    gens = [torch.Generator().manual_seed(1000 + r) for r in range(size)]
    n_train = data.x_train.shape[0]
    out = []
    for _ in range(steps):
        batches = [torch.randint(0, n_train, (args.batch,), generator=g) for g in gens]
        opt.zero_grad()
        rank0 = {}
        for r, idx in enumerate(batches):  # backward per batch: the next forward updates BatchNorm's buffers in place
            (loss_fn(model(data.x_train[idx]), data.y_train[idx]) / size).backward()
            if r == 0:
                rank0 = {k: v.clone() for k, v in model.named_buffers()}
        with torch.no_grad():
            for k, v in model.named_buffers():
                v.copy_(rank0[k])
        opt.step()
        n = len(out) + 1
        due = n == steps or n % eval_every == 0 or n in also
        out.append(held_out(model, data)[0] if due else math.nan)
    return out


def _reduce(comm, values: list[float], op) -> list[float]:
    """Element-wise ``op`` of every rank's ``values``."""
    send = np.asarray(values, dtype=np.float64)
    recv = np.empty_like(send)
    comm.Allreduce(send, recv, op=op)
    return recv.tolist()


def _measured_ms(run: Run, warmup: int) -> list[float]:
    """The steps after ``warmup``, or every step of a run that its time budget ended before."""
    return run.step_ms[warmup:] or run.step_ms


def _median_step_ms(run: Run, warmup: int) -> float:
    return statistics.median(_measured_ms(run, warmup))


def summarize(runs: list[Run], warmup: int, size: int = 1, net: str = "", target: float | None = None,
              window: int = 10, references: dict | None = None, seed_references: dict | None = None) -> list[dict]:
    """One row per run. Under ``net`` the physical limit of a step is max(floor, wire time): every rank's bytes
    cross the namespace's one rate-limited loopback, so the wire time is all ranks' bytes over the link rate.
    Each run's loss target is ``target`` where given, else the final loss of the dense run of its rule; losses
    are smoothed over ``window`` steps. ``references[model][rule]``, where given, is ``dense_reference``'s
    held-out losses: each row's held-out loss is also given against the one at its step count.
    ``seed_references[model][seed][rule]`` likewise for each of a run's ``seeds``: the mean of its held-out losses
    over them against the mean of the dense rule's at the same step counts."""
    references = references or {}
    seed_references = seed_references or {}
    rate = link_bits_per_s(net)
    rows = []
    by_model: dict[str, list[Run]] = {}
    for r in runs:
        by_model.setdefault(r.model, []).append(r)
    for model, runs_of_model in by_model.items():
        rows += [{"model": model, "method": r.method, "skipped": r.skipped} for r in runs_of_model if r.skipped]
        group = [r for r in runs_of_model if not r.skipped]
        floors, horovod, targets = {}, {}, {}
        for r in group:
            if r.method.startswith("floor"):
                floors[r.rule] = _median_step_ms(r, warmup)
            elif r.method.startswith("Horovod"):
                horovod[r.rule] = _median_step_ms(r, warmup)
            elif r.method.startswith("hc Average") and r.rule not in targets:  # the dense run of the rule
                targets[r.rule] = smooth(r.losses, window)[-1]
        for r in group:
            med = _median_step_ms(r, warmup)
            floor_ms = floors.get(r.rule, float("nan"))
            goal = target if target is not None else targets.get(r.rule)
            reached = None
            if goal is not None:
                for t, loss in zip(r.wall_s, smooth(r.losses, window), strict=True):
                    if loss <= goal:
                        reached = t
                        break
            wire_ms = None
            if rate is not None and r.wire_bytes_per_step is not None:
                wire_ms = r.wire_bytes_per_step * size * 8 / rate * 1e3
            limit_ms = max(floor_ms, wire_ms) if wire_ms is not None else floor_ms
            ref = references.get(model, {}).get(r.rule, [])
            dense_test = ref[len(r.step_ms) - 1] if 0 < len(r.step_ms) <= len(ref) else None
            seeds = seed_references.get(model, {})
            dense_seeds = [seeds[str(s["seed"])][r.rule][s["steps"] - 1] for s in r.seeds
                           if str(s["seed"]) in seeds and 0 < s["steps"] <= len(seeds[str(s["seed"])][r.rule])]
            judged = r.seeds if seeds and len(dense_seeds) == len(r.seeds) else []  # every seed has its reference
            over_seeds = (statistics.fmean(s["test_loss"] for s in judged) / statistics.fmean(dense_seeds) - 1
                          if judged else None)
            rows.append({
                "model": model, "method": r.method, "median_step_ms": med, "ratio_to_floor": med / floor_ms,
                # the throughput of a method whose steps differ (0/1 Adam: local steps and a costly sync)
                "mean_step_ms": statistics.fmean(_measured_ms(r, warmup)),
                "wire_ms": wire_ms, "ratio_to_limit": med / limit_ms,
                "speedup_vs_horovod": horovod.get(r.rule, float("nan")) / med,
                "hc_bytes_per_step": r.hc_bytes_per_step, "wire_bytes_per_step": r.wire_bytes_per_step,
                "final_train_loss": smooth(r.losses, window)[-1], "test_loss": r.test_loss,
                "test_accuracy": r.test_accuracy, "steps": len(r.step_ms), "time_to_dense_loss_s": reached,
                "dense_test_loss": dense_test,
                "test_loss_vs_dense": None if dense_test is None else r.test_loss / dense_test - 1,
                "seeds": [s["seed"] for s in judged],
                "seed_test_losses": [s["test_loss"] for s in judged],
                "seed_dense_test_losses": dense_seeds if judged else [],
                "test_loss_vs_dense_over_seeds": over_seeds,
            })
    return rows


def markdown(rows: list[dict], label: str, size: int, args) -> str:
    def mb(v):
        return "" if v is None else f"{v / 1e6:.3f}"

    budget = getattr(args, "budget", None)
    length = f"{args.steps} steps" + (f" or {budget:g} s, whichever came first" if budget else "")
    lines = [
        f"End-to-end training steps, `{label}`, {size} ranks, batch {args.batch} per rank, {length} "
        f"(median over the steps after step {args.warmup}, or all of a shorter run), digits data",
        "",
        "| model | method | median step ms | mean step ms | / floor | wire ms | / limit | Horovod / this "
        "| MB/step/rank (hc) | MB/step/rank (wire) | final train loss | held-out loss | held-out vs dense "
        "| s to dense loss |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r['model']} | {r['method']} | skipped: {r['skipped']} |" + " |" * 11)
            continue
        reached = "not reached" if r["time_to_dense_loss_s"] is None else f"{r['time_to_dense_loss_s']:.1f}"
        lines.append(
            f"| {r['model']} | {r['method']} | {r['median_step_ms']:.1f} | {r['mean_step_ms']:.1f} | "
            f"{r['ratio_to_floor']:.2f} | "
            f"{'' if r['wire_ms'] is None else format(r['wire_ms'], '.1f')} | {r['ratio_to_limit']:.2f} | "
            f"{r['speedup_vs_horovod']:.2f} | "
            f"{mb(r['hc_bytes_per_step'])} | {mb(r['wire_bytes_per_step'])} | {r['final_train_loss']:.4f} | "
            f"{r['test_loss']:.4f} | {vs_dense(r)} | {reached} |"
        )
    seeds = e2e_seeds(rows)
    return "\n".join(lines) + "\n" + (f"\n{seeds}" if seeds else "")


def plot(runs: list[Run], stem: Path, window: int = 10) -> list[Path]:
    """One PNG per model, ``<stem>_<model>.png``: training loss against wall-clock time, one line per run."""
    from hvd_compress.bench import plots

    paths = []
    for model in dict.fromkeys(r.model for r in runs):
        mine = [r for r in runs if r.model == model and r.step_ms]
        with plots.context():
            fig, ax = plots.pyplot().subplots(figsize=(9, 5.5))
            plots.loss_panel(ax, [(r.method, r.wall_s, r.losses, r.test_loss) for r in mine],
                             plots.palette([r.method for r in mine]), window)
            ax.set_title(f"{model}: {stem.name}")
            paths.append(plots.save(fig, stem.parent / f"{stem.name}_{model}.png"))
    return paths


def _init_gloo(comm) -> None:
    """torch.distributed over gloo for the DDP baselines, rendezvous on this host (the namespace's loopback)."""
    port = comm.bcast(29500 + os.getpid() % 2000 if comm.Get_rank() == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(),
                            world_size=comm.Get_size())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(E2E_MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--only", default="", help="comma-separated method names or shell patterns, e.g. "
                        "'*PowerSGD*,hc ZeroOneAdam,floor Adam*' (default: all)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of wall-clock per method and model (rank 0's): a run ends after --steps or "
                        "this, whichever comes first; its median is then over its steps after --warmup, or all")
    parser.add_argument("--warmup", type=int, default=15, help="steps before timing; the 1-bit freeze_step")
    parser.add_argument("--burnin", type=int, default=10, help="untimed steps of the first method per model")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=10,
                        help="steps between held-out evaluations (test_curve; off the clock); 0: at the end only")
    parser.add_argument("--fidelity-seeds", default="",
                        help="comma-separated further model seeds: each reruns every chosen method (untimed) and "
                        "the dense reference from that seed; rows get the mean held-out loss over --seed and these "
                        "against the dense rule's mean")
    parser.add_argument("--out", default="bench_results")
    parser.add_argument("--label", default=os.environ.get("HVDC_BENCH_NET") or "shm",
                        help="names the result files (default: the emulated link's rate, else shm)")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or set(models) - set(MODELS):  # every rank stops here alike, before any collective
        parser.error(f"--models: {args.models!r}; the models are {', '.join(MODELS)}")
    if args.budget is not None and not args.budget > 0:
        parser.error(f"--budget: seconds > 0, got {args.budget}")
    if args.eval_every < 0:
        parser.error(f"--eval-every: steps >= 0, got {args.eval_every}")
    try:
        chosen = select(methods(args.warmup), args.only)
        more_seeds = [int(v) for v in args.fidelity_seeds.split(",") if v.strip()]
    except ValueError as e:
        parser.error(str(e))
    if args.seed in more_seeds or len(set(more_seeds)) != len(more_seeds):
        parser.error(f"--fidelity-seeds: seeds other than --seed {args.seed}, each once; got {args.fidelity_seeds!r}")
    torch.set_num_threads(1)
    if hvd is not None:
        hvd.init()
    hc.init()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    _init_gloo(comm)
    data = digits(args.seed)
    runs = []
    references: dict[str, dict[str, list[float]]] = {}
    seed_references: dict[str, dict[str, dict[str, list[float]]]] = {}  # model, seed, rule: held-out per step
    runnable = [m for m in chosen if hvd is not None or not m.needs_horovod]
    by_name = {m.name: m for m in runnable}
    seeded = {seed: argparse.Namespace(**{**vars(args), "seed": seed}) for seed in more_seeds}
    for model in models:
        if args.burnin > 0 and runnable:  # untimed: the first method measured must not pay for cold caches
            burnin = argparse.Namespace(**{**vars(args), "steps": args.burnin})
            train(runnable[0], model, data, comm, burnin)  # one of the chosen: behind a slow link a dense one is slow
        for method in chosen:
            if method not in runnable:
                run = Run(method.name, model, method.rule, skipped="no Horovod")
            else:
                run = train(method, model, data, comm, args, seconds=args.budget)
            runs.append(run)
            if comm.Get_rank() == 0:
                print(f"[e2e] {model} / {method.name}: " + (
                    f"skipped: {run.skipped}" if run.skipped else
                    f"median {_median_step_ms(run, args.warmup):.1f} ms over {len(run.step_ms)} steps, "
                    f"final loss {smooth(run.losses)[-1]:.4f}"), flush=True)
        ran = [r for r in runs if r.model == model and not r.skipped]
        for r in ran:
            r.seeds.append({"seed": args.seed, "steps": len(r.step_ms), "test_loss": r.test_loss})
        for seed in more_seeds:  # the held-out loss only: the same runs from another model seed
            for r in ran:
                again = train(by_name[r.method], model, data, comm, seeded[seed], seconds=args.budget)
                r.seeds.append({"seed": seed, "steps": len(again.step_ms), "test_loss": again.test_loss})
        if comm.Get_rank() == 0 and ran:  # the others wait: a reference needs no communication
            rules = list(dict.fromkeys(r.rule for r in ran))
            steps = max(len(r.step_ms) for r in ran)
            references[model] = {rule: dense_reference(rule, model, data, args, comm.Get_size(), steps)
                                 for rule in rules}
            if more_seeds:
                seed_references[model] = {str(args.seed): references[model]}
                for seed in more_seeds:
                    steps = max(s["steps"] for r in ran for s in r.seeds if s["seed"] == seed)
                    seed_references[model][str(seed)] = {
                        rule: dense_reference(rule, model, data, seeded[seed], comm.Get_size(), steps)
                        for rule in rules}
        comm.Barrier()
    if comm.Get_rank() == 0:
        rows = summarize(runs, args.warmup, comm.Get_size(), os.environ.get("HVDC_BENCH_NET", ""),
                         references=references, seed_references=seed_references)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"e2e_{args.label}_np{comm.Get_size()}"
        result = {"stamp": stamp("e2e", "hvd_compress.bench.e2e", comm.Get_size()), "label": args.label,
                  "args": vars(args), "rows": rows, "runs": [r.__dict__ for r in runs],
                  "dense_reference": references, "seed_dense_reference": seed_references}
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
        table = markdown(rows, args.label, comm.Get_size(), args)
        stem.with_suffix(".md").write_text(table)
        pngs = plot(runs, stem)
        print(table)
        print(f"[e2e] wrote {stem}.json, {stem}.md and {', '.join(str(p) for p in pngs)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
