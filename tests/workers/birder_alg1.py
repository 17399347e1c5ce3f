"""hc.DistributedOptimizer(hc.Birder(...), op=hc.Birder) for 8 steps on three parameters (300, 7 and 1000
elements, lr 0.01, seed 5), every rank's gradients drawn from seeds the test re-creates
(tests/test_birder_optimizer.py::_alg1_grads); saves the flat parameters before and after every step.

argv: out_dir hierarchical (0/1) [bucket_mb (default: one bucket)]; saves the bucket sizes too.
"""

import sys

import torch
from common import save

import hvd_compress.torch as hc

SIZES, STEPS, LR, SEED = (300, 7, 1000), 8, 0.01, 5

hc.init()
rank, size = hc.rank(), hc.size()
torch.manual_seed(0)
params = [torch.nn.Parameter(torch.randn(s)) for s in SIZES]
opt = hc.DistributedOptimizer(hc.Birder(params, lr=LR), named_parameters=[(f"p{i}", p) for i, p in enumerate(params)],
                              op=hc.Birder, seed=SEED, hierarchical=sys.argv[2] == "1",
                              **({"bucket_mb": float(sys.argv[3])} if len(sys.argv) > 3 else {}))
flat = [torch.cat([p.detach().reshape(-1) for p in params]).clone()]
for t in range(1, STEPS + 1):
    g = torch.randn(sum(SIZES), generator=torch.Generator().manual_seed(1000 * t + rank))
    for p, part in zip(params, g.split(SIZES), strict=True):
        p.grad = part.reshape(p.shape).clone()
    opt.step()
    flat.append(torch.cat([p.detach().reshape(-1) for p in params]).clone())
save(rank, {"params": flat, "buckets": [seg["sizes"] for seg in opt.state_dict()["hvd_compress"]["buckets"]]})
