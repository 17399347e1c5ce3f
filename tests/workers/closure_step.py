"""``opt.step(closure)`` against ``closure(); opt.step()``: 4 steps of a small MLP, each rank on its own batches.

argv: out_dir cases (comma list of op[:nooverlap], op a name of ``hc``)
Saves per rank, per case and mode ("plain", "closure"): (SHA-256 of the parameters, the losses ``step`` returned)
or the error raised.
"""

from __future__ import annotations

import hashlib
import sys

import horovod.torch as hvd
import torch
from common import save

import hvd_compress.torch as hc

hvd.init()
torch.set_num_threads(1)
rank = hvd.rank()
OPTIONS = {"OneBitAdam": {"freeze_step": 2}, "PowerSGD": {"start_powerSGD_iter": 2, "min_compression_rate": 1}}


def run(case: str, mode: str) -> tuple[str, list[float | None]]:
    op, _, flag = case.partition(":")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = hc.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), model.named_parameters(),
                                  op=getattr(hc, op), **OPTIONS.get(op, {}),
                                  **({"overlap": False} if flag == "nooverlap" else {}))
    gen = torch.Generator().manual_seed(10 + rank)
    returned = []
    for _ in range(4):
        x = torch.randn(32, 8, generator=gen)

        def closure(x: torch.Tensor = x) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            return loss

        if mode == "closure":
            out = opt.step(closure)
            returned.append(None if out is None else float(out))
        else:
            closure()
            opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest(), returned


out = {}
for case in sys.argv[2].split(","):
    for mode in ("plain", "closure"):
        try:
            out[(case, mode)] = run(case, mode)
        except Exception as e:
            out[(case, mode)] = f"{type(e).__name__}: {e}"
save(rank, out)
