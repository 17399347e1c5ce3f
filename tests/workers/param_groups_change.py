"""Parameters that change after hvd_compress wrapped the optimizer: a group added with ``add_param_group``, a
layer frozen (requires_grad=False) when wrapped and unfrozen later, or trainable when wrapped and frozen later. Two
layers, a (trained from the start) and b (from step 2 on, or up to it when frozen); 5 steps of SGD (Adam for the
1-bit ops), each rank on its own batches.

argv: out_dir ops (comma list of names of ``hc``)
Saves per rank, per (op, how) with how "add", "unfreeze" or "freeze": ``refused``, the error of step 2 without
wrapping again and whether that step left every parameter as it was (or, where nothing was refused, the run);
``rewrapped``, the parameters after 5 steps where the optimizer was wrapped again after the change (``b_moved``:
whether b changed since it was added, unfrozen or frozen). Rank 0 also saves ``("reference", how)``: the same run
with SGD on the exact average of the ranks' gradients, one process (op=Average's rule).
"""

from __future__ import annotations

import sys

import horovod.torch as hvd
import torch
from common import flat_parameters, save, set_exact_average_gradients

import hvd_compress.torch as hc

hvd.init()
torch.set_num_threads(1)
rank, size = hvd.rank(), hvd.size()
OPTIONS = {"OneBitAdam": {"freeze_step": 2}, "PowerSGD": {"start_powerSGD_iter": 1, "min_compression_rate": 1},
           "ZeroOneAdam": {"var_freeze_step": 2, "local_step_scaler": 1, "local_step_clipper": 1}}
ADAM = ("OneBitAdam", "ZeroOneAdam")
STEPS, CHANGE_AT, LR = 5, 2, 0.05
HOW = ("add", "unfreeze", "freeze")


def layers() -> tuple[torch.nn.Linear, torch.nn.Linear]:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)


def loss(a: torch.nn.Module, b: torch.nn.Module, gen: torch.Generator) -> torch.Tensor:
    return b(torch.relu(a(torch.randn(32, 8, generator=gen)))).square().mean()


def run(op: str, how: str, rewrap: bool) -> dict:
    a, b = layers()
    if how == "unfreeze":
        b.requires_grad_(False)
    groups = [{"params": list(a.parameters())}] + ([] if how == "add" else [{"params": list(b.parameters())}])
    opt_cls = torch.optim.Adam if op in ADAM else torch.optim.SGD
    named = [*a.named_parameters(prefix="a"), *b.named_parameters(prefix="b")]
    opt = hc.DistributedOptimizer(opt_cls(groups, lr=LR), named, op=getattr(hc, op), **OPTIONS.get(op, {}))
    gen, b_start = torch.Generator().manual_seed(10 + rank), flat_parameters(b)
    for t in range(STEPS):
        if t == CHANGE_AT:
            if how == "add":
                opt.add_param_group({"params": list(b.parameters())})
            else:
                b.requires_grad_(how == "unfreeze")
                b_start = flat_parameters(b)  # a frozen b stays as it is from here on
            if rewrap:
                opt = hc.DistributedOptimizer(opt, named, op=getattr(hc, op), **OPTIONS.get(op, {}))
        opt.zero_grad()
        loss(a, b, gen).backward()
        before = flat_parameters(a, b)
        try:
            opt.step()
        except hc.UsageError as e:
            return {"error": str(e), "unchanged": bool(torch.equal(before, flat_parameters(a, b)))}
    b_end = flat_parameters(b)
    return {"error": None, "a": flat_parameters(a), "b": b_end, "b_moved": not torch.equal(b_end, b_start)}


def reference(how: str) -> dict:
    """SGD on the exact average of every rank's gradient; b trained from step CHANGE_AT on, or, frozen then
    (``how`` "freeze"), up to it."""
    a, b = layers()
    gens = [torch.Generator().manual_seed(10 + r) for r in range(size)]
    for t in range(STEPS):
        b_trains = (t < CHANGE_AT) == (how == "freeze")
        params = [*a.parameters(), *(b.parameters() if b_trains else [])]
        set_exact_average_gradients(params, [lambda g=g: loss(a, b, g) for g in gens])
        with torch.no_grad():
            for p in params:
                p.sub_(p.grad, alpha=LR)
    return {"a": flat_parameters(a), "b": flat_parameters(b)}


out = {}
for op in sys.argv[2].split(","):
    for how in HOW:
        out[(op, how, "refused")] = run(op, how, rewrap=False)
        out[(op, how, "rewrapped")] = run(op, how, rewrap=True)
if rank == 0:
    out.update({("reference", how): reference(how) for how in HOW})
save(rank, out)
