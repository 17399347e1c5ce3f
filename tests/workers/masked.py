"""hc.random_mask, hc.masked_allreduce and ops.masks.masked_gather_ (SLAMB's agreement and gather without the
average) on every rank; saves masks, results and the outcomes of bad calls.

argv: out_dir, numel, ratio, kind, steps. Inputs are common.rank_input with seed 50 + step (the test
re-creates them).
"""

import sys

import torch
from common import outcome, rank_input, save

import hvd_compress.torch as hc
from hvd_compress.ops import comm_stats
from hvd_compress.ops.masks import masked_gather_

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
gathers = []
for t in range(1, steps + 1):  # a range of the index space, as SLAMB's buckets: elements [3, numel - 2) of numel
    x = rank_input(r, numel, torch.float32, seed=50 + t)[3:numel - 2]
    mask_out, compact = torch.zeros(x.numel(), dtype=torch.bool), torch.full((x.numel() + 1,), -5.0)
    count = masked_gather_(x, compact, ratio, SEED, t, kind, mask_out=mask_out, check_finite=True, offset=3,
                           total=numel)
    gathers.append({"mask": mask_out, "compact": compact, "count": count,
                    "mask_only": masked_gather_(x, None, ratio, SEED, t, kind, mask_out=torch.zeros_like(mask_out),
                                                offset=3, total=numel)})


def refused_gather(x: torch.Tensor, compact: torch.Tensor, seed: int = SEED) -> str:
    """The outcome of a bad masked gather, and whether its mask and compact buffers were left as they were."""
    mask_out = torch.ones(x.numel(), dtype=torch.bool)
    kept = compact.clone()
    got = outcome(lambda: masked_gather_(x, compact, 0.5, seed, 1, mask_out=mask_out, check_finite=True))
    return f"{got} | untouched={bool(mask_out.all()) and torch.equal(compact, kept)}"


nan = torch.ones(100)
nan[17] = float("nan") if r == n - 1 else 1.0
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
    "gather_nan": refused_gather(nan, torch.zeros(100)),
    "gather_seed": refused_gather(torch.ones(100), torch.zeros(100), SEED + (r == 0)),
    "gather_room": refused_gather(torch.ones(100), torch.zeros(10)),
}
# After the rejected calls the ranks still work together.
after = hc.masked_allreduce(torch.full((10,), float(r)), 1.0, SEED, 1)
save(r, {"masks": masks, "results": results, "gathers": gathers, "bad": bad, "stats": stats, "after": after})
