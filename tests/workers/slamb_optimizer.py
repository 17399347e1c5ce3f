"""hc.DistributedOptimizer(hc.Lamb(...), op=hc.SLAMB) on every rank with given gradients (common.rank_input,
seed t + 1, the test re-creates them).

argv: out_dir, mode, then per mode (env SLAMB_WORKER_BACKEND_OPS=1: the backend's tensor ops instead of the
core's fused float32 passes, hvd_compress.ops.slamb_kernels):
- trace ratio interval kind steps [quiet]: parameters, masks, freshness and momentum after every step, bytes per
  step; ``quiet``: comma-separated indices of parameters that get no gradient (None) on ranks other than 0 (a
  branch only rank 0's batches take);
- identity steps: k = 1, H = 1, sync_grad=True next to hc.Lamb on the averaged gradients;
- resume steps stop_at: a run stopped after ``stop_at`` steps, saved, loaded into a fresh optimizer and
  continued, next to one never stopped;
- bad: the outcomes of bad options, checkpoints, NaN gradients and mismatched seeds;
- reshaped: a checkpoint loaded into a model whose (5, 6) parameter is (6, 5) (the same element count): the
  outcome and which parameters and state tensors changed; the same checkpoint without the recorded shapes (the
  schema before them) loading into the model it was saved from.
"""

import copy
import io
import os
import sys

import torch
from common import outcome, rank_input, save

import hvd_compress.torch as hc
from hvd_compress.ops import slamb_kernels

if os.environ.get("SLAMB_WORKER_BACKEND_OPS") == "1":  # Slamb.step's other path, for the same checks
    slamb_kernels.accepts = lambda *tensors: False

SHAPES = [(12, 25), (25,), (8, 30), (5, 6), (7,)]
OPTIONS = {"grad_size_thr": 100, "seed": 99}
LAMB = {"lr": 0.01, "weight_decay": 0.01, "eps": 1e-6, "max_coeff": 1000.0}

hc.init()
r, n = hc.rank(), hc.size()
mode = sys.argv[2]


def model() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(7)
    return [torch.nn.Parameter(torch.randn(s, generator=g) * 0.5) for s in SHAPES]


def numel() -> int:
    return sum(torch.Size(s).numel() for s in SHAPES)


def set_grads(params: list[torch.nn.Parameter], t: int, rank: int = r, quiet: tuple[int, ...] = ()) -> None:
    flat = rank_input(rank, numel(), torch.float32, seed=t + 1)
    at = 0
    for i, p in enumerate(params):
        p.grad = None if i in quiet and rank != 0 else flat[at:at + p.numel()].view_as(p).clone()
        at += p.numel()


def flat(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params]).clone()


def slamb(params: list[torch.nn.Parameter], **options) -> torch.optim.Optimizer:
    return hc.DistributedOptimizer(hc.Lamb(params, **LAMB), op=hc.SLAMB, **{**OPTIONS, **options})


def trained(shapes: list[tuple[int, ...]], first: int) -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer]:
    """``model()`` reshaped to ``shapes`` (same element counts), two steps from gradients of steps ``first``, ...."""
    params = [torch.nn.Parameter(p.detach().reshape(s)) for p, s in zip(model(), shapes, strict=True)]
    opt = slamb(params, compress_ratio=0.25, sync_interval=4)
    for t in range(first, first + 2):
        opt.zero_grad()
        set_grads(params, t)
        opt.step()
    return params, opt


def everything(params: list[torch.nn.Parameter], opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters, every per-parameter state tensor (m, step, v), the freshness and the step."""
    sd = opt.state_dict()
    out = [p.detach().clone() for p in params]
    for st in sd["state"].values():
        out += [v.clone() for _, v in sorted(st.items()) if isinstance(v, torch.Tensor)]
    return [*out, sd["hvd_compress"]["freshness"].clone(), torch.tensor([sd["hvd_compress"]["step"]])]


if mode == "trace":
    ratio, interval, kind, steps = float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
    quiet = tuple(int(i) for i in sys.argv[7].split(",")) if len(sys.argv) > 7 else ()
    params = model()
    opt = slamb(params, compress_ratio=ratio, sync_interval=interval, mask=kind)
    out = {"params": [], "masks": [], "freshness": [], "momentum": [], "bytes": []}
    for t in range(steps):
        opt.zero_grad()
        set_grads(params, t, quiet=quiet)
        opt.step()
        b = opt._hvdc.alg.buf
        out["params"].append(flat(params))
        out["masks"].append(b.mask.clone())
        out["freshness"].append(b.freshness.clone())
        out["momentum"].append(torch.cat([opt.state[p]["exp_avg"].reshape(-1) for p in params]).clone())
        out["bytes"].append(opt.comm_stats()["bytes_sent"])
    opt.synchronize_parameters()
    out["final"] = flat(params)
    save(r, out)
elif mode == "identity":
    steps = int(sys.argv[3])
    a, b = model(), model()
    opt_s = slamb(a, compress_ratio=1.0, sync_interval=1, sync_grad=True, variance_floor=0.0)  # the paper rule
    opt_l = hc.Lamb(b, **LAMB)
    diffs = []
    for t in range(steps):
        opt_s.zero_grad()
        set_grads(a, t)
        opt_s.step()
        set_grads(b, t)
        for p in b:
            hc.allreduce_(p.grad, op=hc.Average)
        opt_l.step()
        diffs.append(float((flat(a) - flat(b)).abs().max()))
    save(r, {"diffs": diffs, "scale": float(flat(b).abs().max())})
elif mode == "resume":
    steps, stop_at = int(sys.argv[3]), int(sys.argv[4])
    opts = {"compress_ratio": 0.25, "sync_interval": 4}
    params = model()
    opt = slamb(params, **opts)
    for t in range(steps):
        opt.zero_grad()
        set_grads(params, t)
        opt.step()
    straight = flat(params)
    params = model()
    opt = slamb(params, **opts)
    for t in range(stop_at):
        opt.zero_grad()
        set_grads(params, t)
        opt.step()
    blob = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in params], "opt": opt.state_dict()}, blob)
    del opt
    blob.seek(0)
    ckpt = torch.load(blob, weights_only=False)
    params = model()
    with torch.no_grad():
        for p, q in zip(params, ckpt["params"], strict=True):
            p.copy_(q)
    opt = slamb(params, **opts)
    opt.load_state_dict(ckpt["opt"])
    for t in range(stop_at, steps):
        opt.zero_grad()
        set_grads(params, t)
        opt.step()
    save(r, {"straight": straight, "resumed": flat(params), "step": opt.state_dict()["hvd_compress"]["step"]})
elif mode == "bad":
    bad = {}
    for key, value in (("compress_ratio", 0.0), ("compress_ratio", 1.5), ("sync_interval", 0), ("mask", "x")):
        bad[f"{key}={value}"] = outcome(lambda key=key, value=value: slamb(model(), **{key: value}))
    params = model()
    opt = slamb(params, compress_ratio=0.25, sync_interval=4)
    for t in range(2):
        opt.zero_grad()
        set_grads(params, t)
        opt.step()
    before = (flat(params), opt._hvdc.alg.buf.exp_avg.clone(), opt._hvdc.alg.buf.exp_avg_sq.clone(),
              opt._hvdc.alg.buf.freshness.clone(), opt._hvdc.alg.t)

    def unchanged() -> bool:
        b = opt._hvdc.alg.buf
        now = (flat(params), b.exp_avg, b.exp_avg_sq, b.freshness)
        return all(torch.equal(x, y) for x, y in zip(now, before[:4], strict=True)) and opt._hvdc.alg.t == before[4]

    def nan_step() -> None:
        opt.zero_grad()
        set_grads(params, 2)
        if r == n - 1:
            params[2].grad[3, 4] = float("nan")
        opt.step()

    bad["nan"] = outcome(nan_step)
    bad["nan_unchanged"] = unchanged()
    # A rank whose seed differs: its masks would differ, the signature exchange says so on every rank.
    other = slamb(model(), compress_ratio=0.25, sync_interval=4, seed=99 + (r == 0))
    q = other._hvdc.alg.buf.params

    def seed_step() -> None:
        set_grads(q, 0)
        other.step()

    bad["seed"] = outcome(seed_step)
    sd = opt.state_dict()
    onebit = dict(sd, hvd_compress=dict(sd["hvd_compress"], algorithm="OneBitLamb"))
    bad["other_algorithm"] = outcome(lambda: opt.load_state_dict(onebit))
    world = dict(sd, hvd_compress=dict(sd["hvd_compress"], world_size=n + 1))
    bad["other_world"] = outcome(lambda: (opt.load_state_dict(world), opt.step()))  # refused by the step
    bad["load_unchanged"] = unchanged()
    # After all that the ranks still step together.
    opt.zero_grad()
    set_grads(params, 2)
    opt.step()
    bad["after"] = flat(params)
    # A refused step, then the next one straight away (no zero_grad(): new gradients assigned, as a loop that sets
    # .grad itself does): it runs on every rank, and its parameters are those of a run that never saw the NaN.
    bad["nan_again"] = outcome(nan_step)
    set_grads(params, 3)
    bad["retry"] = outcome(opt.step)
    bad["after_retry"] = flat(params)
    save(r, bad)
elif mode == "reshaped":
    saved_params, saved_opt = trained(SHAPES, 0)
    blob = io.BytesIO()
    torch.save(saved_opt.state_dict(), blob)
    blob.seek(0)
    ckpt = torch.load(blob, weights_only=False)
    params, opt = trained([(6, 5) if s == (5, 6) else s for s in SHAPES], 5)  # other gradients: other state
    before = everything(params, opt)
    error = outcome(lambda: opt.load_state_dict(ckpt))
    changed = [i for i, (a, b) in enumerate(zip(before, everything(params, opt), strict=True)) if not torch.equal(a, b)]
    old = copy.deepcopy(ckpt)  # the schema before shapes were recorded: sizes only
    for seg in old["hvd_compress"]["buckets"]:
        seg.pop("shapes", None)
    params, opt = trained(SHAPES, 5)
    old_error = outcome(lambda: opt.load_state_dict(old))
    old_equal = all(torch.equal(a, b) for a, b in zip(everything(params, opt)[len(SHAPES):],
                                                      everything(saved_params, saved_opt)[len(SHAPES):], strict=True))
    save(r, {"error": error, "changed": changed, "tensors": len(before), "old": old_error, "old_equal": old_equal})
