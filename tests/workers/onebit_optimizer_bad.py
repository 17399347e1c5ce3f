"""Bad input to the 1-bit optimizers: each case must raise on every rank, leave the optimizer state
and parameters as they were, and the next good step must still work and keep ranks identical.

argv: out_dir groups(1|2)  -- 2 puts the last layer in its own param group (two fused buckets)
"""

import sys

import torch
from common import outcome, save

import hvd_compress.torch as hc

groups = int(sys.argv[2])
hc.init()
r, n = hc.rank(), hc.size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
params = list(model.parameters())
param_groups = [{"params": params[:2]}, {"params": params[2:]}] if groups == 2 else [{"params": params}]
results: dict[str, str] = {}


def attempt(label: str, fn) -> None:
    results[label] = outcome(fn)


def wrap(base, **options):
    return hc.DistributedOptimizer(base, named_parameters=model.named_parameters(), **options)


# Local argument checks (no communication).
attempt("no_freeze", lambda: wrap(torch.optim.Adam(params), op=hc.OneBitAdam))
attempt("unknown_option", lambda: wrap(torch.optim.Adam(params), op=hc.OneBitAdam, freeze_step=2, beta3=0.5))
attempt("amsgrad", lambda: wrap(torch.optim.Adam(params, amsgrad=True), op=hc.OneBitAdam, freeze_step=2))
attempt("lamb_on_adam", lambda: wrap(torch.optim.Adam(params), op=hc.OneBitLamb, freeze_step=2))
attempt("adam_on_sgd", lambda: wrap(torch.optim.SGD(params, lr=0.1), op=hc.OneBitAdam, freeze_step=2))
attempt("bad_factor", lambda: wrap(hc.Lamb(params), op=hc.OneBitLamb, freeze_step=2, factor_min=5.0))
attempt("bad_floor", lambda: wrap(torch.optim.Adam(params), op=hc.OneBitAdam, freeze_step=2, variance_floor=-1.0))
attempt("allreduce_op", lambda: hc.allreduce(torch.ones(3), op=hc.OneBitAdam))

opt = wrap(hc.Lamb(param_groups, lr=0.01), op=hc.OneBitLamb, freeze_step=2)


def good_step(seed: int) -> None:
    g = torch.Generator().manual_seed(seed * 10 + r)
    opt.zero_grad()
    model(torch.randn(4, 5, generator=g)).pow(2).mean().backward()
    opt.step()


def poisoned_step(seed: int) -> None:
    g = torch.Generator().manual_seed(seed * 10 + r)
    opt.zero_grad()
    # The NaN enters through a gradient hook, before the bucket's reduction starts (with overlap, the default, it
    # starts from the hook: a .grad edited after backward would not reach it).
    poison = (lambda grad: grad.index_fill(0, torch.tensor([0]), float("nan"))) if r == n - 1 else None
    handle = params[-1].register_hook(poison) if poison is not None else None
    try:
        model(torch.randn(4, 5, generator=g)).pow(2).mean().backward()
    finally:
        if handle is not None:
            handle.remove()
    opt.step()


def snapshot() -> list[torch.Tensor]:
    sd = opt.state_dict()
    tensors = [p.detach().clone() for p in params]
    for st in sd["state"].values():
        tensors += [v.clone() for v in st.values() if isinstance(v, torch.Tensor)]
    for seg in sd["hvd_compress"]["buckets"]:
        tensors += [seg["onebit"]["worker_error"], seg["onebit"]["server_error"],
                    torch.tensor(seg["lamb_coeff_freeze"] + seg["last_factor"])]
    return tensors


good_step(1)
before = snapshot()
attempt("nan_warmup", lambda: poisoned_step(2))
results["warmup_unchanged"] = str(all(torch.equal(a, b) for a, b in zip(before, snapshot(), strict=True)))
good_step(3)
good_step(4)  # the first compressed step
before = snapshot()
attempt("nan_compressed", lambda: poisoned_step(5))
results["compressed_unchanged"] = str(all(torch.equal(a, b) for a, b in zip(before, snapshot(), strict=True)))
good_step(6)
# A checkpoint for another model size is refused before anything changes.
other = torch.nn.Linear(3, 3)
other_opt = hc.DistributedOptimizer(hc.Lamb(other.parameters()), named_parameters=other.named_parameters(),
                                    op=hc.OneBitLamb, freeze_step=2)
attempt("wrong_checkpoint", lambda: other_opt.load_state_dict(opt.state_dict()))
attempt("wrong_algorithm", lambda: wrap(torch.optim.Adam(params), op=hc.OneBitAdam, freeze_step=2)
        .load_state_dict(opt.state_dict()))
step = opt.state_dict()["hvd_compress"]["step"]
save(r, {"results": results, "params": [p.detach().clone() for p in params], "step": step})
