"""hc.DistributedOptimizer(hc.Birder(...), op=hc.Birder) with buckets whose core call starts during backward
(overlap=True) and after it (overlap=False), on a model cut into several 64-byte buckets.

Saves, per configuration and mode: the parameters after every step, the final ``state_dict()`` tensors, the buckets
started while backward was still running (counted from a hook on the input's gradient) and after it returned, and
the bucket count. Then: a NaN injected on the last rank into the last bucket (in bucket order), per mode (the
error on every rank, every state tensor before and after, and a recovery step); and the checkpoint layout checks.

argv: out_dir steps hierarchical (0/1)
"""

import copy
import sys

import torch
from common import outcome, save

import hvd_compress.torch as hc

steps, hierarchical = int(sys.argv[2]), sys.argv[3] == "1"
hc.init()
r, n = hc.rank(), hc.size()
torch.set_num_threads(1)
BUCKET_MB = 64 / (1 << 20)  # 64-byte buckets: 5 buckets (see tests/test_birder_overlap.py)

# name -> (backward passes per step, two param groups, a discarded backward + zero_grad() at step 3)
CONFIGS = {"plain": (1, False, False), "accum_groups": (2, True, False), "abandoned": (1, True, True)}


def make_model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    )


def make_opt(model: torch.nn.Module, passes: int = 1, groups: bool = False, **options):
    params = list(model.parameters())
    given = [{"params": params[:-2]}, {"params": params[-2:], "lr": 0.005}] if groups else params
    options.setdefault("bucket_mb", BUCKET_MB)
    return hc.DistributedOptimizer(hc.Birder(given, lr=0.01, weight_decay=0.01),
                                   named_parameters=model.named_parameters(), op=hc.Birder,
                                   backward_passes_per_step=passes, hierarchical=hierarchical, seed=11, **options)


def batch(step: int, rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100_000 * step + 100 * rank + micro)
    x = torch.randn(5, 6, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def state_tensors(opt) -> list[torch.Tensor]:
    """Every tensor of the ``hvd_compress`` section (m, b, worker and server error of each bucket) and the step."""
    sd = opt.state_dict()["hvd_compress"]
    out = [torch.tensor([sd["step"]])]
    for seg in sd["segments"]:
        out += [seg[k].clone() for k in ("m", "b", "worker_error", "server_error")]
    return out


def backward(model, opt, step, micro, seen=None) -> None:
    x, y = batch(step, r, micro)
    x.requires_grad_(True)
    if seen is not None:
        x.register_hook(lambda g: seen.append(opt._hvdc_alg.launched))
    torch.nn.functional.mse_loss(model(x), y).backward()


def train(passes, groups, abandon, overlap) -> dict:
    model = make_model()
    opt = make_opt(model, passes, groups, overlap=overlap)
    params, during, after = [], [], []
    for step in range(steps):
        if abandon and step == 2:  # a step given up before step(): its started buckets are undone
            opt.zero_grad()
            backward(model, opt, step + 77, 0)
        opt.zero_grad()
        seen = []
        for micro in range(passes):
            backward(model, opt, step, micro, seen)
        during.append(seen[-1])
        after.append(opt._hvdc_alg.launched)
        opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    return {"params": params, "during": during, "after": after, "buckets": opt.bucket_count,
            "overlap": opt.overlap, "state": state_tensors(opt)}


def nan_late_bucket(overlap: bool) -> dict:
    """A NaN on the last rank in the first layer's weight (the last bucket in bucket order) at step 3."""
    model = make_model()
    opt = make_opt(model, overlap=overlap)
    for step in range(2):
        opt.zero_grad()
        backward(model, opt, step, 0)
        opt.step()
    before = [p.detach().clone() for p in model.parameters()] + state_tensors(opt)
    opt.zero_grad()
    weight = model[0].weight
    handle = weight.register_hook(lambda g: g.index_fill(0, torch.tensor([0]), float("nan"))) if r == n - 1 else None
    launched = []
    backward(model, opt, 2, 0, launched)
    if handle is not None:
        handle.remove()
    error = outcome(opt.step)
    after = [p.detach().clone() for p in model.parameters()] + state_tensors(opt)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if not torch.equal(a, b)]
    opt.zero_grad()  # the next step works again on every rank, and draws as step 3 would have
    backward(model, opt, 3, 0)
    opt.step()
    return {"error": error, "changed": changed, "tensors": len(before), "launched": launched,
            "buckets": opt.bucket_count, "after_recovery": [p.detach().clone() for p in model.parameters()],
            "step": opt.birder_step}


def checkpoints() -> dict[str, str]:
    """Another bucket layout is refused with nothing changed; a checkpoint of the pre-bucket schema (one segment
    per param group, no layout keys) loads where that segment is one bucket."""
    out = {}
    model = make_model()
    small = make_opt(model)
    for step in range(2):
        small.zero_grad()
        backward(model, small, step, 0)
        small.step()
    sd_small = small.state_dict()
    model_b = make_model()
    whole = make_opt(model_b, bucket_mb=25.0)  # the default: one bucket for this model
    for step in range(2):
        whole.zero_grad()
        backward(model_b, whole, step, 0)
        whole.step()
    before = [p.detach().clone() for p in model_b.parameters()] + state_tensors(whole)
    out["other_layout"] = outcome(lambda: whole.load_state_dict(sd_small))
    out["other_layout_back"] = outcome(lambda: small.load_state_dict(whole.state_dict()))
    tampered = whole.state_dict()
    tampered["hvd_compress"]["segments"][0]["sizes"] = list(reversed(tampered["hvd_compress"]["segments"][0]["sizes"]))
    out["other_sizes"] = outcome(lambda: whole.load_state_dict(tampered))
    after = [p.detach().clone() for p in model_b.parameters()] + state_tensors(whole)
    out["unchanged"] = str(all(torch.equal(a, b) for a, b in zip(before, after, strict=True)))
    old = copy.deepcopy(whole.state_dict())
    for seg in old["hvd_compress"]["segments"]:
        del seg["group"], seg["sizes"]
    fresh = make_opt(make_model(), bucket_mb=25.0)
    out["old_schema"] = outcome(lambda: fresh.load_state_dict(old))
    out["old_schema_equal"] = str(all(torch.equal(a, b) for a, b in
                                      zip(state_tensors(fresh), state_tensors(whole), strict=True)))
    # overlap on and off share the layout: their checkpoints load into each other
    off = make_opt(make_model(), overlap=False)
    out["on_into_off"] = outcome(lambda: off.load_state_dict(sd_small))
    return out


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
for name, config in CONFIGS.items():
    for overlap in (True, False):
        out["results"][(name, overlap)] = train(*config, overlap)
for overlap in (True, False):
    out["nan"][overlap] = nan_late_bucket(overlap)
out["checkpoints"] = checkpoints()
out["streams_differ"] = bucket_streams()
save(r, out)
