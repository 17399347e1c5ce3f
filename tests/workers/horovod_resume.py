"""Resume the Horovod way (Horovod's docs): rank 0 loads the checkpoint, then hvd.broadcast_parameters and
hvd.broadcast_optimizer_state give every rank its model and optimizer state. With hvd_compress optimizers (1-bit
Adam past its warm-up, Adasum, Average) training goes on, alike on every rank, exactly as after
hc.broadcast_optimizer_state."""

import hashlib
import io

import horovod.torch as hvd
import torch
from common import outcome, save

import hvd_compress.torch as hc

hvd.init()
r = hvd.rank()
STEPS, SAVED_AT = 6, 3
OPS = {
    "OneBitAdam": (lambda ps: torch.optim.Adam(ps, lr=0.01), {"freeze_step": 2}),
    "Adasum": (lambda ps: torch.optim.Adam(ps, lr=0.01), {}),
    "Average": (lambda ps: torch.optim.Adam(ps, lr=0.01), {}),
}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def make(name: str, m: torch.nn.Module) -> torch.optim.Optimizer:
    inner, options = OPS[name]
    return hvd.DistributedOptimizer(inner(m.parameters()), named_parameters=m.named_parameters(),
                                    op=getattr(hc, name), **options)


def step(m: torch.nn.Module, opt: torch.optim.Optimizer, s: int) -> str:
    g = torch.Generator().manual_seed(100 * s + r)
    x = torch.randn(8, 6, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(m(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def checkpoint(name: str) -> bytes:
    """Rank 0's checkpoint after SAVED_AT steps (the other ranks' is never read)."""
    m = model()
    opt = make(name, m)
    for s in range(SAVED_AT):
        step(m, opt, s)
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, buf)
    return buf.getvalue()


def resume(name: str, saved: bytes, broadcast_state) -> list[str]:
    m = model()
    opt = make(name, m)
    if r == 0:
        ckpt = torch.load(io.BytesIO(saved), weights_only=False)
        m.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    broadcast_state(opt, root_rank=0)
    return [step(m, opt, s) for s in range(SAVED_AT, STEPS)]


out = {}
for name in OPS:
    saved = checkpoint(name)
    out[f"{name} hvd"] = outcome(lambda name=name, saved=saved: out.setdefault(
        name, resume(name, saved, hvd.broadcast_optimizer_state)))
    out[f"{name} hc"] = resume(name, saved, hc.broadcast_optimizer_state)
save(r, out)
