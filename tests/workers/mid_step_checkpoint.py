"""A checkpoint taken between ``backward()`` and ``step()`` (buckets already reduced during backward, with overlap):
loaded into fresh objects, with that step's batch taken again, the run ends bit for bit as the one never stopped.
Per op, each rank saves the parameter hashes after every step of both runs. argv: out_dir."""

import copy
import hashlib
import time

import torch
from common import save

import hvd_compress.torch as hc

hc.init()
r = hc.rank()
torch.set_num_threads(1)
STEPS, AT = 7, 4
OPS = {  # each past its warm-up at AT, several buckets, overlap on
    "OneBitAdam": {"freeze_step": 2}, "ZeroOneAdam": {"var_freeze_step": 2, "local_step_scaler": 1},
    "Birder": {}, "SLAMB": {"sync_interval": 3},
}


def make(op: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    params = model.parameters()
    inner = hc.Birder(params, lr=1e-3) if op == "Birder" else (
        hc.Lamb(params, lr=1e-3) if op == "SLAMB" else torch.optim.Adam(params, lr=1e-3))
    return model, hc.DistributedOptimizer(inner, named_parameters=model.named_parameters(), op=getattr(hc, op),
                                          bucket_mb=0.01, overlap=True, **OPS[op])


def backward(model: torch.nn.Module, opt: torch.optim.Optimizer, s: int) -> None:
    opt.zero_grad()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(100 * s + r))
    model(x).pow(2).mean().backward()


def digest(model: torch.nn.Module) -> str:
    return hashlib.sha256(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tobytes()).hexdigest()


out = {}
for op in OPS:
    model, opt = make(op)
    full, saved = [], None
    for s in range(STEPS):
        backward(model, opt, s)
        if s == AT:
            time.sleep(0.3)  # the buckets started during backward are done: their state is written
            saved = copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict()})
        opt.step()
        full.append(digest(model))
    model, opt = make(op)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    resumed = full[:AT]
    for s in range(AT, STEPS):
        backward(model, opt, s)
        opt.step()
        resumed.append(digest(model))
    out[op] = (full, resumed)
save(r, out)
