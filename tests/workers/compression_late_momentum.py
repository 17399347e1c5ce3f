"""DGC momentum inside the compression (``compression=topk(ratio, momentum=mu)``) and a wrapped SGD that gets its own
momentum after DistributedOptimizer was built: ``param_groups[0]['momentum']`` set (then ``step()``, ``synchronize()``,
or ``step()`` inside ``skip_synchronize()`` after a good ``synchronize()``) or ``add_param_group`` with momentum (then
``step()``). Each must raise on every rank before any collective, with the parameters and the compression state (error,
velocity, step) unchanged; with the momentum undone, the same call (with the same gradients) takes the step on
every rank, alike. A momentum set on one rank only raises ValueError there and RejectedInputError (with that
reason) on the others, from the same call, with nothing changed anywhere.

argv: out_dir
"""

import torch
from common import outcome, save

import hvd_compress.torch as hc

hc.init()
r = hc.rank()
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
opt = hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                              compression=hc.Compression.topk(0.25, momentum=0.9))
extra = torch.nn.Parameter(torch.zeros(2))  # the group added later (never in the graph)


def backward(step: int) -> None:
    opt.zero_grad()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(10 * step + r))
    model(x).square().sum().backward()


def snapshot() -> list[torch.Tensor]:
    """The parameters, then each fused buffer's error, velocity and step."""
    out = [p.detach().clone() for p in [*model.parameters(), extra]]
    for buf in opt.state_dict()["hvd_compress"]["buffers"]:
        out += [buf["error"].clone(), buf["velocity"].clone(), torch.tensor([buf["step"]])]
    return out


def set_momentum(value: float) -> None:
    opt.param_groups[0]["momentum"] = value


def add_group() -> None:
    opt.add_param_group({"params": [extra], "momentum": 0.9})


def step_skipping_synchronize() -> None:
    with opt.skip_synchronize():
        opt.step()


def synchronize_then_step() -> None:
    opt.synchronize()
    step_skipping_synchronize()


# name -> (change after construction, the call that must raise, undo, the retry that then takes the step,
# synchronize() before the change)
CASES = {
    "group_step": (lambda: set_momentum(0.9), opt.step, lambda: set_momentum(0.0), opt.step, False),
    "group_synchronize": (lambda: set_momentum(0.9), opt.synchronize, lambda: set_momentum(0.0),
                          synchronize_then_step, False),
    "group_skip_synchronize": (lambda: set_momentum(0.9), step_skipping_synchronize, lambda: set_momentum(0.0),
                               step_skipping_synchronize, True),
    "added_group_step": (add_group, opt.step, opt.param_groups.pop, opt.step, False),
    # Only rank 1 changes its momentum: its check fails alone, and the other ranks must raise too, not wait.
    "one_rank_step": (lambda: set_momentum(0.9 if r == 1 else 0.0), opt.step, lambda: set_momentum(0.0), opt.step,
                      False),
    "one_rank_synchronize": (lambda: set_momentum(0.9 if r == 1 else 0.0), opt.synchronize,
                             lambda: set_momentum(0.0), synchronize_then_step, False),
}

res = {}
for step in range(2):  # error and velocity nonzero before the cases
    backward(step)
    opt.step()
for i, (name, (change, call, undo, retry, synchronized)) in enumerate(CASES.items()):
    backward(2 + i)
    if synchronized:
        opt.synchronize()
    before = snapshot()
    change()
    res[name] = outcome(call)
    res[f"{name}.unchanged"] = all(torch.equal(a, b) for a, b in zip(before, snapshot(), strict=True))
    undo()
    retry()  # the same gradients, now stepped: the ranks still agree
    res[f"{name}.retried"] = [p.detach().clone() for p in model.parameters()]
save(r, res)
