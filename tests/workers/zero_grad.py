"""What ``zero_grad()`` leaves in ``.grad`` after a step, per op, beside Horovod's own ``hvd.DistributedOptimizer``:
for each op and each call form (``zero_grad()``, ``set_to_none=True``, ``set_to_none=False``) whether every gradient
is None, else whether all are zero, after three steps (each starts from what the zero_grad before it left), and the
parameters those steps reached."""

import sys

import horovod.torch as hvd
import torch
from common import save, small_wrapped

import hvd_compress.torch as hc

OPS = ("Average", "Sum", "Adasum", "OneBitAdam", "OneBitLamb", "SLAMB", "Birder")
FORMS = {"default": {}, "set_to_none=True": {"set_to_none": True}, "set_to_none=False": {"set_to_none": False}}


def grads_after(model: torch.nn.Module, opt: torch.optim.Optimizer, form: dict) -> str:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(hvd.rank()))
    for _ in range(3):  # each step starts from the gradients the zero_grad before it left
        opt.zero_grad(**form)
        model(x).square().sum().backward()
        opt.step()
    params[f"{op} {name}"] = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad(**form)
    grads = [p.grad for p in model.parameters()]
    if all(g is None for g in grads):
        return "None"
    return "zero" if all(g is not None and not g.any() for g in grads) else f"other: {grads}"


hvd.init()
hc.init()
out: dict[str, str] = {}
params: dict[str, list[torch.Tensor]] = {}
for name, form in FORMS.items():
    op = "horovod"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2),
                                   named_parameters=model.named_parameters())
    try:
        out[f"horovod {name}"] = grads_after(model, opt, form)
    except TypeError:  # Horovod 0.28's zero_grad() takes no set_to_none
        out[f"horovod {name}"] = "TypeError"
    for op in OPS:
        options = {"freeze_step": 1} if op in ("OneBitAdam", "OneBitLamb") else {}
        model, opt = small_wrapped(op, **options)
        out[f"{op} {name}"] = grads_after(model, opt, form)
save(hc.rank(), {"grads": out, "params": params, "argv": sys.argv[1:]})
