"""``torch.amp.GradScaler`` with each op that reduces gradients in buckets (``scaler.scale(loss).backward()``,
``scaler.step(opt)``, ``scaler.update()``), overlap on and off, against the same run without a scaler.

argv: out_dir ops (comma list of OneBitAdam, OneBitLamb, Birder, SLAMB, Average, PowerSGD, TopK: op=Average with
top-k compression, ZeroOneAdam, PowerSGD0: op=PowerSGD compressing from the first step, whose error the scaler's
first step makes before the optimizer has seen the scaler)
Saves per rank, per (op, mode): (SHA-256 of the parameters, the scaler's final scale) or the error raised. Modes:
``plain`` (no scaler), ``scaler`` and ``scaler_nooverlap`` (a power-of-two scale: unscaling is exact, so these
must equal ``plain`` bit for bit), ``scaler_growing`` (the scale doubles after every step: PowerSGD's error
feedback must follow it, and the run still equal ``plain``), ``inf_one_rank`` (rank 1's gradient holds an inf at
step 4: every rank must skip that step and halve its scale alike) and ``clip`` (Horovod's AMP pattern:
``synchronize()``, ``scaler.unscale_``, ``clip_grad_norm_``, ``skip_synchronize()`` + ``scaler.step``),
``clip_nooverlap``, ``recipe`` (torch's AMP recipe: ``scaler.unscale_``, ``clip_grad_norm_``, ``scaler.step`` with no
``synchronize()``).
For op=Average and op=PowerSGD also three steps in small buckets of a model with an unused middle layer, with a
layer used on rank 0 only, and with reentrant activation checkpointing.
"""

from __future__ import annotations

import hashlib
import sys

import horovod.torch as hvd
import torch
from common import UnusedMiddle, outcome, save, small_wrapped

import hvd_compress.torch as hc  # before hvd.init(), as a user script imports it

hvd.init()
torch.set_num_threads(1)
rank = hvd.rank()
OPTIONS = {"OneBitAdam": {"freeze_step": 2}, "OneBitLamb": {"freeze_step": 2}, "Birder": {},
           "SLAMB": {"compress_ratio": 0.5, "sync_interval": 3, "seed": 1}, "Average": {},
           "PowerSGD": {"start_powerSGD_iter": 2, "min_compression_rate": 1},
           "PowerSGD0": {"start_powerSGD_iter": 0, "min_compression_rate": 1},
           "TopK": {"compression": hc.Compression.topk(0.3)},
           "ZeroOneAdam": {"var_freeze_step": 3, "local_step_scaler": 1, "local_step_clipper": 2}}
OP_OF = {"TopK": "Average", "PowerSGD0": "PowerSGD"}  # a case that is an op with other options
NO_OVERLAP = ("TopK",)  # reduced in step() only: takes no overlap= (its *_nooverlap modes repeat the others)
STEPS = 7
MODES = ("plain", "scaler", "scaler_growing", "scaler_nooverlap", "inf_one_rank", "clip", "clip_nooverlap", "recipe")


def run(op: str, mode: str) -> tuple[str, float]:
    overlap = {} if op in NO_OVERLAP else {"overlap": not mode.endswith("nooverlap")}
    model, opt = small_wrapped(OP_OF.get(op, op), **overlap, **OPTIONS[op])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    growth = 1 if mode == "scaler_growing" else 2000
    scaler = None if mode == "plain" else torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=growth)
    g = torch.Generator().manual_seed(10 + rank)
    for t in range(1, STEPS + 1):
        x = torch.randn(32, 8, generator=g) * 5
        y = torch.randint(0, 2, (32,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
            continue
        if mode == "inf_one_rank" and rank == 1 and t == 4:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        if mode.startswith("clip"):
            opt.synchronize()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            with opt.skip_synchronize():
                scaler.step(opt)
        elif mode == "recipe":  # torch's AMP recipe as a DDP script has it: no synchronize()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            scaler.step(opt)
        else:
            scaler.step(opt)
        scaler.update()
    return parameters_hash(model), scaler.get_scale() if scaler else 0.0


def parameters_hash(model: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


class FirstOnRankZero(torch.nn.Module):
    """An MLP whose last registered layer (the first in bucket order) is used on rank 0 only: on the other ranks it
    holds back every bucket during backward, on rank 0 none."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(8, 64), torch.nn.Linear(64, 2), torch.nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.b(h) + self.c(h) if rank == 0 else self.b(h)


class Checkpointed(torch.nn.Module):
    """An MLP whose middle block runs under reentrant activation checkpointing: its gradients come from a nested
    backward pass (its own graph task, whose end runs before the outer pass has started the first layer's bucket)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 64), torch.nn.Linear(64, 64)
        self.c, self.d = torch.nn.Linear(64, 64), torch.nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.utils.checkpoint.checkpoint(self._middle, torch.relu(self.a(x)), use_reentrant=True)
        return self.d(h)

    def _middle(self, h: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.c(torch.relu(self.b(h))))


def in_small_buckets(model_cls: type, op: str, clipping: str) -> str:
    """Three steps of ``model_cls`` in 1 KiB buckets under the scaler, clipping by torch's recipe (``"recipe"``: no
    ``synchronize()``), by Horovod's pattern (``"pattern"``) or not at all (``"none"``); the parameters' hash."""
    torch.manual_seed(0)
    model = model_cls()
    opt = hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                  op=getattr(hc, OP_OF.get(op, op)), bucket_mb=1 / 1024, **OPTIONS[op])
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    g = torch.Generator().manual_seed(10 + rank)
    for _ in range(3):
        opt.zero_grad()
        scaler.scale(model(torch.randn(32, 8, generator=g)).square().mean()).backward()
        if clipping == "pattern":
            opt.synchronize()
        if clipping != "none":
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        if clipping == "pattern":
            with opt.skip_synchronize():
                scaler.step(opt)
        else:
            scaler.step(opt)
        scaler.update()
    return parameters_hash(model)


out = {}
for op in sys.argv[2].split(","):
    for mode in MODES:
        result = {}
        err = outcome(lambda op=op, mode=mode, result=result: result.setdefault("run", run(op, mode)))
        out[(op, mode)] = result.get("run") or err
    if op in ("Average", "PowerSGD"):
        out[(op, "held_back_recipe")] = outcome(lambda op=op: in_small_buckets(UnusedMiddle, op, "recipe"))
        out[(op, "held_back_pattern")] = in_small_buckets(UnusedMiddle, op, "pattern")
        result = {}
        err = outcome(lambda op=op, result=result: result.setdefault(
            "run", in_small_buckets(Checkpointed, op, "recipe")))
        out[(op, "checkpointed_recipe")] = result.get("run") or err
        out[(op, "checkpointed_pattern")] = in_small_buckets(Checkpointed, op, "pattern")
        result = {}
        err = outcome(lambda op=op, result=result: result.setdefault(
            "run", in_small_buckets(FirstOnRankZero, op, "none")))
        out[(op, "first_on_rank_zero")] = result.get("run") or err
save(rank, out)
