"""Hyper-parameters that differ between ranks: each op (the algorithm ops, and op=Average, with top-k and with
PowerSGD, wrapping SGD with momentum, whose param groups are compared whole), with and without overlap, trains three
equal steps; then the last rank's first param group takes another lr (as a ReduceLROnPlateau fed that rank's own
metric would), and the next step that communicates must raise MismatchError on every rank, naming this rank's
hyper-parameters, with the parameters and the optimizer state as they were; with the lr equal again the step is
taken, and the ranks stay equal, also where every rank sets the lr between backward and step (buckets reducing in
the background read the groups as they were when launched, not as the main thread changes them). argv: out_dir."""

from __future__ import annotations

import hashlib

import torch
from common import outcome, save

import hvd_compress.torch as hc

hc.init()
r, n = hc.rank(), hc.size()
torch.set_num_threads(1)
OPS = {"OneBitAdam": {"freeze_step": 2}, "OneBitLamb": {"freeze_step": 2},
       "ZeroOneAdam": {"var_freeze_step": 2, "local_step_scaler": 1, "variance_bias_correction": True},
       "SLAMB": {"sync_interval": 2}, "Birder": {},
       "SignSGD": {},
       # The reductions any optimizer steps after: the wrapped optimizer's every hyper-parameter counts.
       "Average": {}, "TopK": {"compression": hc.Compression.topk(0.25)},
       "PowerSGD": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}}
#: The op each case runs (the case's own name where it is one).
OP_OF = {"TopK": "Average"}
WRAPS_SGD = ("SignSGD", "Average", "TopK", "PowerSGD")


def make(op: str, overlap: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    # PowerSGD without biases: a bucket's first collective is then P's, after its Q was orthogonalized in place.
    bias = op != "PowerSGD"
    model = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=bias), torch.nn.ReLU(), torch.nn.Linear(32, 4, bias=bias))
    # Two param groups whose hyper-parameters differ from each other (that is fine: they are equal across ranks).
    groups = [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 2e-2}]
    inner = (hc.Birder(groups, lr=1e-2) if op == "Birder" else hc.Lamb(groups, lr=1e-2) if op in ("SLAMB", "OneBitLamb")
             else torch.optim.SGD(groups, lr=1e-2, momentum=0.0 if op == "SignSGD" else 0.9) if op in WRAPS_SGD
             else torch.optim.AdamW(groups, lr=1e-2))
    return model, hc.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                          op=getattr(hc, OP_OF.get(op, op)),
                                          overlap=overlap, **OPS[op])


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, s: int, lr_after_backward: float | None = None) -> None:
    opt.zero_grad()
    model(torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * s + r))).pow(2).mean().backward()
    if lr_after_backward is not None:  # on every rank alike, while buckets may still be reducing in the background
        opt.param_groups[0]["lr"] = lr_after_backward
    opt.step()


def _feed(h: hashlib._Hash, value: object) -> None:
    if isinstance(value, torch.Tensor):
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(str(k).encode())
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)):
        for v in value:
            _feed(h, v)
    else:
        h.update(repr(value).encode())


def digest(model: torch.nn.Module, opt: torch.optim.Optimizer | None = None) -> str:
    """The parameters' bytes and, with ``opt``, its state (the algorithm's included), not its param groups (whose lr
    differs on purpose)."""
    h = hashlib.sha256()
    _feed(h, list(model.parameters()))
    if opt is not None:
        _feed(h, {k: v for k, v in opt.state_dict().items() if k != "param_groups"})
    return h.hexdigest()


results: dict[str, dict[str, str]] = {}
for op in OPS:
    for overlap in (False,) if op == "TopK" else (True, False):  # top-k reduces in step(): overlap is refused
        model, opt = make(op, overlap)
        for s in range(3):
            step(model, opt, s)
        res = {"before": digest(model, opt)}
        if r == n - 1:
            opt.param_groups[0]["lr"] = 3e-2
        # 0/1 Adam's local steps communicate nothing: the first step that does raises (within a few steps).
        caught, s = "no error", 3
        while caught == "no error" and s < 12:
            res["before"], res["params"] = digest(model, opt), digest(model)
            caught = outcome(lambda s=s, model=model, opt=opt: step(model, opt, s))
            s += 1
        res["caught"] = caught
        res["after_error"] = digest(model, opt)
        opt.param_groups[0]["lr"] = 1e-2
        res["next"] = outcome(lambda s=s, model=model, opt=opt: step(model, opt, s))
        # Every rank sets the lr between backward and step (a warm-up written by hand): no error, ranks equal.
        res["late_lr"] = outcome(lambda s=s, model=model, opt=opt: [
            step(model, opt, s + 1 + k, lr_after_backward=1e-2 * (1 + 0.1 * k)) for k in range(4)])
        res["end"] = digest(model)
        results[f"{op}/{int(overlap)}"] = res
save(r, {"results": results})
