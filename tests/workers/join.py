"""Horovod's ``hvd.join()`` with hvd_compress's ops (uneven data: a rank out of batches first). argv: out_dir, mode.

- "ops": every rank steps alike then joins (``hvd.join()`` returns, and ``hc.join()``); rank n-1 steps once fewer
  and joins while the others step, under hvd.DistributedOptimizer(op=hc.OneBitAdam) and
  hc.DistributedOptimizer(op=hc.Average): every rank raises MismatchError naming it, and a later collective works;
- "horovod": Horovod's own optimizer and join with uneven data, hvd_compress imported but not used: Horovod's
  join as Horovod's (the joined rank's part filled with zeros), no error.
"""

import sys

import horovod.torch as hvd
import torch
from common import outcome, save

import hvd_compress.torch as hc
from hvd_compress import ops

hvd.init()
r, n = hvd.rank(), hvd.size()


def train(make_opt, steps: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = make_opt(model)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()


def onebit(model):
    return hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                    named_parameters=model.named_parameters(), op=hc.OneBitAdam, freeze_step=1)


def average(model):
    return hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(),
                                   op=hc.Average)


def plain(model):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                    named_parameters=model.named_parameters())


def after() -> float:
    """A collective after the failure: its sum on every rank."""
    return float(hc.allreduce(torch.ones(3), op=hc.Sum)[0])


out: dict = {}
if sys.argv[2] == "ops":
    for name, make in (("onebit", onebit), ("average", average)):
        joined: dict = {}
        out[f"{name}_even"] = outcome(lambda m=make, j=joined: (train(m, 3), j.setdefault("last", hvd.join())))
        out[f"{name}_even_last"] = joined.get("last")
        out[f"{name}_hc_join"] = outcome(hc.join)
        out[f"{name}_uneven"] = outcome(lambda m=make: (train(m, 2 if r == n - 1 else 3), hvd.join()))
        out[f"{name}_after"] = after()
else:
    joined = {}
    out["horovod_uneven"] = outcome(lambda: (train(plain, 2 if r == n - 1 else 3),
                                             joined.setdefault("last", hvd.join())))
    out["horovod_last"] = joined.get("last")
    out["hc_initialized"] = ops.is_initialized()
save(r, out)
