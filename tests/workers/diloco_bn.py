"""hc.DistributedOptimizer(op=hc.DiLoCo, buffers=model.buffers()) on a ReLU MLP with BatchNorm on the digits
(hvd_compress.bench.models.digits), each rank on its own shard: each rank's eval-mode logits on the held-out digits
after a run that ends on a sync, with and without ``buffers``, and their accuracy; "long": the eval-mode held-out
loss of DiLoCo and of dense Adam (op=hc.Average) at equal inner steps, one per model seed.
argv: out_dir, "fast" or "long"."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F  # noqa: N812
from common import save
from torch import nn

import hvd_compress.torch as hc
from hvd_compress.bench.models import digits

BATCH, LR = 32, 3e-3


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.BatchNorm1d(64),
                         nn.ReLU(), nn.Linear(64, 10))


def train(data, seed: int, steps: int, sync_every: int | None, buffers: bool = True) -> dict:
    """``steps`` inner steps of Adam on this rank's shard: DiLoCo every ``sync_every`` steps, or dense (None)."""
    net = model(seed)
    if sync_every is None:
        opt = hc.DistributedOptimizer(torch.optim.Adam(net.parameters(), lr=LR),
                                      named_parameters=net.named_parameters(), op=hc.Average)
    else:
        opt = hc.DistributedOptimizer(torch.optim.AdamW(net.parameters(), lr=LR),
                                      named_parameters=net.named_parameters(), op=hc.DiLoCo, sync_every=sync_every,
                                      buffers=net.buffers() if buffers else None)
    hc.broadcast_parameters(net.state_dict(), root_rank=0)
    xs, ys = data.x_train[hc.rank()::hc.size()], data.y_train[hc.rank()::hc.size()]
    gen = torch.Generator().manual_seed(1000 * seed + hc.rank())
    net.train()
    for _ in range(steps):
        pick = torch.randint(0, len(xs), (BATCH,), generator=gen)
        loss = F.cross_entropy(net(xs[pick]), ys[pick])
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    with torch.no_grad():
        logits = net(data.x_test)
    return {"logits": logits.numpy().copy(), "loss": float(F.cross_entropy(logits, data.y_test)),
            "accuracy": float((logits.argmax(1) == data.y_test).float().mean())}


def main() -> None:
    hc.init()
    data = digits()
    if sys.argv[2] == "fast":
        save(hc.rank(), {"synced": train(data, 0, 60, 10), "unsynced": train(data, 0, 60, 10, buffers=False)})
        return
    out = {"diloco": [], "dense": []}
    for seed in range(6):
        out["diloco"].append(train(data, seed, 300, 20)["loss"])
        out["dense"].append(train(data, seed, 300, None)["loss"])
    save(hc.rank(), {"losses": out})


if __name__ == "__main__":
    main()
