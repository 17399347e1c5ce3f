"""Bad input to op=ZeroOneAdam, run inside the zero_one_adam.py worker: option and optimizer checks, then NaN
gradients on the last rank only at the first step of each kind, and a negative lr: each must raise on every rank
with the parameters and every state buffer unchanged, and the step must then go through with good gradients."""

from __future__ import annotations

import hashlib

import torch
from common import outcome

import hvd_compress.torch as hc


def _digest(params: list[torch.nn.Parameter], opt) -> str:
    sd = opt.state_dict()
    ours = sd["hvd_compress"]
    parts = [p.detach().reshape(-1) for p in params]
    parts += [s[k].reshape(-1) for s in sd["state"].values() for k in ("exp_avg", "exp_avg_sq")]
    parts += [seg[k].reshape(-1) for seg in ours["buckets"] for k in ("u", "anchor")]
    parts += [seg["onebit"][k] for seg in ours["buckets"] for k in ("worker_error", "server_error")]
    tail = repr((ours["step"], ours["counters"], [seg["lrs"] for seg in ours["buckets"]]))
    return hashlib.sha256(torch.cat(parts).numpy().tobytes()).hexdigest() + tail


def bad_cases(rank: int, size: int) -> dict[str, str]:
    out: dict[str, str] = {}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    params = list(model.parameters())

    def wrap(base, **options):
        return hc.DistributedOptimizer(base, named_parameters=model.named_parameters(), op=hc.ZeroOneAdam, **options)

    out["unknown_option"] = outcome(lambda: wrap(torch.optim.AdamW(params), freeze_step=3))
    out["negative_freeze"] = outcome(lambda: wrap(torch.optim.AdamW(params), var_freeze_step=-1))
    out["zero_clipper"] = outcome(lambda: wrap(torch.optim.AdamW(params), local_step_clipper=0))
    out["float_scaler"] = outcome(lambda: wrap(torch.optim.AdamW(params), var_update_scaler=2.5))
    out["negative_floor"] = outcome(lambda: wrap(torch.optim.AdamW(params), variance_floor=-0.01))
    out["string_correction"] = outcome(lambda: wrap(torch.optim.AdamW(params), variance_bias_correction="yes"))
    out["int_reset"] = outcome(lambda: wrap(torch.optim.AdamW(params), reset_momentum_at_sync=1))
    out["sgd"] = outcome(lambda: wrap(torch.optim.SGD(params, lr=0.1)))
    out["adam_l2"] = outcome(lambda: wrap(torch.optim.Adam(params, weight_decay=0.1)))
    out["amsgrad"] = outcome(lambda: wrap(torch.optim.AdamW(params, amsgrad=True)))
    out["onebit_checkpoint"] = outcome(lambda: wrap(torch.optim.AdamW(params)).load_state_dict(
        hc.DistributedOptimizer(torch.optim.AdamW(params), named_parameters=model.named_parameters(),
                                op=hc.OneBitAdam, freeze_step=2).state_dict()))
    out["powersgd_checkpoint"] = outcome(lambda: wrap(torch.optim.AdamW(params)).load_state_dict(
        hc.DistributedOptimizer(torch.optim.AdamW(params), named_parameters=model.named_parameters(),
                                op=hc.PowerSGD).state_dict()))

    opt = wrap(torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01), var_freeze_step=4, var_update_scaler=2,
               local_step_scaler=1, local_step_clipper=2)
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(rank))

    def backward(poison: bool) -> None:
        """The NaN comes out of backward itself: with overlap a bucket may be reduced before an edit of .grad."""
        opt.zero_grad()
        inputs = x.clone()
        if poison and rank == size - 1:
            inputs[0, 0] = float("nan")
        model(inputs).square().mean().backward()

    seen = set()
    for _ in range(10):
        kind = opt.step_kind
        if kind not in seen:
            seen.add(kind)
            before = _digest(params, opt)
            backward(poison=True)
            out[f"nan_{kind}"] = outcome(opt.step)
            out[f"nan_{kind}_unchanged"] = str(_digest(params, opt) == before)
        backward(poison=False)
        opt.step()
    before = _digest(params, opt)
    backward(poison=False)
    opt.param_groups[0]["lr"] = -1.0
    out["negative_lr"] = outcome(opt.step)
    out["negative_lr_unchanged"] = str(_digest(params, opt) == before)
    opt.param_groups[0]["lr"] = 1e-2
    plain = torch.optim.AdamW(params).state_dict()
    plain["state"] = {i: {"step": torch.tensor(9.0)} for i in range(len(params))}
    out["plain_checkpoint_phase2"] = outcome(lambda: opt.load_state_dict(plain))
    backward(poison=False)
    out["after"] = outcome(opt.step)
    out["final"] = torch.cat([p.detach().reshape(-1) for p in params])
    out["step"] = opt.state_dict()["hvd_compress"]["step"]
    return out
