"""A checkpoint taken between ``backward()`` and ``step()`` (buckets already reduced during backward, with overlap):
loaded into fresh objects, with that step's batch taken again, the run ends bit for bit as the one never stopped.
Per op, each rank saves the parameter hashes after every step of both runs; for PowerSGD and top-k, whose
checkpoint there warns, the warnings of ``state_dict()`` there and after ``step()``. argv: out_dir."""

import contextlib
import copy
import hashlib
import time
import warnings

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
#: Reductions with state whose checkpoint between a reduction and step() holds half a step: it warns there.
#: PowerSGD reduces during backward; top-k, which reduces in step(), here in Horovod's synchronize() before it.
REFUSED = {"PowerSGD": {"op": hc.PowerSGD, "overlap": True, "matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
           "TopK": {"compression": hc.Compression.topk(0.25)}}


def make(op: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    params = model.parameters()
    inner = hc.Birder(params, lr=1e-3) if op == "Birder" else hc.Lamb(params, lr=1e-3) if op == "SLAMB" else (
        torch.optim.SGD(params, lr=1e-3) if op == "TopK" else torch.optim.Adam(params, lr=1e-3))
    options = {"op": getattr(hc, op), "overlap": True, **OPS[op]} if op in OPS else REFUSED[op]
    return model, hc.DistributedOptimizer(inner, named_parameters=model.named_parameters(), bucket_mb=0.01,
                                          **options)


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
for op in REFUSED:
    model, opt = make(op)
    for s in range(AT):
        backward(model, opt, s)
        opt.step()
    backward(model, opt, AT)
    if op == "TopK":
        opt.synchronize()
    time.sleep(0.3)
    with warnings.catch_warnings(record=True) as between:
        warnings.simplefilter("always")
        opt.state_dict()
    with opt.skip_synchronize() if op == "TopK" else contextlib.nullcontext():
        opt.step()
    with warnings.catch_warnings(record=True) as after:
        warnings.simplefilter("always")
        opt.state_dict()
    out[op] = ([str(w.message) for w in between], [str(w.message) for w in after])
save(r, out)
