"""Autograd through hc.allreduce and hc.grouped_allreduce (Horovod's *_grad tests, plus rank-dependent
upstream gradients). argv: out_dir mode ("hc": hc.init(); "hvd": hvd.init() first)."""

import sys

import horovod.torch as hvd
import torch
from common import rank_input, save

import hvd_compress.torch as hc

if sys.argv[2] == "hvd":
    hvd.init()
else:
    hc.init()
r = hc.rank()
out = {}
for opname, op in (("Sum", hc.Sum), ("Average", hc.Average)):
    # Horovod's test_horovod_allreduce_grad: loss = allreduce(x).sum(); x.grad is size (Sum) or 1 (Average).
    x = rank_input(r, 17, torch.float32, seed=3).requires_grad_()
    hc.allreduce(x, op=op, name=f"ones.{opname}").sum().backward()
    out[f"ones.{opname}"] = x.grad.clone()
    # Upstream gradients that differ per rank: x.grad = reduction over ranks of c_r.
    x = rank_input(r, 9, torch.float32, seed=4).requires_grad_()
    c = rank_input(r, 9, torch.float32, seed=5)
    (hc.allreduce(x * 2.0, op=op, name=f"coef.{opname}") * c).sum().backward()
    out[f"coef.{opname}"] = (c.clone(), x.grad.clone())
    # Grouped: two tensors, one backward.
    a = rank_input(r, 5, torch.float32, seed=6).requires_grad_()
    b = rank_input(r, 3, torch.float64, seed=7).requires_grad_()
    ca, cb = rank_input(r, 5, torch.float32, seed=8), rank_input(r, 3, torch.float64, seed=9)
    ya, yb = hc.grouped_allreduce([a, b], op=op, name=f"group.{opname}")
    ((ya * ca).sum() + (yb * cb).sum()).backward()
    out[f"group.{opname}"] = ((ca, cb), (a.grad.clone(), b.grad.clone()), (ya.detach(), yb.detach()))
save(r, out)
