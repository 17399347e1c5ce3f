"""Horovod's clipping pattern (``opt.synchronize()``, ``clip_grad_norm_``, ``with opt.skip_synchronize():
opt.step()``) with each compressed op, overlap on and off, against no clipping.

argv: out_dir ops (comma list of OneBitAdam, OneBitLamb, Birder, SLAMB, Adasum)
Saves per rank, per (op, mode): the SHA-256 of the parameters after the run, or the error raised; mode is
``plain`` (no clipping), ``clip`` (the pattern, overlap on), ``clip_nooverlap`` (the pattern, overlap=False) and,
with overlap on, ``clip_one_rank`` (only rank 0 clips, from step 3: every rank must still agree on what to do).
"""

from __future__ import annotations

import hashlib
import sys

import horovod.torch as hvd
import torch
from common import outcome, save, small_wrapped

import hvd_compress.torch  # noqa: F401  (before hvd.init(), as a user script imports it)

hvd.init()
torch.set_num_threads(1)
rank = hvd.rank()
OPTIONS = {"OneBitAdam": {"freeze_step": 2}, "OneBitLamb": {"freeze_step": 2}, "Birder": {},
           "SLAMB": {"compress_ratio": 0.5, "sync_interval": 3, "seed": 1}, "Adasum": {}}
STEPS = 6


def run(op: str, mode: str) -> str:
    overlap = {} if op == "Adasum" else {"overlap": mode != "clip_nooverlap"}  # Adasum: always per-parameter hooks
    model, opt = small_wrapped(op, **overlap, **OPTIONS[op])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(10 + rank)
    for t in range(1, STEPS + 1):
        x = torch.randn(32, 8, generator=g) * 5
        y = torch.randint(0, 2, (32,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if mode == "plain":
            opt.step()
            continue
        opt.synchronize()
        # One rank alone: past the 1-bit warm-up, where synchronize() averages and a clip of the average on one
        # rank would be the script's own divergence (as with Horovod).
        if mode != "clip_one_rank" or (rank == 0 and t > 2):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        with opt.skip_synchronize():
            opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


out = {}
for op in sys.argv[2].split(","):
    for mode in ("plain", "clip", "clip_one_rank") if op == "Adasum" else ("plain", "clip", "clip_nooverlap",
                                                                          "clip_one_rank"):
        result = {}
        err = outcome(lambda op=op, mode=mode, result=result: result.setdefault("hash", run(op, mode)))
        out[(op, mode)] = result.get("hash") or err
save(rank, out)
