"""Horovod's clipping pattern (``opt.synchronize()``, ``clip_grad_norm_``, ``with opt.skip_synchronize():
opt.step()``) and DDP's (``backward()``, ``clip_grad_norm_``, ``step()``) with each compressed op, overlap on and
off, against no clipping.

argv: out_dir ops (comma list of OneBitAdam, OneBitLamb, Birder, SLAMB, ZeroOneAdam, Adasum)
Saves per rank, per (op, mode): the SHA-256 of the parameters after the run, or the error raised; mode is
``plain`` (no clipping), ``clip`` (the pattern, overlap on), ``clip_nooverlap`` (the pattern, overlap=False),
``clip_ddp`` (DDP's, overlap on) and, with overlap on, ``clip_one_rank`` and ``clip_ddp_one_rank`` (only rank 0
clips, from step 3: every rank must still agree on what to do). For 1-bit Adam in its warm-up also
``held_back_ddp`` and ``held_back_pattern``: three steps of a model whose middle layer gets no gradient, in 1 KiB
buckets, clipped DDP's way and Horovod's; ``after_backward``: (this rank's own gradient, ``.grad`` as
``backward()`` returned it) of one warm-up step of a 1M-parameter MLP, whose buckets are still on the wire when
backward's last hook has run.
"""

from __future__ import annotations

import hashlib
import sys

import horovod.torch as hvd
import torch
from common import UnusedMiddle, outcome, save, small_wrapped

import hvd_compress.torch  # before hvd.init(), as a user script imports it

hvd.init()
torch.set_num_threads(1)
rank = hvd.rank()
OPTIONS = {"OneBitAdam": {"freeze_step": 2}, "OneBitLamb": {"freeze_step": 2}, "Birder": {},
           "SLAMB": {"compress_ratio": 0.5, "sync_interval": 3, "seed": 1},
           "ZeroOneAdam": {"var_freeze_step": 2, "var_update_scaler": 1, "local_step_scaler": 1,
                           "local_step_clipper": 2}, "Adasum": {}}
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
        if mode.startswith("clip_ddp"):
            if mode == "clip_ddp" or (rank == 0 and t > 2):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            opt.step()
            continue
        opt.synchronize()
        # One rank alone: past the 1-bit warm-up, where synchronize() averages and a clip of the average on one
        # rank would be the script's own divergence (as with Horovod).
        if mode != "clip_one_rank" or (rank == 0 and t > 2):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        with opt.skip_synchronize():
            opt.step()
    if op == "ZeroOneAdam":  # the ranks' models after a local step differ by design: compare their average
        opt.synchronize_parameters()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def held_back(op: str, pattern: bool, one_rank: bool = False) -> str:
    """Three steps (a 1-bit warm-up for 1-bit Adam) of ``op`` on ``UnusedMiddle`` in 1 KiB buckets, clipped after
    ``synchronize()`` (``pattern``) or after ``backward()``, by every rank or (``one_rank``) by rank 0 alone in the
    last step; the parameters' hash."""
    torch.manual_seed(0)
    model = UnusedMiddle()
    options = {"OneBitAdam": {"freeze_step": 10}, "PowerSGD": {"matrix_approximation_rank": 1,
                                                               "start_powerSGD_iter": 1}}.get(op, {})
    opt = hvd_compress.torch.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=1e-2), model.named_parameters(),
        op=getattr(hvd_compress.torch, op), bucket_mb=1 / 1024, **options)
    g = torch.Generator().manual_seed(10 + rank)
    for t in range(3):
        opt.zero_grad()
        model(torch.randn(32, 8, generator=g)).square().mean().backward()
        if pattern:
            opt.synchronize()
        if not one_rank or (rank == 0 and t == 2):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        if pattern:
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def after_backward() -> tuple:
    """One warm-up step's gradient of a 1M-parameter MLP: this rank's own (``torch.autograd.grad`` of the same
    loss, no hooks) and ``.grad`` as ``backward()`` returned it under 1-bit Adam with overlap, as NumPy arrays."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 2))
    opt = hvd_compress.torch.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=1e-2), model.named_parameters(), op=hvd_compress.torch.OneBitAdam,
        freeze_step=10)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(10 + rank))
    own = torch.autograd.grad(model(x).square().mean(), list(model.parameters()))
    model(x).square().mean().backward()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy().copy()
    opt.step()
    return torch.cat([g.reshape(-1) for g in own]).numpy(), got


out = {}
for op in sys.argv[2].split(","):
    modes = ("plain", "clip", "clip_one_rank", "clip_ddp", "clip_ddp_one_rank")
    if op != "Adasum":
        modes += ("clip_nooverlap",)
    for mode in modes if op not in ("Average", "PowerSGD") else ():  # the held-back cases only
        result = {}
        err = outcome(lambda op=op, mode=mode, result=result: result.setdefault("hash", run(op, mode)))
        out[(op, mode)] = result.get("hash") or err
    if op in ("OneBitAdam", "Average", "PowerSGD"):
        for mode, pattern, one_rank in (("held_back_ddp", False, False), ("held_back_ddp_one_rank", False, True),
                                        ("held_back_pattern", True, False)):
            result = {}
            err = outcome(lambda op=op, pattern=pattern, one_rank=one_rank, result=result: result.setdefault(
                "hash", held_back(op, pattern, one_rank)))
            out[(op, mode)] = result.get("hash") or err
    if op == "OneBitAdam":
        out[(op, "after_backward")] = after_backward()
save(rank, out)
