"""The wrapped optimizer of every op is one subclass of the user's optimizer class holding one engine: what its class
and instance add, that LR schedulers and state_dict() still work, and that dropping it frees the engine.

argv: out_dir
"""

from __future__ import annotations

import gc
import weakref

import torch
from common import save

import hvd_compress.torch as hc
from hvd_compress.torch.wrapping import COMMON

hc.init()
r = hc.rank()

CASES = {
    "Average": (lambda ps: torch.optim.SGD(ps, lr=0.1), {}),
    "Sum": (lambda ps: torch.optim.SGD(ps, lr=0.1), {}),
    "Adasum": (lambda ps: torch.optim.Adam(ps, lr=0.01), {}),
    "OneBitAdam": (lambda ps: torch.optim.Adam(ps, lr=0.01), {"freeze_step": 1}),
    "OneBitLamb": (lambda ps: hc.Lamb(ps, lr=0.01), {"freeze_step": 1}),
    "SLAMB": (lambda ps: hc.Lamb(ps, lr=0.01), {}),
    "Birder": (lambda ps: hc.Birder(ps, lr=0.01), {}),
}

out: dict = {}
for name, (make, options) in CASES.items():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 1))
    plain = make(model.parameters())
    own_attributes = set(vars(plain))
    opt = hc.DistributedOptimizer(plain, model.named_parameters(), op=getattr(hc, name), **options)
    added = sorted(set(vars(opt)) - own_attributes)  # before the scheduler wraps opt.step on the instance
    lr0 = opt.param_groups[0]["lr"]
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    g = torch.Generator().manual_seed(10 + r)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(torch.randn(8, 5, generator=g)), torch.randn(8, 1, generator=g)).backward()
        opt.step()
        scheduler.step()
    again = hc.DistributedOptimizer(make(model.parameters()), model.named_parameters(), op=getattr(hc, name), **options)
    again.load_state_dict(opt.state_dict())
    engine = opt._hvdc
    out[name] = {
        "class_names": sorted(n for n in vars(type(opt)) if n not in ("__module__", "__doc__")),
        "allowed": sorted({*COMMON, *type(engine).exports, "_step_supports_amp_scaling"}),
        "instance_names": added,
        "lr0": lr0,
        "is_user_class": isinstance(opt, type(plain)) and type(opt).__name__ == type(plain).__name__,
        "bases": [b.__name__ for b in type(opt).__bases__],
        "lr": opt.param_groups[0]["lr"],
        "reloaded_lr": again.param_groups[0]["lr"],
        "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
    }
    # Nothing but the optimizer holds the engine (the hooks hold it weakly): dropping the optimizer frees it at once.
    del scheduler  # it holds the optimizer's step in a cycle of its own
    gc.collect()
    gc.disable()
    ref = weakref.ref(engine)
    del engine, opt
    out[name]["engine_freed"] = ref() is None
    gc.enable()
    del again
save(r, out)
