"""hc.DistributedOptimizer(op=Average/Sum) with gradient buckets reduced during backward (overlap=True) and after
it (overlap=False), on the same model and data; then a Python error in one rank's background reduction.

Saves, per configuration and mode: the parameters after every step, the buckets started while backward was still
running (counted from a hook on the input's gradient, the end of backward), after each backward pass and after
the last one returned, and the loss
average of a main-thread allreduce issued between backward() and step().
"""

import sys
import time

import torch
from common import save

import hvd_compress.torch as hc
import hvd_compress.torch.dense as face

steps = int(sys.argv[2])
hc.init()
r = hc.rank()
torch.set_num_threads(1)
BUCKET_MB = 64 / (1 << 20)  # 64-byte buckets: 5 buckets for this model (see tests/test_overlap.py)

# (name, op, backward passes per step, gradient_predivide_factor, compression, zero the grads through the model,
#  an unused parameter registered first)
CONFIGS = [
    ("average", hc.Average, 1, 1.0, None, False, False),
    ("sum_accum_set_to_none", hc.Sum, 2, 1.0, None, True, False),
    ("predivide_fp16", hc.Average, 1, 2.0, hc.Compression.fp16, False, False),
    ("unused_parameter", hc.Average, 1, 1.0, None, False, True),
]


class WithUnused(torch.nn.Module):
    """A parameter that gets no gradient, registered first: its bucket (the last) can start only in step()."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = torch.nn.Linear(3, 3)
        self.net = make_model(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_model(unused: bool = False) -> torch.nn.Module:
    torch.manual_seed(1234)
    if unused:
        return WithUnused()
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    )


def batch(step: int, rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100_000 * step + 100 * rank + micro)
    x = torch.randn(5, 6, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def train(op, passes, predivide, compression, model_zero, unused, overlap) -> dict:
    model = make_model(unused)
    options = {"gradient_predivide_factor": predivide} if predivide != 1.0 else {}
    if compression is not None:
        options["compression"] = compression
    opt = hc.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), named_parameters=model.named_parameters(),
        op=op, backward_passes_per_step=passes, overlap=overlap, bucket_mb=BUCKET_MB, **options,
    )
    params, during, after, per_pass, loss_avg = [], [], [], [], []
    for step in range(steps):
        (model.zero_grad if model_zero else opt.zero_grad)()
        seen = []
        for micro in range(passes):
            x, y = batch(step, r, micro)
            x.requires_grad_(True)
            x.register_hook(lambda g, seen=seen: seen.append(opt._hvdc.reductions.launched))
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            per_pass.append(opt._hvdc.reductions.launched)
        during.append(seen[-1])
        after.append(opt._hvdc.reductions.launched)
        # A main-thread collective between backward and step: ordered after the buckets already started.
        loss_avg.append(hc.allreduce(loss.detach(), name="loss").item())
        opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    return {"params": params, "during": during, "after": after, "per_pass": per_pass, "loss_avg": loss_avg,
            "buckets": len(opt._hvdc.buckets), "overlap": opt.overlap}


out = {"results": {}}
for name, *config in CONFIGS:
    for overlap in (True, False):
        out["results"][(name, overlap)] = train(*config, overlap)

# A Python error in rank 1's reduction of bucket 1, raised on its background thread before the core call.
armed = True
real_allreduce = face.allreduce_


def failing_allreduce(tensor, *args, name=None, **kwargs):
    if armed and r == 1 and (name or "").split("|")[0].split("@")[0] == "DistributedOptimizer.grad.1":
        raise RuntimeError("injected failure in rank 1's bucket 1")
    return real_allreduce(tensor, *args, name=name, **kwargs)


face.allreduce_ = failing_allreduce
model = make_model()
opt = hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), op=hc.Average, bucket_mb=BUCKET_MB)
x, y = batch(0, r, 0)
torch.nn.functional.mse_loss(model(x), y).backward()
before = [p.detach().clone() for p in model.parameters()]
start = time.monotonic()
try:
    opt.step()
    out["error"] = "no error"
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
out["error_seconds"] = time.monotonic() - start
out["unchanged_after_error"] = all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
armed = False
opt.zero_grad()  # the next step works again on every rank
torch.nn.functional.mse_loss(model(x), y).backward()
opt.step()
out["after_recovery"] = [p.detach().clone() for p in model.parameters()]
save(r, out)
