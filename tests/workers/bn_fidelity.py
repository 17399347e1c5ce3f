"""A Horovod-style training script on scikit-learn's digits with BatchNorm after biased layers: eval-mode accuracy
of 1-bit Adam / 1-bit LAMB against their dense counterparts (Adam, resp. hc.Lamb, behind a dense average).

A bias in front of BatchNorm has a gradient of about zero (BatchNorm removes the mean), so its frozen variance is
about zero while the compressed momentum gives it +/-the scale of its chunk: the update the rule must keep bounded.
BatchNorm's running statistics follow the biases in training mode, so a runaway bias shows in eval mode only.

argv: out_dir arch(cnn|resnet) steps freeze_step runs
  runs: comma list of Adam, Lamb, OneBitAdam, OneBitLamb, or OneBitAdam:<variance_floor>; SGD (momentum 0.9) and
  SignSGD over plain SGD; ZeroOneAdam (var_freeze_step = freeze_step) and PowerSGD over Adam; SLAMB over hc.Lamb;
  Birder, and BirderDense (hc.Birder behind op=Average: its rule uncompressed), at Adam's lr; each optionally
  with options as :name=value (integers or floats); each from the same initial model and data order.
MODEL_SEED in the environment: the model's seed (default 1).
Saves per rank, per run: eval-mode accuracy and loss on 500 held-out images, the largest |parameter|, the SHA-256
of the parameters and BatchNorm buffers, the bytes this rank sent, and the error raised if any.
"""

from __future__ import annotations

import hashlib
import os
import sys

import horovod.torch as hvd
import torch
from common import digits_images, save

import hvd_compress.torch as hc

arch, steps, freeze, runs = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(",")
BATCH = 32  # per rank
LR = {"Adam": 1e-3, "Lamb": 1e-2, "SGD": 0.05, "SignSGD": 0.02}

hvd.init()
torch.set_num_threads(1)
rank, size = hvd.rank(), hvd.size()


class Block(torch.nn.Module):
    """A ResNet basic block: conv-BN-ReLU-conv-BN plus the identity, then ReLU; convolutions with biases."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)
        self.conv2, self.bn2 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


def make_model() -> torch.nn.Module:
    torch.manual_seed(int(os.environ.get("MODEL_SEED", "1")))  # the tests' seed 1; others to measure a spread
    nn = torch.nn
    if arch == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                             nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.BatchNorm1d(64), nn.ReLU(),
                             nn.Linear(64, 10))
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), Block(16), Block(16),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16 * 4, 10))


def make_optimizer(run: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    name, *extra = run.split(":")
    options = {"op": getattr(hc, name) if name not in ("Adam", "Lamb", "SGD", "BirderDense") else hc.Average}
    if name.startswith("OneBit"):
        options.update(freeze_step=freeze, **({"variance_floor": float(extra[0])} if extra else {}))
    else:
        options.update({k: v == "True" if v in ("True", "False") else float(v) if "." in v or "e" in v else int(v)
                        for k, v in (kv.split("=") for kv in extra)})
    lr = options.pop("lr", LR.get(name, LR["Adam"]))  # lr=...: the wrapped optimizer's
    if name in ("SGD", "SignSGD"):
        base = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9 if name == "SGD" else 0.0)
    elif name.endswith("Lamb") or name == "SLAMB":
        base = hc.Lamb(model.parameters(), lr=LR["Lamb"])
    elif name.startswith("Birder"):
        base = hc.Birder(model.parameters(), lr=lr)
    else:
        base = torch.optim.Adam(model.parameters(), lr=lr)
    if name == "ZeroOneAdam":
        options.setdefault("var_freeze_step", freeze)
    return hc.DistributedOptimizer(base, named_parameters=model.named_parameters(), **options)


def train(run: str, xs: tuple[torch.Tensor, ...]) -> dict[str, object]:
    x, y, x_test, y_test = xs
    model = make_model()
    opt = make_optimizer(run, model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    order = torch.Generator().manual_seed(100 + rank)
    out: dict[str, object] = {"error": None}
    model.train()
    step = 0
    try:
        for step in range(1, steps + 1):  # noqa: B007 (named in the error)
            idx = torch.randint(len(y), (BATCH,), generator=order)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    except hc.UsageError as e:
        out["error"] = f"step {step}: {e}"
    if hasattr(opt, "synchronize_parameters"):  # SLAMB: the ranks' models differ between its syncs
        opt.synchronize_parameters()
    # Horovod's pattern: the BatchNorm running statistics are per rank; average them before evaluating.
    for name, buf in model.named_buffers():
        if buf.is_floating_point():
            buf.copy_(hvd.allreduce(buf, op=hvd.Average, name=f"bn.{name}"))
    model.eval()
    with torch.no_grad():
        logits = model(x_test)
        out["accuracy"] = float((logits.argmax(1) == y_test).float().mean())
        out["loss"] = float(torch.nn.functional.cross_entropy(logits, y_test))
    state = [p.detach().reshape(-1) for p in model.parameters()]
    out["max_abs"] = float(torch.cat(state).abs().max())
    out["hash"] = hashlib.sha256(torch.cat(state).numpy().tobytes()).hexdigest()
    out["bytes_sent"] = opt.comm_stats()["bytes_sent"]
    if rank == 0:
        print(f"{arch} {run:>10} {size} ranks: eval accuracy {out['accuracy']:.3f} loss {out['loss']:.4f} "
              f"max|x| {out['max_abs']:.3g} sent {out['bytes_sent'] / 1e6:.2f} MB {out['error'] or ''}", flush=True)
    return out


xs = digits_images(rank, size)
save(rank, {run: train(run, xs) for run in runs})
