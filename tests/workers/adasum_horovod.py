"""hvd.init(), then the same inputs through Horovod's Adasum and hvd_compress's; saves both."""

import horovod.torch as hvd
import torch
from common import rank_input, save

import hvd_compress.torch as hc
from hvd_compress.torch.grouped import grouped_allreduce

hvd.init()
r = hvd.rank()
out = {}
for dtype in (torch.float32, torch.float64):
    for numel in (1, 7, 4097, 1 << 16):
        x = rank_input(r, numel, dtype, seed=numel)
        theirs = hvd.allreduce(x, op=hvd.Adasum, name=f"hvd.{dtype}.{numel}")
        ours = hc.allreduce(x, op=hc.Adasum, name=f"hc.{dtype}.{numel}")
        out[(str(dtype), numel)] = (ours, theirs)
    xs = [rank_input(r, k, dtype, seed=200 + k) for k in (3, 1000, 17)]
    theirs = hvd.grouped_allreduce(xs, op=hvd.Adasum, name=f"hvd.group.{dtype}")
    ours = grouped_allreduce(xs, op=hc.Adasum)
    out[(str(dtype), "grouped")] = (torch.cat(ours), torch.cat(theirs))
save(r, out)
