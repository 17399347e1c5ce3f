"""A hierarchical Birder step on nodes of unequal size (world 3, HVDC_LOCAL_SIZE=2): outcome per rank."""

import torch
from common import outcome, save

import hvd_compress.torch as hc

hc.init()
torch.manual_seed(0)
net = torch.nn.Linear(5, 2)
opt = hc.DistributedOptimizer(hc.Birder(net.parameters()), op=hc.Birder, hierarchical=True)
net(torch.randn(3, 5)).sum().backward()
before = [p.detach().clone() for p in net.parameters()]
result = {"outcome": outcome(opt.step)}
same = all(torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))
result["unchanged"] = same and opt.birder_step == 0
save(hc.rank(), result)
