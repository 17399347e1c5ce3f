"""hc.DistributedOptimizer(torch.optim.SGD(...), op=hc.SignSGD) on a small MLP: each rank's gradients and the
parameters after every step (the test replays them through the NumPy reference), exact resume from a mid-run
state_dict, a run whose lr is set before each step to ``SCHEDULE`` (through 0, restored, dropped 10x), a NaN
gradient on the last rank, bad options and refused checkpoints. Saves one dict per rank.

argv: out_dir, overlap (0/1), bucket_mb.
"""

import copy
import sys

import torch
from common import outcome, save

import hvd_compress.torch as hc

hc.init()
r, n = hc.rank(), hc.size()
overlap, bucket_mb = sys.argv[2] == "1", float(sys.argv[3])
STEPS, RESUME_AT, LR = 6, 3, 0.05
SCHEDULE = [LR, LR, 0.0, 0.0, LR, LR / 10, LR / 10]  # the lr of each step of the scheduled run


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(8, 10, generator=g), torch.randint(0, 3, (8,), generator=g)


def flat(net: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().flatten().clone() for p in net.parameters()]


def train(net: torch.nn.Module, opt: torch.optim.Optimizer, steps: range, lrs=None) -> tuple[list, list]:
    params, grads = [], []
    for t in steps:
        if lrs is not None:
            for group in opt.param_groups:
                group["lr"] = lrs[t]
        x, y = batch(t)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        grads.append([p.grad.detach().flatten().clone() for p in net.parameters()])
        opt.step()
        params.append(flat(net))
    return params, grads


def wrapped(net: torch.nn.Module, **options) -> torch.optim.Optimizer:
    return hc.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=LR), named_parameters=net.named_parameters(),
                                   op=hc.SignSGD, overlap=overlap, bucket_mb=bucket_mb, **options)


result = {"initial": flat(model())}
net = model()
opt = wrapped(net)
result["buckets"] = opt.bucket_count
params, grads = train(net, opt, range(RESUME_AT))
ckpt = copy.deepcopy(opt.state_dict())
more, more_grads = train(net, opt, range(RESUME_AT, STEPS))
result["params"], result["grads"] = params + more, grads + more_grads

net2 = model()
opt2 = wrapped(net2)
opt2.load_state_dict(ckpt)
with torch.no_grad():
    for p, q in zip(net2.parameters(), result["params"][RESUME_AT - 1], strict=True):
        p.copy_(q.view_as(p))
result["resumed"], _ = train(net2, opt2, range(RESUME_AT, STEPS))
# A checkpoint without error_lr keeps its errors (taken to be in the next step's lr): the same resume
unrecorded = copy.deepcopy(ckpt)
for saved in unrecorded["hvd_compress"]["buckets"]:
    del saved["error_lr"]
net2 = model()
opt2 = wrapped(net2)
opt2.load_state_dict(unrecorded)
with torch.no_grad():
    for p, q in zip(net2.parameters(), result["params"][RESUME_AT - 1], strict=True):
        p.copy_(q.view_as(p))
result["resumed_unrecorded"], _ = train(net2, opt2, range(RESUME_AT, STEPS))
bad = copy.deepcopy(ckpt)
bad["hvd_compress"]["buckets"][0]["error_lr"] = "0.05"
result["bad_error_lr"] = outcome(lambda: wrapped(model()).load_state_dict(bad))

net3 = model()
result["scheduled"], result["scheduled_grads"] = train(net3, wrapped(net3), range(len(SCHEDULE)), SCHEDULE)
result["schedule"] = SCHEDULE

# A NaN gradient on the last rank: every rank raises, nothing changes.
before_state = copy.deepcopy(opt.state_dict())
before = flat(net)
x, y = batch(99)
if r == n - 1:  # in the input, so backward makes the NaN gradient (with overlap, .grad is read during backward)
    x[0, 0] = float("nan")
opt.zero_grad()
torch.nn.functional.cross_entropy(net(x), y).backward()
result["nan"] = outcome(opt.step)
after_state = opt.state_dict()["hvd_compress"]
result["nan_state_unchanged"] = all(
    torch.equal(a["error"], b["error"])
    for a, b in zip(before_state["hvd_compress"]["buckets"], after_state["buckets"], strict=True)
) and after_state["step"] == before_state["hvd_compress"]["step"]
result["nan_params_unchanged"] = all(torch.equal(a, b) for a, b in zip(before, flat(net), strict=True))

# Bad options and a bad wrapped optimizer: every rank raises before anything is set up.
result["unknown_option"] = outcome(lambda: wrapped(model(), seed=3))
result["momentum"] = outcome(lambda: hc.DistributedOptimizer(
    torch.optim.SGD(model().parameters(), lr=0.1, momentum=0.9), op=hc.SignSGD).step())
result["not_sgd"] = outcome(lambda: hc.DistributedOptimizer(torch.optim.Adam(model().parameters()), op=hc.SignSGD))
other = copy.deepcopy(ckpt)
other["hvd_compress"]["algorithm"] = "Birder"
result["other_algorithm"] = outcome(lambda: wrapped(model()).load_state_dict(other))
other = copy.deepcopy(ckpt)
other["hvd_compress"]["world_size"] = n + 1


def refused_by_step(opt, state) -> None:
    """A load at another world size is refused on every rank by the broadcast or step that follows it."""
    opt.load_state_dict(state)
    opt.step()


result["other_world"] = outcome(lambda: refused_by_step(wrapped(model()), other))
save(r, result)
