"""Consecutive hc.compressed_allreduce calls with one OneBitState per (dtype, size); saves every call.

argv: out_dir, comma-separated sizes, comma-separated dtypes, steps. Inputs are common.rank_input with
seed 100 * step + 1 (the test re-creates them). Also: the error-feedback run ("converge": a fixed
per-rank direction plus noise, 40 steps) and the bytes on the wire of one large float32 call.
"""

import sys

import torch
from common import DTYPES, rank_input, save

import hvd_compress.torch as hc
from hvd_compress.ops import comm_stats
from hvd_compress.ops.runtime import kernel_isa
from hvd_compress.torch.onebit import OneBitState, compressed_allreduce

hc.init()
r = hc.rank()
sizes = [int(s) for s in sys.argv[2].split(",")]
dtypes = sys.argv[3].split(",")
steps = int(sys.argv[4])
results = {}
for dname in dtypes:
    dtype = DTYPES[dname]
    for numel in sizes:
        state = OneBitState(numel, dtype)
        calls = []
        for step in range(steps):
            x = rank_input(r, numel, dtype, seed=100 * step + 1)
            before = x.clone()
            y = compressed_allreduce(x, state, name=f"c.{dname}.{numel}")
            assert torch.equal(x, before), "compressed_allreduce changed its input"
            assert y.dtype == dtype and y.shape == x.shape
            calls.append((y.clone(), state.worker_error.clone(), state.server_error.clone()))
        results[(dname, numel)] = calls

# Error feedback: the same direction every step, so the running sum of results must track the
# running sum of the true averages.
numel = 4099
state = OneBitState(numel)
g = torch.Generator().manual_seed(r)
direction = torch.randn(numel, generator=g) * (1 + r)
converge = []
for _step in range(40):
    x = direction + 0.3 * torch.randn(numel, generator=g)
    y = compressed_allreduce(x, state, name="converge")
    converge.append((x.clone(), y.clone()))
final_errors = (state.worker_error.clone(), state.server_error.clone())

# Bytes of one large call (signature exchange included).
big = 1 << 20
state = OneBitState(big)
x = rank_input(r, big, torch.float32, seed=3)
comm_stats(reset=True)
compressed_allreduce(x, state, name="bytes")
stats = comm_stats(reset=True)

save(r, {"results": results, "converge": converge, "final_errors": final_errors, "stats": stats,
         "size": hc.size(), "isa": kernel_isa()})
