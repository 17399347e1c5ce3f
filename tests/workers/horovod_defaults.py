"""A Horovod training script that spells out Horovod's DistributedOptimizer arguments at their defaults, as
Horovod's examples do, with each hvd_compress op: through hc.DistributedOptimizer and through the routed
hvd.DistributedOptimizer, it trains; a value other than the default, or an unknown option, is refused with a
message naming everything the op takes."""

import hashlib

import horovod.torch as hvd
import torch
from common import outcome, save

import hvd_compress.torch as hc

hvd.init()
r = hvd.rank()

HOROVOD_DEFAULTS = dict(compression=hvd.Compression.none, backward_passes_per_step=1, gradient_predivide_factor=1.0,
                        num_groups=0, groups=None, sparse_as_dense=False, process_set=hvd.global_process_set)
# op -> (the wrapped optimizer it takes, its own options)
OPS = {
    "Average": (lambda ps: torch.optim.SGD(ps, lr=0.05), {}),
    "Adasum": (lambda ps: torch.optim.Adam(ps, lr=0.01), {}),
    "OneBitAdam": (lambda ps: torch.optim.Adam(ps, lr=0.01), {"freeze_step": 2}),
    "OneBitLamb": (lambda ps: hc.Lamb(ps, lr=0.01), {"freeze_step": 2}),
    "SLAMB": (lambda ps: hc.Lamb(ps, lr=0.01), {"sync_interval": 2}),
    "Birder": (lambda ps: hc.Birder(ps, lr=0.001), {}),
}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def train(entry, name: str) -> list[str]:
    m = model()
    make, options = OPS[name]
    opt = entry(make(m.parameters()), named_parameters=m.named_parameters(), op=getattr(hc, name),
                **HOROVOD_DEFAULTS, **options)
    hashes = []
    for step in range(4):
        g = torch.Generator().manual_seed(100 * step + r)
        x = torch.randn(8, 6, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        if hasattr(opt, "synchronize_parameters"):
            opt.synchronize_parameters()
        flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
        hashes.append(hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    return hashes


def build(name: str, **changed) -> str:
    m = model()
    make, options = OPS[name]
    given = {**HOROVOD_DEFAULTS, **options, **changed}
    return outcome(lambda: hc.DistributedOptimizer(make(m.parameters()), m.named_parameters(), op=getattr(hc, name),
                                                   **given))


out = {"trained": {}, "refused": {}}
for name in OPS:
    out["trained"][f"hc.{name}"] = outcome(lambda name=name: out.setdefault(name, train(hc.DistributedOptimizer, name)))
    if name != "Average":  # Horovod's own runs Average; the other ops are routed to hc
        out["trained"][f"hvd.{name}"] = outcome(
            lambda name=name: out.setdefault(f"hvd.{name}", train(hvd.DistributedOptimizer, name)))
    out["refused"][f"{name} num_groups=2"] = build(name, num_groups=2)
    out["refused"][f"{name} groups=2"] = build(name, groups=2)
    out["refused"][f"{name} unknown"] = build(name, no_such_option=1)
    if name != "Average":
        out["refused"][f"{name} gradient_predivide_factor=2"] = build(name, gradient_predivide_factor=2.0)
        out["refused"][f"{name} sparse_as_dense=True"] = build(name, sparse_as_dense=True)
save(r, out)
