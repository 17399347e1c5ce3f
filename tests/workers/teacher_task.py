"""The teacher task of the fidelity tests: data-parallel training on N ranks, once per reduction, side by side.

Each rank trains on its own shard of a synthetic regression task (targets from a fixed random teacher
network plus noise of variance NOISE^2, which is the lowest loss any model can reach), with
``hc.DistributedOptimizer``; per epoch it prints the global training loss, the held-out loss, and
the bytes this rank's optimizer sent and received. The 1-bit optimizers and SLAMB run next to their dense
counterparts (Adam and ``hc.Lamb`` with a dense average), and the task reports each one's final loss
relative to its counterpart (the fidelity check: within 2%). With ``--out DIR`` it writes
``results.json`` and ``loss_curves.png`` there. Launch: ``mpirun -np 4 python tests/workers/teacher_task.py``
(tests/test_fidelity.py does).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

import hvd_compress.torch as hc

try:
    import horovod.torch as hvd
except ImportError:  # hvd_compress also runs without Horovod, on MPI alone
    hvd = None

FEATURES, OUTPUTS, HIDDEN = 32, 4, 64
NOISE = 0.5


def teacher_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    teacher = torch.Generator().manual_seed(0)
    w1 = torch.randn(FEATURES, 16, generator=teacher) / FEATURES**0.5
    w2 = torch.randn(16, OUTPUTS, generator=teacher) / 4
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = torch.tanh(x @ w1) @ w2 + NOISE * torch.randn(n, OUTPUTS, generator=g)
    return x, y


def make_model() -> torch.nn.Module:
    torch.manual_seed(42)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUTPUTS),
    )


REDUCTIONS = {
    "Average": lambda params: (torch.optim.SGD(params, lr=0.05, momentum=0.9), {"op": hc.Average}),
    # Adasum combines each rank's own SGD update; it needs no learning-rate rescaling for the rank count.
    "Adasum": lambda params: (torch.optim.SGD(params, lr=0.05, momentum=0.9), {"op": hc.Adasum}),
    "Adam": lambda params: (torch.optim.Adam(params, lr=5e-3), {"op": hc.Average}),
    "OneBitAdam": lambda params: (torch.optim.Adam(params, lr=5e-3), {"op": hc.OneBitAdam, "freeze_step": FREEZE}),
    "Lamb": lambda params: (hc.Lamb(params, lr=2e-2), {"op": hc.Average}),
    "OneBitLamb": lambda params: (hc.Lamb(params, lr=2e-2), {"op": hc.OneBitLamb, "freeze_step": FREEZE}),
    # SLAMB at the spec's k = 0.1, H = 100; the demo's layers are all below the reference's 9000-element
    # threshold for always-synchronized tensors, so the threshold is lowered to let the mask act on them.
    "SLAMB": lambda params: (hc.Lamb(params, lr=2e-2), {"op": hc.SLAMB, "compress_ratio": 0.1, "sync_interval": 100,
                                                         "grad_size_thr": 1000, "seed": 1}),
    # Birder (paper 004): its uncompressed rule behind a dense average, and the 1-bit algorithm.
    "BirderDense": lambda params: (hc.Birder(params, lr=5e-3), {"op": hc.Average}),
    "Birder": lambda params: (hc.Birder(params, lr=5e-3), {"op": hc.Birder}),
}
# Each compressed optimizer and the dense optimizer it compresses (same rule, same hyper-parameters).
COUNTERPARTS = {"OneBitAdam": "Adam", "OneBitLamb": "Lamb", "SLAMB": "Lamb", "Birder": "BirderDense"}
FREEZE = 100  # dense warm-up steps of the 1-bit optimizers: 20% of the default run (paper 003: 15-25%)


def train(name: str, epochs: int, batch: int, shard: int) -> dict[str, float]:
    rank, size = hc.rank(), hc.size()
    x, y = teacher_data(shard, seed=1 + rank)
    x_test, y_test = teacher_data(8192, seed=10_000)
    model = make_model()
    hc.broadcast_parameters(model.state_dict(), root_rank=0)
    base, options = REDUCTIONS[name](model.parameters())
    opt = hc.DistributedOptimizer(base, named_parameters=model.named_parameters(), **options)
    hc.broadcast_optimizer_state(opt, root_rank=0)
    # Cosine decay to 0: the final loss is then that of a settled model, not of one noisy step.
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * len(range(0, shard, batch)))
    if rank == 0:
        print(f"\n== {name}: {size} ranks, {shard} samples per rank, batch {batch} ==", flush=True)
    result: dict[str, float] = {}
    curve: list[float] = []
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        perm = torch.randperm(shard, generator=torch.Generator().manual_seed(epoch * 100 + rank))
        total = torch.zeros(2, dtype=torch.float64)
        steps = range(0, shard, batch)
        bar = tqdm(steps, desc=f"{name} epoch {epoch}", leave=False, disable=rank != 0, ncols=80)
        for i in bar:
            idx = perm[i : i + batch]
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            sched.step()
            total += torch.tensor([loss.item() * len(idx), len(idx)], dtype=torch.float64)
            curve.append(loss.item())
        stats = opt.comm_stats()
        hc.allreduce_(total, op=hc.Sum, name="demo.loss")
        if hasattr(opt, "synchronize_parameters"):
            opt.synchronize_parameters()  # SLAMB: models differ between syncs; evaluate (and go on from) their average
            extra = opt.comm_stats()
            stats = {k: v + extra[k] for k, v in stats.items()}
        with torch.no_grad():
            test = torch.nn.functional.mse_loss(model(x_test), y_test).item()
        result = {"loss": (total[0] / total[1]).item(), "test_loss": test, "mb_sent": stats["bytes_sent"] / 1e6}
        if rank == 0:
            print(
                f"{name:>10} epoch {epoch}: loss {result['loss']:.4f}  held-out loss {test:.4f}  "
                f"sent {stats['bytes_sent'] / 1e6:.2f} MB  received {stats['bytes_received'] / 1e6:.2f} MB  "
                f"({time.perf_counter() - start:.1f} s)",
                flush=True,
            )
    result["final_loss"] = result["test_loss"]  # the same held-out set on every rank
    per_rank = torch.tensor(curve, dtype=torch.float64)
    hc.allreduce_(per_rank, op=hc.Average, name="demo.curve")  # the loss curve averaged over ranks
    result["curve"] = per_rank.tolist()
    return result


def fidelity(results: dict[str, dict]) -> dict[str, float]:
    """Final held-out loss of each 1-bit optimizer relative to its dense counterpart's, minus 1."""
    return {
        name: results[name]["final_loss"] / results[dense]["final_loss"] - 1.0
        for name, dense in COUNTERPARTS.items()
        if name in results and dense in results
    }


def write_outputs(out: Path, results: dict[str, dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    summary = {"ranks": hc.size(), "args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    summary["fidelity"] = fidelity(results)
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    window = 16
    for name, res in results.items():
        curve = torch.tensor(res["curve"])
        smooth = curve.unfold(0, window, 1).mean(dim=1) if len(curve) >= window else curve
        ax.plot(range(len(smooth)), smooth.numpy(), label=name, linestyle="--" if name in COUNTERPARTS else "-")
    if any(name in results for name in COUNTERPARTS):
        ax.axvline(FREEZE, color="grey", linewidth=0.8, linestyle=":", label=f"freeze_step={FREEZE}")
    ax.set(xlabel="step", ylabel=f"training loss (mean over {hc.size()} ranks, {window}-step window)", yscale="log")
    ax.set_title(f"hvd_compress demo: {hc.size()} ranks")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss_curves.png", dpi=120)
    print(f"wrote {out / 'results.json'} and {out / 'loss_curves.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reductions", default=",".join(REDUCTIONS), help=f"any of {list(REDUCTIONS)}")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--shard", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=None, help="write results.json and loss_curves.png here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if hvd is not None:
        hvd.init()
    hc.init()
    results = {name: train(name, args.epochs, args.batch, args.shard) for name in args.reductions.split(",")}
    if hc.rank() == 0:
        print("\nfinal:")
        for name, res in results.items():
            sent = f"last epoch sent {res['mb_sent']:.2f} MB"
            print(f"  {name:>10}: final held-out loss {res['final_loss']:.4f} (floor {NOISE**2:.4f})  {sent}")
        for name, rel in fidelity(results).items():
            verdict = "within 2%" if abs(rel) <= 0.02 else "NOT within 2%"
            print(f"  fidelity {name} vs {COUNTERPARTS[name]}: final loss {100 * rel:+.2f}% ({verdict})")
        if args.out is not None:
            write_outputs(args.out, results, args)


if __name__ == "__main__":
    main()
