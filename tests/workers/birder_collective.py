"""Consecutive hierarchical_compressed_allreduce_ calls (Birder's +/-1 payload) on every size; saves each.

argv: out_dir, comma-separated sizes, steps, draws ("injected": uniforms from NumPy's generator seeded by
(size, step), which the test re-creates; "philox": the core's own), hierarchical (0/1), moments (0/1).
Inputs: common.rank_input(rank, size, float32, seed=100 * step + 7). Also the bytes of the last call.
"""

import sys

import numpy as np
import torch
from common import rank_input, save

import hvd_compress.torch as hc
from hvd_compress.ops import hierarchical_onebit

SEED = 1234

hc.init()
r = hc.rank()
sizes = [int(s) for s in sys.argv[2].split(",")]
steps, draws = int(sys.argv[3]), sys.argv[4]
hierarchical, with_moments = sys.argv[5] == "1", sys.argv[6] == "1"
n_nodes = hc.size() // hierarchical_onebit.node_size(hierarchical)


def injected(numel: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    dpad = hierarchical_onebit.padded_numel(numel, hc.size())
    rng = np.random.default_rng([numel, step])
    uw = rng.random((n_nodes, dpad), dtype=np.float32)
    return torch.from_numpy(uw), torch.from_numpy(rng.random(dpad, dtype=np.float32))


results = {}
for numel in sizes:
    c1, c2 = hierarchical_onebit.state_numels(numel, hierarchical)
    werr, serr = torch.zeros(c1), torch.zeros(c2)
    moments = (torch.zeros(c1), torch.zeros(c1)) if with_moments else None
    calls = []
    for step in range(steps):
        x = rank_input(r, numel, torch.float32, seed=100 * step + 7)
        traffic = hc.ops.Traffic() if hasattr(hc, "ops") else None
        hierarchical_onebit.hierarchical_compressed_allreduce_(
            x, werr, serr, hierarchical=hierarchical, seed=SEED, step=step, moments=moments,
            uniforms=injected(numel, step) if draws == "injected" else None,
        )
        calls.append({
            "u": x.clone(), "werr": werr.clone(), "serr": serr.clone(),
            "m": moments[0].clone() if moments else None, "b": moments[1].clone() if moments else None,
        })
    results[numel] = calls
save(r, {"results": results, "node_size": hierarchical_onebit.node_size(hierarchical)})
