"""hc.DistributedOptimizer(op=Average/Sum) training a small model; saves per-step parameter hashes."""

import hashlib
import sys

import torch
from common import save

import hvd_compress.torch as hc

op = {"Average": hc.Average, "Sum": hc.Sum}[sys.argv[2]]
steps = int(sys.argv[3])
passes = int(sys.argv[4])
hc.init()
r = hc.rank()


def make_model() -> torch.nn.Module:
    torch.manual_seed(1234 + r)  # different on purpose: broadcast_parameters must fix it
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def batch(step: int, rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100_000 * step + 100 * rank + micro)
    x = torch.randn(5, 6, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


model = make_model()
hc.broadcast_parameters(model.state_dict(), root_rank=0)
init_params = [p.detach().clone() for p in model.parameters()]
base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
opt = hc.DistributedOptimizer(
    base, named_parameters=model.named_parameters(), op=op, backward_passes_per_step=passes
)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
assert isinstance(opt, torch.optim.SGD)
hashes, losses = [], []
for step in range(steps):
    opt.zero_grad()
    for micro in range(passes):
        x, y = batch(step, r, micro)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
    opt.step()
    sched.step()
    losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    hashes.append(hashlib.sha256(flat.numpy().tobytes()).hexdigest())
# Calling backward too often before step() is refused.
try:
    for micro in range(passes + 1):
        x, y = batch(0, r, micro)
        torch.nn.functional.mse_loss(model(x), y).backward()
    too_many = "no error"
except RuntimeError as e:
    too_many = str(e)
save(
    r,
    {
        "init": init_params,
        "final": [p.detach().clone() for p in model.parameters()],
        "hashes": hashes,
        "losses": losses,
        "lr": opt.param_groups[0]["lr"],
        "stats": opt.comm_stats(),
        "too_many": too_many,
        "state_keys": sorted(opt.state_dict().keys()),
    },
)
