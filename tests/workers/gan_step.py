"""A GAN's training loop (DCGAN's, as torch's examples have it): two wrapped optimizers, the generator's backward
also filling the discriminator's gradients, which the discriminator's next ``zero_grad()`` drops. 4 steps of each.

argv: out_dir cases (comma list of op[:nooverlap], op a name of ``hc``)
Saves per rank, per case: the parameters of G and D after the loop, or the error raised. Rank 0 also saves
``reference``: the same loop in one process, Adam on the exact average of the ranks' gradients (op=Average's rule).
"""

from __future__ import annotations

import sys

import horovod.torch as hvd
import torch
from common import flat_parameters, save, set_exact_average_gradients

import hvd_compress.torch as hc

hvd.init()
torch.set_num_threads(1)
rank, size = hvd.rank(), hvd.size()
OPTIONS = {"OneBitAdam": {"freeze_step": 2}, "PowerSGD": {"start_powerSGD_iter": 2, "min_compression_rate": 1}}
STEPS, LR = 4, 0.01
BCE = torch.nn.BCEWithLogitsLoss()


def nets() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    g = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    d = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    return g, d


def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(16, 8, generator=gen) + 2, torch.randn(16, 4, generator=gen)


def d_loss(g: torch.nn.Module, d: torch.nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    return BCE(d(real), torch.ones(16, 1)) + BCE(d(fake.detach()), torch.zeros(16, 1))


def run(case: str) -> dict:
    op, _, flag = case.partition(":")
    g, d = nets()
    options = {**OPTIONS.get(op, {}), **({"overlap": False} if flag == "nooverlap" else {})}
    opt_d = hc.DistributedOptimizer(torch.optim.Adam(d.parameters(), lr=LR), d.named_parameters(prefix="D"),
                                    op=getattr(hc, op), **options)
    opt_g = hc.DistributedOptimizer(torch.optim.Adam(g.parameters(), lr=LR), g.named_parameters(prefix="G"),
                                    op=getattr(hc, op), **options)
    gen = torch.Generator().manual_seed(10 + rank)
    for _ in range(STEPS):
        real, z = batch(gen)
        opt_d.zero_grad()
        fake = g(z)
        d_loss(g, d, real, fake).backward()
        opt_d.step()
        opt_g.zero_grad()
        BCE(d(fake), torch.ones(16, 1)).backward()  # also fills D's gradients
        opt_g.step()
    return {"g": flat_parameters(g), "d": flat_parameters(d)}


def reference() -> dict:
    g, d = nets()
    opt_d, opt_g = torch.optim.Adam(d.parameters(), lr=LR), torch.optim.Adam(g.parameters(), lr=LR)
    gens = [torch.Generator().manual_seed(10 + r) for r in range(size)]
    for _ in range(STEPS):
        batches = [batch(gen) for gen in gens]
        fakes = [g(z) for _, z in batches]
        set_exact_average_gradients(list(d.parameters()), [lambda r=r, f=f: d_loss(g, d, r, f)
                                                           for (r, _), f in zip(batches, fakes, strict=True)])
        opt_d.step()
        set_exact_average_gradients(list(g.parameters()), [lambda f=f: BCE(d(f), torch.ones(16, 1)) for f in fakes])
        opt_g.step()
    return {"g": flat_parameters(g), "d": flat_parameters(d)}


out = {}
for case in sys.argv[2].split(","):
    try:
        out[case] = run(case)
    except Exception as e:
        out[case] = f"{type(e).__name__}: {e}"
if rank == 0:
    out["reference"] = reference()
save(rank, out)
