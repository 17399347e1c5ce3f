"""An LR schedule on the optimizer the user wrapped acts on every op's steps, as with Horovod's wrapper (which shares
the wrapped optimizer's param-group dicts).

argv: out_dir, the number of steps. Saves per rank, per op, the flat parameters after each step of these runs
(StepLR halving the rate after every step): ``before`` (StepLR made on the inner optimizer before wrapping),
``after`` (on the wrapper), ``routed`` (made before, wrapped by ``hvd.DistributedOptimizer(op=hc.X)``; for Average
and Sum Horovod's own wrapper), ``resumed`` (as ``before``, with the wrapper's own ``state_dict()`` loaded midway),
``broadcast`` (as ``before``, with ``hvd.broadcast_optimizer_state`` right after wrapping), ``by_hand`` (the
scheduled rates written into the wrapper's param groups before each step; op given by its name, a string),
``constant`` (no schedule), ``zero`` (the inner optimizer's lr set to 0 after wrapping) and ``to_zero`` (as
``constant`` until step RESUME_AT, the inner optimizer's lr 0 from there: error feedback made at the old lr must not
move anything); and ``initial``. Also
the outcome of ``op=`` a reduction that is no optimizer's (Max by name, hc.Min) and of an unknown name.
"""

import sys
import warnings

import horovod.torch as hvd
import torch
from common import flat_parameters, outcome, save

import hvd_compress.torch as hc

hvd.init()
torch.set_num_threads(1)
r = hvd.rank()
STEPS, RESUME_AT = int(sys.argv[2]), 2
# A scheduler made on the inner optimizer never sees it step (the wrapper steps): torch warns of the order.
warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")


def adam(ps):
    return torch.optim.Adam(ps, lr=0.01)


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.05)


OPS = {  # past each op's warm-up within STEPS, so that both stages follow the rate
    "Average": (sgd, {}),
    "Sum": (sgd, {}),
    "TopK": (sgd, {"compression": hc.Compression.topk(0.5), "overlap": False}),
    "Adasum": (adam, {}),
    "OneBitAdam": (adam, {"freeze_step": 2}),
    "ZeroOneAdam": (adam, {"var_freeze_step": 2, "local_step_scaler": 1, "local_step_clipper": 2,
                    "variance_bias_correction": True}),
    "OneBitLamb": (lambda ps: hc.Lamb(ps, lr=0.01), {"freeze_step": 2}),
    "SLAMB": (lambda ps: hc.Lamb(ps, lr=0.01), {"compress_ratio": 0.5, "sync_interval": 2}),
    "Birder": (lambda ps: hc.Birder(ps, lr=0.01), {}),
    "SignSGD": (sgd, {}),
    "PowerSGD": (sgd, {"matrix_approximation_rank": 1, "start_powerSGD_iter": 1}),
}
HOROVODS = {"Average": hvd.Average, "Sum": hvd.Sum}  # Horovod's own wrapper for these


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def run(name: str, mode: str) -> list[torch.Tensor]:
    make, options = OPS[name]
    op_name = "Average" if name == "TopK" else name
    m = model()
    inner = make(m.parameters())
    lr0 = inner.param_groups[0]["lr"]
    before = ("before", "routed", "resumed", "broadcast")
    scheduler = torch.optim.lr_scheduler.StepLR(inner, 1, 0.5) if mode in before else None
    if mode == "routed":
        op = HOROVODS.get(name, getattr(hc, op_name))
        opt = hvd.DistributedOptimizer(inner, named_parameters=m.named_parameters(), op=op, **options)
    else:
        op = op_name if mode == "by_hand" else getattr(hc, op_name)  # op's name, a string, in one run
        opt = hc.DistributedOptimizer(inner, named_parameters=m.named_parameters(), op=op, **options)
    if mode == "broadcast":  # as every Horovod script starts (routed to hc's for hc's wrappers)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    if mode == "after":
        scheduler = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    if mode == "zero":
        for group in inner.param_groups:
            group["lr"] = 0.0
    seen = []
    for s in range(STEPS):
        if mode == "by_hand":
            for group in opt.param_groups:
                group["lr"] = lr0 * 0.5**s
        if mode == "to_zero" and s == RESUME_AT:
            for group in inner.param_groups:
                group["lr"] = 0.0
        if mode == "resumed" and s == RESUME_AT:
            opt.load_state_dict(opt.state_dict())
        g = torch.Generator().manual_seed(100 * s + r)
        x = torch.randn(8, 6, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        seen.append(flat_parameters(m))
    return seen


out = {}
for name in OPS:
    # Horovod's own wrapper has no top-k compression: TopK has no routed run
    modes = [m for m in ("before", "after", "routed", "resumed", "broadcast", "by_hand", "constant", "zero",
                                 "to_zero")
             if not (name == "TopK" and m == "routed")]
    out[name] = {mode: run(name, mode) for mode in modes}
    out[name]["initial"] = flat_parameters(model())
# A reduction of one tensor is no optimizer's op, by name or by constant; nor is an unknown name
refused = {str(op): outcome(lambda op=op: hc.DistributedOptimizer(sgd(model().parameters()), op=op))
           for op in ("Max", hc.Min, "Bogus")}
save(r, {"ops": out, "refused": refused})
