"""``opt.comm_stats()`` holds every byte the optimizer's calls made, and nothing else: for each op, with and
without overlap and ``torch.amp.GradScaler``, the wrapper's counts over six steps against the process's
(``hvd_compress.ops.runtime.comm_stats``) over the same steps; then with Horovod's ``synchronize()``, clipping
and ``step()`` inside ``skip_synchronize()``, and with a closure whose own allreduce of a loss is the user's.
argv: out_dir."""

from __future__ import annotations

import torch
from common import save

import hvd_compress.torch as hc
from hvd_compress.ops.runtime import comm_stats

hc.init()
r = hc.rank()
torch.set_num_threads(1)
OPS = {"Average": {}, "Sum": {}, "OneBitAdam": {"freeze_step": 2}, "OneBitLamb": {"freeze_step": 2},
       "ZeroOneAdam": {"var_freeze_step": 2, "local_step_scaler": 1}, "SLAMB": {"sync_interval": 2}, "Birder": {},
       "PowerSGD": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}, "SignSGD": {}, "Adasum": {},
       "TopK": {"compression": hc.Compression.topk(0.25)}}
STEPS = 6


def make(op: str, overlap: bool, scaler: torch.amp.GradScaler | None) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    params = model.parameters()
    inner = (hc.Birder(params, lr=1e-2) if op == "Birder" else hc.Lamb(params, lr=1e-2) if op in ("SLAMB", "OneBitLamb")
             else torch.optim.SGD(params, lr=1e-2) if op in ("SignSGD", "TopK") else torch.optim.Adam(params, lr=1e-2))
    options = dict(OPS[op])
    if op == "Adasum":
        options.update({"grad_scaler": scaler} if scaler is not None else {})  # it steps as gradients land
    elif op != "TopK":  # top-k reduces whole buffers in step()
        options["overlap"] = overlap
    return model, hc.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                          op=hc.Average if op == "TopK" else getattr(hc, op), **options)


def loss_of(model: torch.nn.Module, s: int) -> torch.Tensor:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * s + r))
    return model(x).pow(2).mean()


def train(kind: str, model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None,
          averaged: bool = False) -> tuple[dict[str, int], dict[str, int]]:
    """(the optimizer's comm_stats, the process's) over ``STEPS`` steps of ``kind``: "plain" (with ``scaler`` if
    given), "clipped" (Horovod's recipe: synchronize(), clip, step() in skip_synchronize()) or "closure" (the
    loss's backward in a closure, which also allreduces the loss where ``averaged``)."""
    opt.comm_stats()
    comm_stats(reset=True)
    for s in range(STEPS):
        def closure(s: int = s) -> torch.Tensor:
            opt.zero_grad()
            loss = loss_of(model, s)
            loss.backward()
            if averaged:
                hc.allreduce(loss.detach(), name=f"loss.{s}")
            return loss

        if kind == "closure":
            opt.step(closure)
            continue
        opt.zero_grad()
        loss = loss_of(model, s)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        elif kind == "clipped":
            loss.backward()
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            with opt.skip_synchronize():
                opt.step()
        else:
            loss.backward()
            opt.step()
    return opt.comm_stats(), comm_stats(reset=True)


out: dict = {}
for op in OPS:
    for overlap in (False, True) if op not in ("Adasum", "TopK") else (False,):
        for amp in (False, True):
            scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4) if amp else None
            out[op, overlap, amp] = train("plain", *make(op, overlap, scaler), scaler)
for op in ("Average", "OneBitAdam", "PowerSGD"):
    out[op, "clipped"] = train("clipped", *make(op, True, None))
for op in OPS:  # a closure's own allreduce (the loss averaged over ranks) is not counted
    for averaged in (False, True):
        out[op, "closure", averaged] = train("closure", *make(op, True, None), averaged=averaged)
save(r, out)
