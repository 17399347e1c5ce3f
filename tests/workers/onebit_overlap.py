"""hc.DistributedOptimizer(op=OneBitAdam/OneBitLamb) with buckets reduced during backward (overlap=True) and after
it (overlap=False), on a model cut into several 64-byte buckets, through warm-up and compression steps.

Saves, per configuration and mode: the parameters after every step, the final ``state_dict()``, the buckets
started while backward was still running (counted from a hook on the input's gradient) and after it returned,
and the bucket count. Then: a NaN injected on the last rank into the last bucket (in bucket order) of a
compression step, per algorithm and mode (the error on every rank, every state tensor before and after); the
checkpoint layout checks; and synchronize() + halving ``.grad`` + step() with overlap=False against halving the
loss (the two must be bit-identical: halving is exact).

argv: out_dir steps freeze_step
"""

import functools
import sys

import torch
from common import outcome, save
from overlap_training import BUCKET_MB, backward, checkpoint_layouts, clip_without_overlap, make_model, train

import hvd_compress.torch as hc

steps, freeze = int(sys.argv[2]), int(sys.argv[3])
hc.init()
r, n = hc.rank(), hc.size()
torch.set_num_threads(1)

# name -> (algorithm, backward passes per step, two param groups, a discarded backward + zero_grad() at step 4)
CONFIGS = {
    "adam": ("adam", 1, False, False),
    "lamb": ("lamb", 1, False, False),
    "adam_accum_groups": ("adam", 2, True, False),
    "lamb_accum": ("lamb", 2, False, False),
    "lamb_abandoned": ("lamb", 1, True, True),
}


def make_opt(model: torch.nn.Module, algo: str, passes: int = 1, groups: bool = False, **options):
    params = list(model.parameters())
    given = [{"params": params[:-2]}, {"params": params[-2:], "lr": 0.005}] if groups else params
    if algo == "adam":
        base, op = torch.optim.Adam(given, lr=0.01, weight_decay=0.01), hc.OneBitAdam
    else:
        base, op = hc.Lamb(given, lr=0.01, weight_decay=0.01), hc.OneBitLamb
    options.setdefault("bucket_mb", BUCKET_MB)
    return hc.DistributedOptimizer(base, named_parameters=model.named_parameters(), op=op,
                                   backward_passes_per_step=passes, freeze_step=freeze, **options)


def state_tensors(opt) -> list[torch.Tensor]:
    """Every tensor of ``state_dict()`` (moments, error feedback, LAMB's coefficients), in a fixed order."""
    sd = opt.state_dict()
    out = []
    for st in sd["state"].values():
        out += [v.clone() for _, v in sorted(st.items()) if isinstance(v, torch.Tensor)]
    for seg in sd["hvd_compress"]["segments"]:
        out += [seg["onebit"]["worker_error"], seg["onebit"]["server_error"],
                torch.tensor(seg["lamb_coeff_freeze"] + seg["last_factor"], dtype=torch.float64)]
    return out


def nan_late_bucket(algo: str, overlap: bool) -> dict:
    """Compression step with a NaN on the last rank in the first layer's weight: the last bucket in bucket order."""
    model = make_model()
    opt = make_opt(model, algo, overlap=overlap)
    for step in range(freeze + 1):
        opt.zero_grad()
        backward(model, opt, step, 0, r)
        opt.step()
    before = [p.detach().clone() for p in model.parameters()] + state_tensors(opt)
    opt.zero_grad()
    weight = model[0].weight
    handle = weight.register_hook(lambda g: g.index_fill(0, torch.tensor([0]), float("nan"))) if r == n - 1 else None
    launched = []
    backward(model, opt, freeze + 1, 0, r, launched)
    if handle is not None:
        handle.remove()
    error = outcome(opt.step)
    after = [p.detach().clone() for p in model.parameters()] + state_tensors(opt)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if not torch.equal(a, b)]
    opt.zero_grad()  # the next step works again on every rank
    backward(model, opt, freeze + 2, 0, r)
    opt.step()
    return {"error": error, "changed": changed, "tensors": len(before), "launched": launched,
            "buckets": opt.bucket_count, "after_recovery": [p.detach().clone() for p in model.parameters()]}


out = {"results": {}, "nan": {}, "clip": {}}
for name, (algo, passes, groups, abandon) in CONFIGS.items():
    for overlap in (True, False):
        out["results"][(name, overlap)] = train(
            functools.partial(make_opt, algo=algo, passes=passes, groups=groups, overlap=overlap), state_tensors,
            steps, passes, r, abandon_at=freeze + 1 if abandon else None,
        )
for algo in ("adam", "lamb"):
    for overlap in (True, False):
        out["nan"][(algo, overlap)] = nan_late_bucket(algo, overlap)
out["checkpoints"] = checkpoint_layouts(functools.partial(make_opt, algo="lamb"), state_tensors, freeze + 1, r)
for algo in ("adam", "lamb"):
    no_overlap = functools.partial(make_opt, algo=algo, overlap=False)
    out["clip"][algo] = tuple(clip_without_overlap(no_overlap, steps, r, halve) for halve in (False, True))
save(r, out)
