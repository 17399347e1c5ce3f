"""Under horovodrun --mpi: hc shares Horovod's world and agrees with hvd.allreduce on the same inputs."""

import horovod.torch as hvd
import torch
from common import rank_input, save

import hvd_compress.torch as hc

hvd.init()
out = {"hvd_rank": hvd.rank(), "hvd_size": hvd.size(), "hc_rank": hc.rank(), "hc_size": hc.size()}
for numel in (1, 1000, 65537):
    x = rank_input(hvd.rank(), numel, torch.float32, seed=numel)
    out[numel] = (hc.allreduce(x, op=hc.Average), hvd.allreduce(x, op=hvd.Average, name=f"x{numel}"))
    out[("sum", numel)] = (hc.allreduce(x, op=hc.Sum), hvd.allreduce(x, op=hvd.Sum, name=f"s{numel}"))
save(hvd.rank(), out)
