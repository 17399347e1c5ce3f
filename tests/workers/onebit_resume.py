"""Exact resume: a run stopped at step `stop` and resumed from its checkpoint (new model and
optimizer objects, loaded with torch.load) must end bit-identical to the run never stopped.

argv: out_dir algo(adamw|lamb) steps stop freeze_step
Saves per rank: final parameter hashes of both runs, the loss curve, and the bytes of one warm-up
and one compressed step.
"""

import hashlib
import sys

import torch
from common import out_dir, save

import hvd_compress.torch as hc

algo, steps, stop, freeze = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
hc.init()
r = hc.rank()
torch.set_num_threads(1)


def make(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256),
                                torch.nn.Tanh(), torch.nn.Linear(256, 4))
    hc.broadcast_parameters(model.state_dict(), root_rank=0)
    if algo == "lamb":
        base, op = hc.Lamb(model.parameters(), lr=2e-3, weight_decay=0.01), hc.OneBitLamb
    else:
        base, op = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01), hc.OneBitAdam
    opt = hc.DistributedOptimizer(base, named_parameters=model.named_parameters(), op=op, freeze_step=freeze)
    return model, opt


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * step + r)
    x = torch.randn(16, 64, generator=g)
    return x, (x[:, :4] * x[:, 4:8]).tanh()


def train(model, opt, sched, first: int, last: int, losses: list[float], stats: dict[int, dict]) -> None:
    for step in range(first, last):
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        stats[step] = opt.comm_stats()


def digest(model: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def schedule(opt):
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)


# Run A: never stopped.
model, opt = make(seed=1)
sched = schedule(opt)
losses_a: list[float] = []
stats: dict[int, dict] = {}
train(model, opt, sched, 0, steps, losses_a, stats)
final_a = digest(model)
state_a = opt.state_dict()

# Run B: stopped at `stop`, checkpointed to disk, resumed in fresh objects built from another seed.
model, opt = make(seed=1)
sched = schedule(opt)
losses_b: list[float] = []
train(model, opt, sched, 0, stop, losses_b, {})
path = out_dir() / f"ckpt{r}.pt"
torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, path)
del model, opt, sched
model, opt = make(seed=99)
sched = schedule(opt)
ckpt = torch.load(path, weights_only=False)
ours = ckpt["opt"]["hvd_compress"]
ours["segments"] = ours.pop("buckets")  # as 0.1.0 named the per-bucket list: it must load the same
model.load_state_dict(ckpt["model"])
opt.load_state_dict(ckpt["opt"])
sched.load_state_dict(ckpt["sched"])
train(model, opt, sched, stop, steps, losses_b, {})
final_b = digest(model)
state_b = opt.state_dict()
errors_equal = all(
    torch.equal(sa["onebit"]["worker_error"], sb["onebit"]["worker_error"])
    and torch.equal(sa["onebit"]["server_error"], sb["onebit"]["server_error"])
    for sa, sb in zip(state_a["hvd_compress"]["buckets"], state_b["hvd_compress"]["buckets"], strict=True)
)
save(r, {"final_a": final_a, "final_b": final_b, "losses_a": losses_a, "losses_b": losses_b,
         "errors_equal": errors_equal, "dense_bytes": stats[0]["bytes_sent"],
         "onebit_bytes": stats[steps - 1]["bytes_sent"],
         "numel": sum(p.numel() for p in model.parameters())})
