"""Horovod's entry points with hvd_compress's ops, after hvd.init(): hvd.DistributedOptimizer(op=hc.OneBitAdam)
and hvd.allreduce(op=hc.Adasum) run on hc; Horovod's own ops stay Horovod's; the routing can be switched off."""

import hashlib
import sys

import horovod.torch as hvd
import torch
from common import outcome, rank_input, save

import hvd_compress.torch as hc
from hvd_compress.torch.wrapping import wrapped_engine

hvd.init()
r = hvd.rank()
out = {"enabled_by_env": sys.argv[2] == "on"}


def train(make_opt) -> list[str]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = make_opt(model)
    hashes = []
    for step in range(5):
        g = torch.Generator().manual_seed(100 * step + r)
        x = torch.randn(4, 6, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        hashes.append(hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    out.setdefault("types", []).append(wrapped_engine(opt) is not None)
    return hashes


def via_hvd(model):
    return hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), model.named_parameters(),
                                    op=hc.OneBitAdam, freeze_step=2)


def via_hc(model):
    return hc.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), model.named_parameters(),
                                   op=hc.OneBitAdam, freeze_step=2)


if out["enabled_by_env"]:
    out["hvd_onebit"] = train(via_hvd)
    out["hc_onebit"] = train(via_hc)
    x = rank_input(r, 33, torch.float32, seed=1)
    out["adasum"] = (hvd.allreduce(x, op=hc.Adasum), hc.allreduce(x, op=hc.Adasum))
    out["hvd_average"] = (hvd.allreduce(x, op=hvd.Average, name="avg"), hc.allreduce(x, op=hc.Average))
    hc.horovod_entry(False)
out["off"] = outcome(lambda: train(via_hvd))  # Horovod's own refuses our options
out["hvd_dense"] = train(lambda m: hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05),
                                                            m.named_parameters(), op=hvd.Average))
save(r, out)
