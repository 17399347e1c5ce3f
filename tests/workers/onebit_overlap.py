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
from common import save
from overlap_training import (
    BUCKET_MB,
    checkpoint_layouts,
    clip_without_overlap,
    nan_step,
    param_groups,
    parameter_state,
    train,
)

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
    given = param_groups(model, groups)
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
    out = parameter_state(sd)
    for seg in sd["hvd_compress"]["buckets"]:
        out += [seg["onebit"]["worker_error"], seg["onebit"]["server_error"],
                torch.tensor(seg["lamb_coeff_freeze"] + seg["last_factor"], dtype=torch.float64)]
    return out


out = {"results": {}, "nan": {}, "clip": {}}
for name, (algo, passes, groups, abandon) in CONFIGS.items():
    for overlap in (True, False):
        out["results"][(name, overlap)] = train(
            functools.partial(make_opt, algo=algo, passes=passes, groups=groups, overlap=overlap), state_tensors,
            steps, passes, r, abandon_at=freeze + 1 if abandon else None,
        )
for algo in ("adam", "lamb"):
    for overlap in (True, False):
        # Compression step with a NaN on the last rank in the first layer's weight: the last bucket in bucket order.
        out["nan"][(algo, overlap)], _ = nan_step(functools.partial(make_opt, algo=algo, overlap=overlap),
                                                  state_tensors, freeze + 1, 0, r, n)
out["checkpoints"] = checkpoint_layouts(functools.partial(make_opt, algo="lamb"), state_tensors, freeze + 1, r)
for algo in ("adam", "lamb"):
    no_overlap = functools.partial(make_opt, algo=algo, overlap=False)
    out["clip"][algo] = tuple(clip_without_overlap(no_overlap, steps, r, halve) for halve in (False, True))
save(r, out)
