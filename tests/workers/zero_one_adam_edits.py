"""hc.DistributedOptimizer(op=ZeroOneAdam) with its parameters changed between steps (spec Z20), on parameters whose
gradients are given inputs (as zero_one_adam.py): each scenario names the steps before which some ranks halve or
shift a parameter in place, and those before which ``synchronize_parameters()`` is called.

argv: out_dir scenarios(JSON: name -> {"groups": 1 or 2, "edits": [[step, "all" or [ranks], param, "half",
"shift" or "rebind" (half, as a new tensor)]], "explicit": [steps]}) steps options(JSON) overlap(1|0)
Saves per scenario every step's parameters, kinds and lrs, and the Z20 warnings the run gave; ``resumed``: whether
a run resumed in place from a checkpoint (optimizer or model loaded first) ends as the uninterrupted one."""

import copy
import json
import sys
import warnings

import torch
from common import rank_input, save

import hvd_compress.torch as hc

scenarios, steps, options = json.loads(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
overlap = sys.argv[5] == "1"
SIZES = [13, 30, 7]
hc.init()
r = hc.rank()
torch.set_num_threads(1)
total = sum(SIZES)


def edit(params: list[torch.nn.Parameter], spec: dict, s: int) -> None:
    with torch.no_grad():
        for step, ranks, i, how in spec["edits"]:
            if step == s and (ranks == "all" or r in ranks):
                if how == "rebind":  # a new tensor, its own version counter
                    params[i].data = params[i].data * 0.5
                else:
                    params[i].mul_(0.5) if how == "half" else params[i].add_(0.25)


def run(spec: dict) -> dict:
    x0 = rank_input(0, total, torch.float32, seed=777)  # the same on every rank
    params = [torch.nn.Parameter(p.clone()) for p in x0.split(SIZES)]
    groups = [{"params": params}] if spec["groups"] == 1 else [{"params": params[:-1]}, {"params": params[-1:]}]
    opt = hc.DistributedOptimizer(torch.optim.AdamW(groups, lr=0.01, weight_decay=0.05),
                                  named_parameters=[(f"p{i}", p) for i, p in enumerate(params)], op=hc.ZeroOneAdam,
                                  overlap=overlap, **options)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)
    out = {"trace": [], "kinds": [], "lrs": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(steps):
            edit(params, spec, s)
            if s in spec["explicit"]:
                opt.synchronize_parameters()
            opt.zero_grad()
            out["kinds"].append(opt.step_kind)
            grads = rank_input(r, total, torch.float32, seed=s + 1).split(SIZES)
            sum((p * g).sum() for p, g in zip(params, grads, strict=True)).backward()
            out["lrs"].append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            out["trace"].append(torch.cat([p.detach().reshape(-1) for p in params]).clone())
    out["warned"] = [str(w.message) for w in caught if "changed outside the optimizer" in str(w.message)]
    return out


def resumed_in_place(opt_first: bool) -> dict:
    """A checkpoint of model and optimizer after step 9 loaded into a run that took 2 steps of its own, the optimizer
    first or the model first: neither load is a change (the optimizer's state and the model's go together)."""
    def make() -> tuple[torch.nn.Module, object]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        return model, hc.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01), model.named_parameters(),
                                              op=hc.ZeroOneAdam, overlap=overlap, **options)

    def steps(model: torch.nn.Module, opt: object, a: int, b: int) -> None:
        for t in range(a, b):
            g = torch.Generator().manual_seed(100 * t + r)
            opt.zero_grad()
            x, y = torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    flat = lambda model: torch.cat([p.detach().reshape(-1) for p in model.parameters()])  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, opt = make()
        steps(model, opt, 0, 9)
        saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})  # state_dict() holds views
        steps(model, opt, 9, 16)
        again, opt2 = make()
        steps(again, opt2, 0, 2)
        if opt_first:
            opt2.load_state_dict(saved["opt"])
            again.load_state_dict(saved["model"])
        else:
            again.load_state_dict(saved["model"])
            opt2.load_state_dict(saved["opt"])
        steps(again, opt2, 9, 16)
    return {"equal": torch.equal(flat(model), flat(again)),
            "warned": [str(w.message) for w in caught if "changed outside the optimizer" in str(w.message)]}


save(r, {**{name: run(spec) for name, spec in scenarios.items()},
         "resumed": {order: resumed_in_place(order == "opt_first") for order in ("opt_first", "model_first")}})
