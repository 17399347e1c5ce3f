"""hc.DistributedOptimizer(hc.Birder(...), op=hc.Birder) on a small MLP: parameters after every step,
exact resume from a mid-run state_dict, a NaN gradient on the last rank, refused checkpoints, bytes per
step; and op=hc.OneBitAdam with hierarchical=True (identical parameters, bytes). Saves one dict per rank.

argv: out_dir, hierarchical (0/1).
"""

import copy
import sys

import torch
from common import outcome, save

import hvd_compress.torch as hc
from hvd_compress import ops
from hvd_compress.ops import hierarchical_onebit

hc.init()
r, n = hc.rank(), hc.size()
hierarchical = sys.argv[2] == "1"
STEPS, RESUME_AT = 6, 3


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(8, 10, generator=g), torch.randint(0, 3, (8,), generator=g)


def train(net: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> list[torch.Tensor]:
    out = []
    for t in steps:
        x, y = batch(t)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        out.append(torch.cat([p.detach().flatten() for p in net.parameters()]).clone())
    return out


def wrapped(net: torch.nn.Module) -> torch.optim.Optimizer:
    return hc.DistributedOptimizer(hc.Birder(net.parameters(), lr=0.01, weight_decay=0.01),
                                   named_parameters=net.named_parameters(), op=hc.Birder,
                                   hierarchical=hierarchical, seed=7)


result = {}
net = model()
opt = wrapped(net)
params = train(net, opt, range(RESUME_AT))
ckpt = copy.deepcopy(opt.state_dict())
opt.comm_stats()
params += train(net, opt, range(RESUME_AT, STEPS))
result["params"] = params
result["bytes_per_step"] = opt.comm_stats()["bytes_sent"] / (STEPS - RESUME_AT)
result["numel"] = sum(p.numel() for p in net.parameters())

# exact resume: a fresh model and optimizer loaded from the mid-run checkpoint
net2 = model()
with torch.no_grad():
    flat = params[RESUME_AT - 1].split([p.numel() for p in net2.parameters()])
    for p, q in zip(net2.parameters(), flat, strict=True):
        p.copy_(q.view_as(p))
opt2 = wrapped(net2)
opt2.load_state_dict(ckpt)
result["resumed"] = train(net2, opt2, range(RESUME_AT, STEPS))

# a NaN gradient on the last rank: every rank raises, nothing changes
before = copy.deepcopy(opt.state_dict())
x, y = batch(99)
opt.zero_grad()
# The NaN enters through a gradient hook, before the bucket's core call starts (with overlap, the default, it starts
# from the hook: a .grad edited after backward would not reach it).
first = next(net.parameters())
handle = first.register_hook(lambda g: g.index_fill(0, torch.tensor([0]), float("nan"))) if r == n - 1 else None
torch.nn.functional.cross_entropy(net(x), y).backward()
if handle is not None:
    handle.remove()
p_before = torch.cat([p.detach().flatten() for p in net.parameters()]).clone()
result["nan"] = outcome(opt.step)
after = opt.state_dict()
same = all(torch.equal(a, b) for a, b in zip(  # noqa: B905
    [before["hvd_compress"]["buckets"][0][k] for k in ("m", "b", "worker_error", "server_error")],
    [after["hvd_compress"]["buckets"][0][k] for k in ("m", "b", "worker_error", "server_error")]))
now = torch.cat([p.detach().flatten() for p in net.parameters()])
result["nan_state_unchanged"] = same and torch.equal(p_before, now)
result["nan_step_unchanged"] = after["hvd_compress"]["step"] == before["hvd_compress"]["step"]

# refused checkpoints
other = copy.deepcopy(ckpt)
other["hvd_compress"]["algorithm"] = "OneBitAdam"
result["other_algorithm"] = outcome(lambda: opt.load_state_dict(other))
other = copy.deepcopy(ckpt)
other["hvd_compress"]["world_size"] = n + 1
result["other_world"] = outcome(lambda: (opt.load_state_dict(other), opt.step()))  # refused by the step
result["state_after_refusals"] = torch.equal(opt.state_dict()["hvd_compress"]["buckets"][0]["m"],
                                             after["hvd_compress"]["buckets"][0]["m"])

# dense bytes per step for the same model
net3 = model()
dense = hc.DistributedOptimizer(torch.optim.Adam(net3.parameters()), named_parameters=net3.named_parameters(),
                                op=hc.Average)
train(net3, dense, range(1))
dense.comm_stats()
train(net3, dense, range(1, 3))
result["dense_bytes_per_step"] = dense.comm_stats()["bytes_sent"] / 2

# bytes of one call on 2^18 float32s: Birder's +/-1 allreduce vs the dense allreduce

d = 1 << 18
c1, c2 = hierarchical_onebit.state_numels(d, hierarchical)
sign, dense_t = ops.Traffic(), ops.Traffic()
hierarchical_onebit.hierarchical_compressed_allreduce_(torch.randn(d), torch.zeros(c1), torch.zeros(c2),
                                              hierarchical=hierarchical, traffic=sign)
ops.allreduce_(torch.randn(d), op=hc.Average, traffic=dense_t)
result["call_bytes"] = (sign.snapshot()["bytes_sent"], dense_t.snapshot()["bytes_sent"])

# 1-bit Adam through the hierarchical all-reduce (scaled payload)
net4 = model()
ob = hc.DistributedOptimizer(torch.optim.Adam(net4.parameters(), lr=0.01), named_parameters=net4.named_parameters(),
                             op=hc.OneBitAdam, freeze_step=2, hierarchical=hierarchical)
result["onebit_params"] = train(net4, ob, range(5))
save(r, result)
