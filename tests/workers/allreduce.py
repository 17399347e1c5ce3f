"""Every (op, dtype, size) of hc.allreduce/allreduce_; saves inputs and outputs as float64."""

import sys

import torch
from common import DTYPES, rank_input, save

import hvd_compress.torch as hc

hc.init()
r = hc.rank()
sizes = [int(s) for s in sys.argv[2].split(",")]
results = {}
for op in (hc.Sum, hc.Average):
    for dname, dtype in DTYPES.items():
        for numel in sizes:
            x = rank_input(r, numel, dtype, seed=numel)
            y = hc.allreduce(x, op=op, name=f"{op.name}.{dname}.{numel}")
            assert y.dtype == dtype and y.shape == x.shape
            z = x.clone()
            ret = hc.allreduce_(z, op=op)
            assert ret is z
            results[(op.name, dname, numel)] = (x.double(), y.double(), z.double())
# A non-contiguous tensor reduced in place keeps its layout.
base = rank_input(r, 64, torch.float32, seed=7).view(8, 8)
orig = base.clone()
t = base.t()
hc.allreduce_(t, op=hc.Sum)
results["noncontig"] = (orig.double(), t.double())
save(r, {"results": results, "size": hc.size(), "stats": hc.comm_stats()})
