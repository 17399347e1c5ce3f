"""1-bit Adam's and 1-bit LAMB's warm-up (paper 003 / 001 Algorithm 1 line 2: the dense rule) against the wrapped
optimizer's own step behind op=Average, on the same model, data and ranks: a small BatchNorm CNN with layers whose
sizes are no multiple of 8, every parameter after every step of both runs.

argv: out_dir steps
Cases: torch.optim.Adam (weight_decay 0 and 0.01, an L2 term) and AdamW (0.01) under op=OneBitAdam; hc.Lamb
(weight_decay 0 and 0.01, bias correction on and off) under op=OneBitLamb; freeze_step past the last step.
"""

import sys

import torch
from common import save

import hvd_compress.torch as hc

steps = int(sys.argv[2])
hc.init()
r = hc.rank()
torch.set_num_threads(1)
CASES = {
    "Adam": (torch.optim.Adam, {"lr": 1e-3}, hc.OneBitAdam),
    "Adam_l2": (torch.optim.Adam, {"lr": 1e-3, "weight_decay": 0.01}, hc.OneBitAdam),
    "AdamW": (torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.01}, hc.OneBitAdam),
    "Lamb": (hc.Lamb, {"lr": 1e-2}, hc.OneBitLamb),
    "Lamb_wd_uncorrected": (hc.Lamb, {"lr": 1e-2, "weight_decay": 0.01, "bias_correction": False}, hc.OneBitLamb),
}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 6, 3), torch.nn.BatchNorm2d(6), torch.nn.ReLU(),
                               torch.nn.Conv2d(6, 5, 3), torch.nn.BatchNorm2d(5), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(5 * 4 * 4, 11), torch.nn.ReLU(), torch.nn.Linear(11, 3))


def run(cls: type, kwargs: dict, op: object) -> list[torch.Tensor]:
    net = model()
    options = {"freeze_step": steps + 5} if op is not hc.Average else {}
    opt = hc.DistributedOptimizer(cls(net.parameters(), **kwargs), net.named_parameters(), op=op, **options)
    data = torch.Generator().manual_seed(10 + r)
    out = []
    for _ in range(steps):
        x, y = torch.randn(8, 1, 8, 8, generator=data), torch.randint(3, (8,), generator=data)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        out.append(torch.cat([p.detach().reshape(-1).clone() for p in net.parameters()]))
    return out


result = {}
for name, (cls, kwargs, op) in CASES.items():
    result[name] = {"dense": run(cls, kwargs, hc.Average), "warmup": run(cls, kwargs, op)}
save(r, result)
