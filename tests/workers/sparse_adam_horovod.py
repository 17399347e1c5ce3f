"""Under mpirun, after hvd.init(): an nn.Embedding(sparse=True) trained by torch.optim.SparseAdam in a plain loop
(zero_grad, backward, step), wrapped once by Horovod's DistributedOptimizer and once by hc's, with and without
sparse_as_dense; each rank saves the final weights of every run."""

import horovod.torch as hvd
import torch
from common import outcome, save

import hvd_compress.torch as hc

hvd.init()


def train(wrap, sparse_as_dense: bool) -> torch.Tensor:
    torch.manual_seed(7)
    emb = torch.nn.Embedding(20, 4, sparse=True)
    opt = wrap(torch.optim.SparseAdam(emb.parameters(), lr=0.05), named_parameters=emb.named_parameters(),
               sparse_as_dense=sparse_as_dense)
    for step in range(5):
        idx = torch.randint(0, 20, (6,), generator=torch.Generator().manual_seed(100 * step + hvd.rank()))
        opt.zero_grad()
        (emb(idx).pow(2).sum() - emb(idx).sum()).backward()
        opt.step()
    return emb.weight.detach().clone()


out = {}
for sad in (False, True):
    out[("hvd", sad)] = train(hvd.DistributedOptimizer, sad)
    got: dict = {}
    out[("hc_error", sad)] = outcome(lambda sad=sad, got=got: got.setdefault("w", train(hc.DistributedOptimizer, sad)))
    out[("hc", sad)] = got.get("w")
save(hvd.rank(), out)
