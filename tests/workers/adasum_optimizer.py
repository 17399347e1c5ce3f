"""hc.DistributedOptimizer(op=Adasum) in several set-ups; saves parameters per step and final state."""

import hashlib
import sys

import torch
from common import save

import hvd_compress.torch as hc

mode = sys.argv[2]
steps = int(sys.argv[3])
hc.init()
r = hc.rank()
torch.set_num_threads(1)


def make_model(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(dtype)


def batch(step: int, rank: int, micro: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(100_000 * step + 100 * rank + micro)
    x = torch.randn(5, 6, generator=g)
    return x.to(dtype), x.sum(dim=1, keepdim=True).sin().to(dtype)


def digest(model) -> str:
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}
out = {}
if mode in OPTIMIZERS or mode == "accum":
    name = "sgd" if mode == "accum" else mode
    passes = 2 if mode == "accum" else 1
    model = make_model()
    out["init"] = [p.detach().clone() for p in model.parameters()]
    opt = hc.DistributedOptimizer(
        OPTIMIZERS[name](model.parameters()), named_parameters=model.named_parameters(), op=hc.Adasum,
        backward_passes_per_step=passes, bucket_mb=1e-6,  # one bucket per parameter: 4 fused calls per step
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    hashes, losses, params, launched = [], [], [], []
    for step in range(steps):
        opt.zero_grad()
        for micro in range(passes):
            x, y = batch(step, r, micro)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
        # buckets whose Adasum was started by the hooks, before step(): communication overlaps backward
        launched.append(opt._hvdc.alg.reductions.launched)
        opt.step()
        sched.step()
        losses.append(loss.item())
        hashes.append(digest(model))
        params.append([p.detach().clone() for p in model.parameters()])
    out.update(hashes=hashes, losses=losses, params=params, lr=opt.param_groups[0]["lr"], stats=opt.comm_stats())
    out.update(launched=launched, buckets=len(opt._hvdc.alg.buckets))
    state = opt.state_dict()
    fresh = hc.DistributedOptimizer(OPTIMIZERS[name](model.parameters()), op=hc.Adasum)
    fresh.load_state_dict(state)
    out["state_roundtrip"] = all(
        torch.equal(a, b)
        for s1, s2 in zip(state["state"].values(), fresh.state_dict()["state"].values(), strict=True)
        for a, b in ((s1[k], s2[k]) for k in s1)
        if isinstance(a, torch.Tensor)
    )
elif mode in ("bfloat16", "float16"):
    dtype = getattr(torch, mode)
    model = make_model(dtype)
    opt = hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), op=hc.Adasum)
    hashes = []
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step, r, 0, dtype)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        hashes.append(digest(model))
    out.update(hashes=hashes, dtypes=[str(p.dtype) for p in model.parameters()])
elif mode == "scaler":
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    opt = hc.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05), op=hc.Adasum, grad_scaler=scaler
    )
    hashes, scales, skipped = [], [], []
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step, r, 0)
        if step == 3 and r == hc.size() - 1:
            x[0, 0] = float("inf")  # only the last rank overflows at step 3
        before = digest(model)
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        hashes.append(digest(model))
        skipped.append(digest(model) == before)
        scales.append(scaler.get_scale())
    out.update(hashes=hashes, scales=scales, skipped=skipped)
elif mode == "train":
    model = make_model()
    opt = hc.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.02), op=hc.Adasum)
    losses = []
    x_eval, y_eval = batch(999, 0, 0)
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step, r, 0)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        with torch.no_grad():
            losses.append(torch.nn.functional.mse_loss(model(x_eval), y_eval).item())
    out.update(losses=losses, hash=digest(model))
save(r, out)
