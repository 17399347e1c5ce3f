"""hc.random_mask and hc.masked_allreduce on every rank; saves masks, results and the outcomes of bad calls.

argv: out_dir, numel, ratio, kind, steps. Inputs are common.rank_input with seed 50 + step (the test
re-creates them).
"""

import sys

import torch
from common import outcome, rank_input, save

import hvd_compress.torch as hc
from hvd_compress.ops import comm_stats

hc.init()
r, n = hc.rank(), hc.size()
numel, ratio, kind, steps = int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
SEED = 1234
masks, results = [], []
for t in range(1, steps + 1):
    masks.append(hc.random_mask(numel, ratio, SEED, t, kind))
    x = rank_input(r, numel, torch.float32, seed=50 + t)
    before = x.clone()
    y = hc.masked_allreduce(x, ratio, SEED, t, kind)
    assert torch.equal(x, before), "masked_allreduce changed its input"
    results.append(y)
comm_stats()  # reset
big = torch.ones(1 << 16)
hc.masked_allreduce_(big, 0.1, SEED, 1, "cyclic")
stats = comm_stats()
bad = {
    "seed": outcome(lambda: hc.masked_allreduce(torch.ones(100), 0.1, SEED + (r == n - 1), 1)),
    "numel": outcome(lambda: hc.masked_allreduce(torch.ones(100 + (r == n - 1)), 0.1, SEED, 1)),
    "step": outcome(lambda: hc.masked_allreduce(torch.ones(100), 0.1, SEED, 1 + (r == 0))),
    "ratio": outcome(lambda: hc.masked_allreduce(torch.ones(100), 0.0, SEED, 1)),
    "kind": outcome(lambda: hc.masked_allreduce(torch.ones(100), 0.1, SEED, 1, "stripes")),
}
# After the rejected calls the ranks still work together.
after = hc.masked_allreduce(torch.full((10,), float(r)), 1.0, SEED, 1)
save(r, {"masks": masks, "results": results, "bad": bad, "stats": stats, "after": after})
