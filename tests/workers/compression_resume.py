"""Checkpoint round trip of DistributedOptimizer(SGD(momentum), compression=topk/randomk) and of
DistributedOptimizer(SGD(no momentum), compression=topk(momentum=0.9)) (DGC: the velocity is saved too): 6 steps
in one go against 3 steps, state_dict() through torch.save/torch.load (each rank its own: the error feedback is per
rank), a fresh model and optimizer, load_state_dict and 3 more steps. Saves both runs' parameters and states.

argv: out_dir
"""

import io

import torch
from common import save

import hvd_compress.torch as hc
from hvd_compress.torch.wrapping import STATE_KEY

hc.init()
r = hc.rank()
torch.set_num_threads(1)
g = torch.Generator().manual_seed(10 + r)
X, Y = torch.randn(6, 32, 20, generator=g), torch.randint(0, 5, (6, 32), generator=g)


def fresh(comp: hc.Compressor) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 40), torch.nn.ReLU(), torch.nn.Linear(40, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0 if comp.momentum else 0.9)
    return model, hc.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=comp)


def steps(model: torch.nn.Module, opt: torch.optim.Optimizer, which: range) -> None:
    for i in which:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X[i]), Y[i]).backward()
        opt.step()


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


out = {}
CASES = (("topk", hc.Compression.topk(0.05)), ("randomk", hc.Compression.randomk(0.05, seed=9)),
         ("topk_dgc", hc.Compression.topk(0.05, momentum=0.9)))
for name, comp in CASES:
    model, opt = fresh(comp)
    steps(model, opt, range(6))
    straight = (flat(model), opt.state_dict()[STATE_KEY])
    model, opt = fresh(comp)
    steps(model, opt, range(3))
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    saved = opt.state_dict()[STATE_KEY]
    model, opt = fresh(comp)
    ckpt = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    steps(model, opt, range(3, 6))
    out[name] = {"straight": straight, "resumed": (flat(model), opt.state_dict()[STATE_KEY]), "saved": saved}
save(r, out)
