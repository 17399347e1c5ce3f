"""hc.DistributedOptimizer(hc.Lamb(...), op=hc.SLAMB) with buckets whose momentum and masked average (steps 3 and 4)
start during backward (overlap=True) and after it (overlap=False), on a model cut into several 64-byte buckets.

Saves, per configuration and mode: the parameters after every step (a parameter average every SYNC steps), the
final state tensors, the buckets started while backward was still running and after it returned, the bucket count.
Then: the same training with the whole model in one bucket per param group (the cut must not change the rule); the
mask after a bucketed step against the whole mask of D; a NaN injected on the last rank into the first or the last
bucket (in bucket order) of a sync step, per mode (the error on every rank, every state tensor before and after, a
recovery step); the checkpoint layout checks, a checkpoint written before buckets (no layout) loading into this cut,
a run resumed from a checkpoint against the run never stopped, in the same and in other bucket layouts, and
synchronize() + halving ``.grad`` + step() with overlap=False against halving the loss.

argv: out_dir steps
"""

import copy
import functools
import io
import sys

import torch
from common import outcome, save
from overlap_training import (
    BUCKET_MB,
    checkpoint_layouts,
    clip_without_overlap,
    make_model,
    nan_step,
    param_groups,
    parameter_state,
    run_steps,
    snapshot,
    train,
)

import hvd_compress.torch as hc
from hvd_compress.ops import masks as mask_ops

steps = int(sys.argv[2])
hc.init()
r, n = hc.rank(), hc.size()
torch.set_num_threads(1)

SYNC = 3  # sync_interval: steps 3 and 6 end with the dense parameter average
# 20: both weight matrices of 96 and 256 elements are masked (k = 0.25), the rest (biases, the 16-element w3)
# synchronized every step.
OPTIONS = {"compress_ratio": 0.25, "sync_interval": SYNC, "grad_size_thr": 20, "seed": 5}
# name -> (backward passes per step, two param groups, a discarded backward + zero_grad() at step 3, options)
CONFIGS = {
    "plain": (1, False, False, {}),
    "accum_groups": (2, True, False, {}),
    "abandoned": (1, True, True, {}),
    "bernoulli_sync_grad": (1, False, False, {"mask": "bernoulli", "sync_grad": True}),
}


def make_opt(model: torch.nn.Module, passes: int = 1, groups: bool = False, **options):
    given = param_groups(model, groups)
    options.setdefault("bucket_mb", BUCKET_MB)
    return hc.DistributedOptimizer(hc.Lamb(given, lr=0.01, weight_decay=0.01),
                                   named_parameters=model.named_parameters(), op=hc.SLAMB,
                                   backward_passes_per_step=passes, **{**OPTIONS, **options})


def state_tensors(opt) -> list[torch.Tensor]:
    """m, v and the step of every parameter, the freshness and the step of the ``hvd_compress`` section."""
    sd = opt.state_dict()
    return [*parameter_state(sd), sd["hvd_compress"]["freshness"].clone(), torch.tensor([sd["hvd_compress"]["step"]])]


def mask_is_the_whole_one() -> bool:
    """After a bucketed step the mask is M_t of all D (the always-synced tensors included), drawn whole."""
    model = make_model()
    opt = make_opt(model)
    ok = True
    for step in range(2):
        run_steps(model, opt, step, step + 1, r)
        b = opt._hvdc.alg.buf
        whole = mask_ops.random_mask_(torch.zeros(b.numel, dtype=torch.bool), OPTIONS["compress_ratio"],
                                      OPTIONS["seed"], step + 1, "cyclic", opt._hvdc.alg.always)
        ok = ok and torch.equal(b.mask, whole) and 0 < int(whole.sum()) < b.numel
    return ok


def nan_in_bucket(overlap: bool, layer: int) -> dict:
    """A NaN on the last rank in ``model[layer].weight`` at step SYNC (a parameter-average step)."""
    got, opt = nan_step(functools.partial(make_opt, overlap=overlap), state_tensors, SYNC - 1, layer, r, n)
    return {**got, "step": opt._hvdc.alg.t}


# The resumed runs' layouts: 64-byte buckets (five), one bucket, and two of another split ([w1, b1], [w2, b2, w3, b3]).
LAYOUTS = {"five": BUCKET_MB, "one": 25.0, "two": 1100 / (1 << 20)}
SAVED_AT = 2  # the checkpoint: after step 2, before the parameter averages of steps 3 and 6


def checkpoint_after(first_steps: int, bucket_mb: float) -> dict:
    """A checkpoint (through torch.save) of the model and optimizer after ``first_steps`` steps, with overlap."""
    model = make_model()
    opt = make_opt(model, bucket_mb=bucket_mb)
    run_steps(model, opt, 0, first_steps, r)
    blob = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, blob)
    blob.seek(0)
    return torch.load(blob, weights_only=False)


def resumed(ckpt: dict, bucket_mb: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A fresh model and optimizer cut with ``bucket_mb``, loaded from ``ckpt``."""
    model = make_model()
    model.load_state_dict(ckpt["model"])
    opt = make_opt(model, bucket_mb=bucket_mb)
    opt.load_state_dict(ckpt["opt"])
    return model, opt


def resumed_equals_straight() -> bool:
    """64-byte buckets with overlap: a run stopped after 2 steps, saved, loaded into a fresh model and optimizer and
    continued to ``steps`` (through parameter averages) ends bit for bit as the run never stopped."""
    model = make_model()
    run_steps(model, make_opt(model), 0, steps, r)
    straight = [p.detach().clone() for p in model.parameters()]
    model, opt = resumed(checkpoint_after(SAVED_AT, BUCKET_MB), BUCKET_MB)
    run_steps(model, opt, SAVED_AT, steps, r)
    return all(torch.equal(a, b.detach()) for a, b in zip(straight, model.parameters(), strict=True))


def resumed_under_other_layouts() -> dict:
    """Saved after ``SAVED_AT`` steps in five buckets, resumed in one bucket and in two (another split), continued
    to ``steps``: per resumed layout its bucket count and, against the runs never stopped in five buckets and in its
    own layout, (equal, largest |difference|) per tensor of ``snapshot``. Also a checkpoint of another layout and
    another world size: the outcome, and whether the parameters and state stayed as they were."""
    straight = {}
    for name, mb in LAYOUTS.items():
        model = make_model()
        opt = make_opt(model, bucket_mb=mb)
        run_steps(model, opt, 0, steps, r)
        straight[name] = snapshot(model, opt, state_tensors)
    ckpt = checkpoint_after(SAVED_AT, LAYOUTS["five"])
    out: dict = {"layouts": {}}
    for name in ("one", "two"):
        model, opt = resumed(ckpt, LAYOUTS[name])
        run_steps(model, opt, SAVED_AT, steps, r)
        got = snapshot(model, opt, state_tensors)
        out["layouts"][name] = {"buckets": opt.bucket_count, "vs": {
            ref: [(torch.equal(a, b), (a.double() - b.double()).abs().max().item())
                  for a, b in zip(got, straight[ref], strict=True)] for ref in ("five", name)}}
    model, opt = resumed(checkpoint_after(SAVED_AT, LAYOUTS["one"]), LAYOUTS["one"])
    before = snapshot(model, opt, state_tensors)
    other_world = copy.deepcopy(ckpt["opt"])
    other_world["hvd_compress"]["world_size"] = n + 1
    error = outcome(lambda: (opt.load_state_dict(other_world), opt.step()))  # refused by the step
    after = snapshot(model, opt, state_tensors)
    out["other_world"] = (error, all(torch.equal(a, b) for a, b in zip(before, after, strict=True)))
    return out


def old_checkpoint_loads() -> tuple[str, bool]:
    """A checkpoint written before buckets (no ``buckets``) loads into 64-byte buckets, state as saved."""
    model = make_model()
    opt = make_opt(model, bucket_mb=25.0)
    run_steps(model, opt, 0, 2, r)
    old = copy.deepcopy(opt.state_dict())
    del old["hvd_compress"]["buckets"]
    fresh = make_opt(make_model())
    got = outcome(lambda: fresh.load_state_dict(old))
    return got, all(torch.equal(a, b) for a, b in zip(state_tensors(fresh), state_tensors(opt), strict=True))


out = {"results": {}, "whole": {}, "nan": {}}
for name, (passes, groups, abandon, options) in CONFIGS.items():
    for overlap in (True, False):
        out["results"][(name, overlap)] = train(
            functools.partial(make_opt, passes=passes, groups=groups, overlap=overlap, **options), state_tensors,
            steps, passes, r, abandon_at=2 if abandon else None,
        )
    out["whole"][name] = train(
        functools.partial(make_opt, passes=passes, groups=groups, overlap=False, bucket_mb=25.0, **options),
        state_tensors, steps, passes, r, abandon_at=2 if abandon else None,
    )
out["mask_whole"] = mask_is_the_whole_one()
for overlap in (True, False):
    for layer in (0, 4):  # model[0].weight: the last bucket in bucket order; model[4].weight: the first
        out["nan"][(overlap, layer)] = nan_in_bucket(overlap, layer)
out["checkpoints"] = checkpoint_layouts(make_opt, state_tensors, 2, r, layout_free=True)
out["old_checkpoint"] = old_checkpoint_loads()
out["resumed"] = resumed_equals_straight()
out["resumed_layouts"] = resumed_under_other_layouts()
no_overlap = functools.partial(make_opt, overlap=False)
out["clip"] = tuple(clip_without_overlap(no_overlap, steps, r, halve) for halve in (False, True))
save(r, out)
