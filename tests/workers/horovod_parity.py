"""Horovod habits that silently went wrong in hc: op constants, grouped default, re-wrapping an optimizer,
broadcasting integer buffers, and the synchronize()/clip/skip_synchronize() pattern.

argv: out_dir, mode ("hc": hc.init() alone; "hvd": hvd.init() first). Saves inputs and results; the test
computes what they must be with the NumPy reference.
"""

import copy
import gc
import sys
import warnings

import horovod.torch as hvd
import torch
from common import outcome, rank_input, save

import hvd_compress.torch as hc

mode = sys.argv[2]
if mode == "hvd":
    hvd.init()
else:
    hc.init()
r, n = hc.rank(), hc.size()
out: dict = {"constants": {k: int(getattr(hvd, k)) == int(getattr(hc, k)) for k in ("Average", "Sum", "Adasum")}}

# 1. Horovod's own constants (bare ints) reach hc and mean what they mean in Horovod.
x = rank_input(r, 7, torch.float32, seed=1)
out["x"] = x
out["hvd_average"] = hc.allreduce(x, op=hvd.Average)
out["hvd_sum"] = hc.allreduce(x, op=hvd.Sum)
out["int_average"] = hc.allreduce(x, op=0)
# 2. grouped_allreduce defaults to Average, as Horovod's.
ys = [rank_input(r, 5, torch.float32, seed=2), rank_input(r, 3, torch.float32, seed=3)]
out["ys"] = ys
out["grouped_default"] = hc.grouped_allreduce(ys)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + r)
    inp = torch.randn(4, 6, generator=g)
    return inp, inp.sum(dim=1, keepdim=True) * 3.0


def model_and_grads(model: torch.nn.Module, step: int) -> None:
    inp, target = batch(step)
    torch.nn.functional.mse_loss(model(inp), target).backward()


# 3. A second wrapper on the same model (after an Average one and after an Adasum one) replaces the first:
#    no "computed 2 times" error, no stale background Adasum launches, and it steps as a fresh wrapper would.
torch.manual_seed(0)
model = torch.nn.Linear(6, 1)
first = hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), op=hvd.Average)
adasum = hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), op=hc.Adasum)
del first, adasum
gc.collect()
start = [p.detach().clone() for p in model.parameters()]
opt = hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), op=hvd.Average)
rewrapped = hc.DistributedOptimizer(opt, model.named_parameters(), op=hvd.Average)  # wrapping a wrapper
del opt
# A deep copy of the model, wrapped on its own (an EMA or evaluation copy), leaves the original's hooks alone.
twin = copy.deepcopy(model)
twin_opt = hc.DistributedOptimizer(torch.optim.SGD(twin.parameters(), lr=0.1), twin.named_parameters())
for step in range(3):
    rewrapped.zero_grad()
    model_and_grads(model, step)
    rewrapped.step()
out["rewrap"] = {"start": start, "final": [p.detach().clone() for p in model.parameters()]}
rewrapped.zero_grad()
out["hook_alive"] = outcome(lambda: [model_and_grads(model, 9) for _ in range(2)])
rewrapped.zero_grad()
del rewrapped
gc.collect()

# 4. broadcast_parameters of a state_dict with integer and bool buffers (BatchNorm), with or without Horovod.
torch.manual_seed(10 + r)
bn = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
bn.train()
for _ in range(r + 1):
    bn(torch.randn(8, 3))
extra = {
    "mask": torch.rand(5) > 0.5,
    "counts": torch.randint(0, 1000, (2, 3), dtype=torch.int32),
    "big": torch.tensor([2**40 + r], dtype=torch.int64),
}
state = {**bn.state_dict(), **extra}
hc.broadcast_parameters(state, root_rank=0)
out["broadcast"] = {k: v.clone() for k, v in state.items()}

# 5. Gradient clipping as Horovod documents it, with op=Sum (a second reduction would be n times larger).
torch.manual_seed(0)
clip_model = torch.nn.Linear(6, 1)
clip_opt = hc.DistributedOptimizer(
    torch.optim.SGD(clip_model.parameters(), lr=0.05), clip_model.named_parameters(), op=hc.Sum
)
clip_start = [p.detach().clone() for p in clip_model.parameters()]
clip_opt.zero_grad()
model_and_grads(clip_model, 0)
clip_opt.synchronize()
reduced = [p.grad.detach().clone() for p in clip_model.parameters()]
norm = torch.nn.utils.clip_grad_norm_(clip_model.parameters(), max_norm=0.5)
with clip_opt.skip_synchronize():
    clip_opt.step()
out["clip"] = {"start": clip_start, "reduced": reduced, "norm": float(norm),
               "final": [p.detach().clone() for p in clip_model.parameters()]}
# step() after synchronize() without skip_synchronize(): Horovod's warning, and no second reduction.
clip_opt.zero_grad()
model_and_grads(clip_model, 1)
clip_opt.synchronize()
before = [p.detach().clone() for p in clip_model.parameters()]
reduced = [p.grad.detach().clone() for p in clip_model.parameters()]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    clip_opt.step()
out["warned"] = [str(w.message) for w in caught]
after = [p.detach().clone() for p in clip_model.parameters()]
out["no_double"] = {"before": before, "reduced": reduced, "after": after}
# step() in skip_synchronize() with no synchronize(): refused, nothing changed.
clip_opt.zero_grad()
model_and_grads(clip_model, 2)
before = [p.detach().clone() for p in clip_model.parameters()]


def unsynced_step() -> None:
    with clip_opt.skip_synchronize():
        clip_opt.step()


out["unsynced"] = outcome(unsynced_step)
out["unsynced_unchanged"] = all(torch.equal(a, b) for a, b in zip(before, clip_model.parameters(), strict=True))

# The same pattern for Adasum and the 1-bit optimizers: synchronize(), then step() in skip_synchronize().
for name, op, base, options in (
    ("adasum", hc.Adasum, lambda ps: torch.optim.SGD(ps, lr=0.05), {}),
    ("onebit_adam", hc.OneBitAdam, lambda ps: torch.optim.Adam(ps, lr=0.01), {"freeze_step": 2}),
    ("onebit_lamb", hc.OneBitLamb, lambda ps: hc.Lamb(ps, lr=0.01), {"freeze_step": 2}),
):
    torch.manual_seed(0)
    m = torch.nn.Linear(6, 1)
    o = hc.DistributedOptimizer(base(m.parameters()), m.named_parameters(), op=op, **options)
    record = {"warmup_grads": [], "hashes": []}
    for step in range(4):
        o.zero_grad()
        model_and_grads(m, step)
        o.synchronize()
        if name != "adasum" and step < 2:
            record["warmup_grads"].append([p.grad.detach().clone() for p in m.parameters()])
        if name != "adasum":  # Adasum's local steps consumed the gradients: an edit raises (test_clipping.py)
            torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm=1.0)
        with o.skip_synchronize():
            o.step()
        record["hashes"].append(torch.cat([p.detach().reshape(-1) for p in m.parameters()]).clone())
    out[name] = record
save(r, out)
