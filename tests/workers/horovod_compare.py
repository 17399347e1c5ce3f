"""Under horovodrun --mpi: hc shares Horovod's world and agrees with hvd.allreduce on the same inputs, and a
Horovod training loop with ``hc.DistributedOptimizer`` (op=Average, and OneBitAdam past its freeze) trains: Average
as ``hvd.DistributedOptimizer`` does, OneBitAdam to the same parameters on every rank."""

import horovod.torch as hvd
import torch
from common import flat_parameters, rank_input, save

import hvd_compress.torch as hc

hvd.init()
out = {"hvd_rank": hvd.rank(), "hvd_size": hvd.size(), "hc_rank": hc.rank(), "hc_size": hc.size()}
for numel in (1, 1000, 65537):
    x = rank_input(hvd.rank(), numel, torch.float32, seed=numel)
    out[numel] = (hc.allreduce(x, op=hc.Average), hvd.allreduce(x, op=hvd.Average, name=f"x{numel}"))
    out[("sum", numel)] = (hc.allreduce(x, op=hc.Sum), hvd.allreduce(x, op=hvd.Sum, name=f"s{numel}"))


def train(wrap) -> torch.Tensor:
    """4 steps of a small ReLU MLP on this rank's own batches; the parameters after them, flat."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = wrap(model)
    gen = torch.Generator().manual_seed(10 + hvd.rank())
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(16, 8, generator=gen)).square().mean().backward()
        opt.step()
    return flat_parameters(model)


out["train"] = {
    "hvd": train(lambda m: hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                                    named_parameters=m.named_parameters())),
    "Average": train(lambda m: hc.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                                       m.named_parameters(), op=hc.Average)),
    "OneBitAdam": train(lambda m: hc.DistributedOptimizer(torch.optim.Adam(m.parameters(), lr=0.01),
                                                          m.named_parameters(), op=hc.OneBitAdam, freeze_step=2)),
}
save(hvd.rank(), out)
