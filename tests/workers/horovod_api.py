"""Horovod API pieces on hc: prescale/postscale, average=, out-of-place broadcast, *_async with poll and
synchronize(handle), set_backward_passes_per_step, gradient_predivide_factor. argv: out_dir mode (hc|hvd)."""

import sys

import horovod.torch as hvd
import torch
from common import outcome, rank_input, save

import hvd_compress.torch as hc

if sys.argv[2] == "hvd":
    hvd.init()
else:
    hc.init()
r, n = hc.rank(), hc.size()
x = rank_input(r, 11, torch.float32, seed=1)
out = {"x": x.clone()}
out["scaled_sum"] = hc.allreduce(x, op=hc.Sum, prescale_factor=2.0, postscale_factor=0.25)
out["average_false"] = hc.allreduce(x, average=False)
out["both"] = outcome(lambda: hc.allreduce(x, op=hc.Sum, average=True))
y = hc.broadcast(x, root_rank=n - 1)
out["broadcast"] = (x.clone(), y)

# Asynchronous: submitted together, finished in order, same values as the synchronous calls.
z = x.clone()
a, b = rank_input(r, 5, torch.float32, seed=2), rank_input(r, 3, torch.float64, seed=3)
handles = [hc.allreduce_async(x, op=hc.Sum), hc.allreduce_async_(z), hc.grouped_allreduce_async([a, b]),
           hc.broadcast_async(x, root_rank=0)]
results = [hc.synchronize(h) for h in handles]
out["async"] = {"sum": results[0], "inplace": (results[1] is z, z), "grouped": results[2], "bcast": results[3],
                "polled": all(hc.poll(h) for h in handles), "a": a, "b": b}
bad = hc.allreduce_async(torch.ones(2, 3) if r == 0 else torch.ones(3, 2))
out["async_error"] = outcome(lambda: hc.synchronize(bad))
out["after_error"] = hc.synchronize(hc.allreduce_async(torch.full((2,), float(r)), op=hc.Sum))


def grads_of(model: torch.nn.Module, step: int, micro: int) -> None:
    g = torch.Generator().manual_seed(1000 * step + 10 * r + micro)
    inp = torch.randn(4, 6, generator=g)
    torch.nn.functional.mse_loss(model(inp), inp.sum(1, keepdim=True)).backward()


# set_backward_passes_per_step: 2 passes per step from now on, a third one is refused.
torch.manual_seed(0)
model = torch.nn.Linear(6, 1)
opt = hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
opt.set_backward_passes_per_step(2)
start = [p.detach().clone() for p in model.parameters()]
opt.zero_grad()
grads_of(model, 0, 0)
grads_of(model, 0, 1)
opt.step()
out["passes"] = {"start": start, "final": [p.detach().clone() for p in model.parameters()]}
opt.zero_grad()
out["third_pass"] = outcome(lambda: [grads_of(model, 1, m) for m in range(3)])
out["bad_passes"] = outcome(lambda: opt.set_backward_passes_per_step(0))

# gradient_predivide_factor: the same average as plain Average; only with op=Average.
for label, kwargs in (("plain", {}), ("predivide", {"gradient_predivide_factor": 4.0})):
    torch.manual_seed(0)
    m = torch.nn.Linear(6, 1)
    o = hc.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), **kwargs)
    o.zero_grad()
    grads_of(m, 5, 0)
    o.step()
    out[label] = [p.detach().clone() for p in m.parameters()]
out["predivide_sum"] = outcome(lambda: hc.DistributedOptimizer(
    torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), op=hc.Sum, gradient_predivide_factor=2.0))
save(r, out)
