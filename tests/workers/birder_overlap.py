"""hc.DistributedOptimizer(hc.Birder(...), op=hc.Birder) with buckets whose core call starts during backward
(overlap=True) and after it (overlap=False), on a model cut into several 64-byte buckets.

Saves, per configuration and mode: the parameters after every step, the final ``state_dict()`` tensors, the buckets
started while backward was still running (counted from a hook on the input's gradient) and after it returned, and
the bucket count. Then: a NaN injected on the last rank into the last bucket (in bucket order), per mode (the
error on every rank, every state tensor before and after, and a recovery step); and the checkpoint layout checks.

argv: out_dir steps hierarchical (0/1)
"""

import functools
import sys

import torch
from common import save
from overlap_training import BUCKET_MB, checkpoint_layouts, nan_step, param_groups, train

import hvd_compress.torch as hc

steps, hierarchical = int(sys.argv[2]), sys.argv[3] == "1"
hc.init()
r, n = hc.rank(), hc.size()
torch.set_num_threads(1)

# name -> (backward passes per step, two param groups, a discarded backward + zero_grad() at step 3)
CONFIGS = {"plain": (1, False, False), "accum_groups": (2, True, False), "abandoned": (1, True, True)}


def make_opt(model: torch.nn.Module, passes: int = 1, groups: bool = False, **options):
    given = param_groups(model, groups)
    options.setdefault("bucket_mb", BUCKET_MB)
    return hc.DistributedOptimizer(hc.Birder(given, lr=0.01, weight_decay=0.01),
                                   named_parameters=model.named_parameters(), op=hc.Birder,
                                   backward_passes_per_step=passes, hierarchical=hierarchical, seed=11, **options)


def state_tensors(opt) -> list[torch.Tensor]:
    """Every tensor of the ``hvd_compress`` section (m, b, worker and server error of each bucket) and the step."""
    sd = opt.state_dict()["hvd_compress"]
    out = [torch.tensor([sd["step"]])]
    for seg in sd["buckets"]:
        out += [seg[k].clone() for k in ("m", "b", "worker_error", "server_error")]
    return out


def nan_late_bucket(overlap: bool) -> dict:
    """A NaN on the last rank in the first layer's weight (the last bucket in bucket order) at step 3; the next step
    draws as step 3 would have."""
    got, opt = nan_step(functools.partial(make_opt, overlap=overlap), state_tensors, 2, 0, r, n)
    return {**got, "step": opt.birder_step}


def bucket_streams() -> bool:
    """Whether two equal buckets fed the same gradient on every rank draw different uniforms (their own keys)."""
    params = [torch.nn.Parameter(torch.zeros(64)) for _ in range(2)]
    opt = hc.DistributedOptimizer(hc.Birder(params, lr=1.0), named_parameters=[("a", params[0]), ("b", params[1])],
                                  op=hc.Birder, bucket_mb=256 / (1 << 20), hierarchical=hierarchical, seed=3)
    assert opt.bucket_count == 2
    for p in params:  # r = m / (b + eps) = 0: u is Q(0), a fair coin per element
        p.grad = torch.zeros(64)
    opt.step()
    return not torch.equal(params[0].detach(), params[1].detach())


out = {"results": {}, "nan": {}}
for name, (passes, groups, abandon) in CONFIGS.items():
    for overlap in (True, False):
        out["results"][(name, overlap)] = train(
            functools.partial(make_opt, passes=passes, groups=groups, overlap=overlap), state_tensors, steps, passes,
            r, abandon_at=2 if abandon else None,
        )
for overlap in (True, False):
    out["nan"][overlap] = nan_late_bucket(overlap)
out["checkpoints"] = checkpoint_layouts(make_opt, state_tensors, 2, r)
out["streams_differ"] = bucket_streams()
save(r, out)
