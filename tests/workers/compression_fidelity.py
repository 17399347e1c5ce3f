"""Top-k 1% with error feedback (plain, or with DGC's momentum correction) against dense SGD on a ReLU MLP with
real data (scikit-learn's digits: 8x8 images, 10 classes; 1297 training images sharded over the ranks, 500 held
out), 4 ranks.

argv: out_dir steps runs lr momentum [seeds]; runs: comma list of dense, topk:<ratio>, randomk:<ratio>, dgc:<ratio>
(top-k with Deep Gradient Compression's momentum correction: ``topk(ratio, momentum=momentum)`` under SGD with
momentum 0, the momentum living in the compression), dgc-nomask:<ratio> (the same with
``momentum_masking=False``); a dgc run may add DGC's other options as ``:key=value`` (clip_norm, warmup_steps,
warmup_stages: ``dgc-nomask:0.01:warmup_steps=100``); the others wrap SGD(momentum=momentum); seeds: comma list
(default 1), each a model initialization and per-rank batch order; every: held-out loss every this many steps
(default: only at the end); lr_warmup: steps of a linear learning-rate warm-up before the cosine decay, for
every run (default 0). Saves per rank, for each run and seed (key ``<run>@<seed>``): the final held-out
cross-entropy (``test_loss``), the held-out cross-entropy at each checkpoint (``checkpoints``: {step: loss}) and
the bytes this rank sent per step in the steps up to it (``window_bytes_per_step``), the SHA-256 of the final
parameters and the bytes this rank sent per step over the run.
"""

from __future__ import annotations

import hashlib
import math
import sys

import torch
from common import save
from sklearn.datasets import load_digits

import hvd_compress.torch as hc

steps, runs = int(sys.argv[2]), sys.argv[3].split(",")
LR, MOMENTUM = float(sys.argv[4]), float(sys.argv[5])
SEEDS = [int(s) for s in sys.argv[6].split(",")] if len(sys.argv) > 6 else [1]
EVERY = int(sys.argv[7]) if len(sys.argv) > 7 else 0
LR_WARMUP = int(sys.argv[8]) if len(sys.argv) > 8 else 0
BATCH = 16

hc.init()
torch.set_num_threads(1)
rank, size = hc.rank(), hc.size()
digits = load_digits()
x_all = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y_all = torch.tensor(digits.target, dtype=torch.long)
perm = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(0))
test, train = perm[:500], perm[500:]
mine = train[rank::size]
x, y, x_test, y_test = x_all[mine], y_all[mine], x_all[test], y_all[test]


def train_run(run: str, seed: int) -> dict[str, object]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    hc.broadcast_parameters(model.state_dict(), root_rank=0)
    kind, _, rest = run.partition(":")
    ratio, *extra = rest.split(":")
    dgc_options = {key: (float if key == "clip_norm" else int)(value)
                   for key, _, value in (item.partition("=") for item in extra)}
    comp = {"dense": hc.Compression.none, "topk": None, "randomk": None, "dgc": None, "dgc-nomask": None}[kind]
    if kind == "topk":
        comp = hc.Compression.topk(float(ratio))
    elif kind == "randomk":
        comp = hc.Compression.randomk(float(ratio), seed=5)
    elif kind.startswith("dgc"):
        comp = hc.Compression.topk(float(ratio), momentum=MOMENTUM, momentum_masking=kind == "dgc", **dgc_options)
    momentum = 0.0 if kind.startswith("dgc") else MOMENTUM
    opt = hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum),
                                  named_parameters=model.named_parameters(), op=hc.Average, compression=comp)
    if LR_WARMUP:
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / LR_WARMUP) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    else:
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    order = torch.Generator().manual_seed(100 * seed + rank)
    opt.comm_stats()
    checkpoints, window_bytes, sent = {}, {}, 0
    for step in range(steps):
        idx = torch.randint(len(y), (BATCH,), generator=order)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        sched.step()
        if EVERY and (step + 1) % EVERY == 0:
            with torch.no_grad():
                checkpoints[step + 1] = torch.nn.functional.cross_entropy(model(x_test), y_test).item()
            window_bytes[step + 1] = opt.comm_stats()["bytes_sent"]
            sent += window_bytes[step + 1]
            window_bytes[step + 1] /= EVERY
    sent = (sent + opt.comm_stats()["bytes_sent"]) / steps
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(x_test), y_test).item()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if rank == 0:
        print(f"{run:>12} seed {seed}: held-out loss {loss:.4f}, {sent:,.0f} bytes sent per step", flush=True)
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    return {"test_loss": loss, "checkpoints": checkpoints, "window_bytes_per_step": window_bytes, "hash": digest,
            "bytes_per_step": sent}


save(rank, {f"{run}@{seed}": train_run(run, seed) for run in runs for seed in SEEDS})
