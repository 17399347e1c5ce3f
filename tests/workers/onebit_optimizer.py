"""hc.DistributedOptimizer(op=OneBitAdam/OneBitLamb) on a model whose gradients are given inputs.

The loss sum_i <P_i, G_i(step, rank)> makes every parameter's gradient exactly G_i, so the test can
feed the same per-rank gradients to the reference simulation. Two parameter groups (two fused
buckets, each with its own 1-bit state). Saves the parameters of every step, the per-step hash, the
learning rates used, the final optimizer state and the bytes of each step.

argv: out_dir algo(adam|adamw|lamb|lamb-dense) dtype steps freeze_step sizes(comma list; the last one is group 2)
      variance_floor dead(comma list of elements whose gradient is 0 on every rank through warm-up, as a
      ReLU unit dead in warm-up; may be empty) [bucket_mb (default: the optimizer's) overlap(1|0, default 1)]
"""

import hashlib
import sys

import torch
from common import DTYPES, rank_input, save

import hvd_compress.torch as hc

algo, dtype_name, steps, freeze = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
sizes = [int(s) for s in sys.argv[6].split(",")]
floor, dead = float(sys.argv[7]), [int(i) for i in sys.argv[8].split(",") if i]
bucket_mb = float(sys.argv[9]) if len(sys.argv) > 9 else None
overlap = sys.argv[10] != "0" if len(sys.argv) > 10 else True
dtype = DTYPES[dtype_name]
hc.init()
r = hc.rank()
total = sum(sizes)
x0 = rank_input(0, total, dtype, seed=777)  # the same on every rank
params = [torch.nn.Parameter(p.clone()) for p in x0.split(sizes)]
groups = [{"params": params[:-1]}, {"params": params[-1:]}]
if algo == "adam":
    base, op = torch.optim.Adam(groups, lr=0.01, weight_decay=0.05), hc.OneBitAdam
elif algo == "adamw":
    base, op = torch.optim.AdamW(groups, lr=0.01, weight_decay=0.05), hc.OneBitAdam
else:  # lamb, or lamb-dense: plain hc.Lamb behind a dense average (the uncompressed rule)
    base = hc.Lamb(groups, lr=0.01, weight_decay=0.05, min_coeff=0.01, max_coeff=10.0)
    op = hc.Average if algo == "lamb-dense" else hc.OneBitLamb
options = {} if op == hc.Average else {"freeze_step": freeze, "variance_floor": floor, "overlap": overlap}
if bucket_mb is not None:
    options["bucket_mb"] = bucket_mb
opt = hc.DistributedOptimizer(base, named_parameters=[(f"p{i}", p) for i, p in enumerate(params)], op=op,
                              **options)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
trace, hashes, lrs, stats = [], [], [], []
for step in range(steps):
    opt.zero_grad()
    flat_grad = rank_input(r, total, dtype, seed=step + 1)
    if step < freeze:
        flat_grad[dead] = 0
    grads = flat_grad.split(sizes)
    loss = sum((p * g).sum() for p, g in zip(params, grads, strict=True))
    loss.backward()
    lrs.append(opt.param_groups[0]["lr"])
    opt.step()
    sched.step()
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    trace.append(flat.clone())
    hashes.append(hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest())
    stats.append(opt.comm_stats())
sd = opt.state_dict()
save(r, {"buckets": [seg.sizes for seg in opt._hvdc.alg.buckets] if op != hc.Average else [],
         "trace": trace, "hashes": hashes, "lrs": lrs, "stats": stats, "state": sd,
         "exp_avg": torch.cat([sd["state"][i]["exp_avg"].reshape(-1) for i in range(len(params))])})
