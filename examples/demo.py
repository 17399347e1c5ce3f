"""make demo: data-parallel training of a small classifier on N ranks, once per reduction, side by side.

Each rank trains on its own shard of a synthetic task (labels from a fixed random teacher network),
with ``hc.DistributedOptimizer``; per epoch it prints the global training loss, test accuracy, and
the bytes this rank's optimizer sent and received. Launch: ``mpirun -np 4 python examples/demo.py``
(or ``horovodrun -np 4 python examples/demo.py``).
"""

from __future__ import annotations

import argparse
import time

import torch
from tqdm import tqdm

import hvd_compress.torch as hc

try:
    import horovod.torch as hvd
except ImportError:  # hvd_compress also runs without Horovod, on MPI alone
    hvd = None

FEATURES, CLASSES, HIDDEN = 32, 4, 64


def teacher_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    teacher = torch.Generator().manual_seed(0)
    w1 = torch.randn(FEATURES, 16, generator=teacher)
    w2 = torch.randn(16, CLASSES, generator=teacher)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return x, y


def make_model() -> torch.nn.Module:
    torch.manual_seed(42)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    )


REDUCTIONS = {
    "Average": lambda params: (torch.optim.SGD(params, lr=0.05, momentum=0.9), {"op": hc.Average}),
    # Adasum combines each rank's own SGD update; it needs no learning-rate rescaling for the rank count.
    "Adasum": lambda params: (torch.optim.SGD(params, lr=0.05, momentum=0.9), {"op": hc.Adasum}),
}


def train(name: str, epochs: int, batch: int, shard: int) -> dict[str, float]:
    rank, size = hc.rank(), hc.size()
    x, y = teacher_data(shard, seed=1 + rank)
    x_test, y_test = teacher_data(2048, seed=10_000)
    model = make_model()
    hc.broadcast_parameters(model.state_dict(), root_rank=0)
    base, options = REDUCTIONS[name](model.parameters())
    opt = hc.DistributedOptimizer(base, named_parameters=model.named_parameters(), **options)
    hc.broadcast_optimizer_state(opt, root_rank=0)
    if rank == 0:
        print(f"\n== {name}: {size} ranks, {shard} samples per rank, batch {batch} ==", flush=True)
    result: dict[str, float] = {}
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        perm = torch.randperm(shard, generator=torch.Generator().manual_seed(epoch * 100 + rank))
        total = torch.zeros(2, dtype=torch.float64)
        steps = range(0, shard, batch)
        bar = tqdm(steps, desc=f"{name} epoch {epoch}", leave=False, disable=rank != 0, ncols=80)
        for i in bar:
            idx = perm[i : i + batch]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(idx), len(idx)], dtype=torch.float64)
        stats = opt.comm_stats()
        hc.allreduce_(total, op=hc.Sum, name="demo.loss")
        with torch.no_grad():
            acc = (model(x_test).argmax(dim=1) == y_test).double().mean().item()
        result = {"loss": (total[0] / total[1]).item(), "acc": acc}
        if rank == 0:
            print(
                f"{name:>8} epoch {epoch}: loss {result['loss']:.4f}  test acc {acc:.3f}  "
                f"sent {stats['bytes_sent'] / 1e6:.2f} MB  received {stats['bytes_received'] / 1e6:.2f} MB  "
                f"({time.perf_counter() - start:.1f} s)",
                flush=True,
            )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reductions", default=",".join(REDUCTIONS), help=f"any of {list(REDUCTIONS)}")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--shard", type=int, default=2048)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if hvd is not None:
        hvd.init()
    hc.init()
    results = {name: train(name, args.epochs, args.batch, args.shard) for name in args.reductions.split(",")}
    if hc.rank() == 0:
        print("\nfinal:", "  ".join(f"{k}: loss {v['loss']:.4f} acc {v['acc']:.3f}" for k, v in results.items()))


if __name__ == "__main__":
    main()
