"""What the overlap workers of the bucketed algorithms (tests/workers/onebit_overlap.py, birder_overlap.py,
slamb_overlap.py) share: the model (5 buckets of 64 bytes) and its param groups, the batches every rank re-creates,
one backward pass that records how many buckets had started when it reached the input, the training loop with
overlap on or off, a NaN injected into one bucket on the last rank, the checkpoint layout checks, and clipping
``.grad`` between synchronize() and step() without overlap."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from common import outcome

BUCKET_MB = 64 / (1 << 20)  # 64-byte buckets: [b3, w3], [b2], [w2], [b1], [w1] for one group


def make_model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    )


def param_groups(model: torch.nn.Module, groups: bool) -> list:
    """The model's parameters, or with ``groups`` two param groups (the last layer at another lr)."""
    params = list(model.parameters())
    return [{"params": params[:-2]}, {"params": params[-2:], "lr": 0.005}] if groups else params


def batch(step: int, rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100_000 * step + 100 * rank + micro)
    x = torch.randn(5, 6, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def backward(model, opt, step: int, micro: int, rank: int, seen: list[int] | None = None) -> None:
    """One backward pass; ``seen`` gets the buckets started when the gradient reached the input (end of backward)."""
    x, y = batch(step, rank, micro)
    x.requires_grad_(True)
    if seen is not None:
        x.register_hook(lambda g: seen.append(opt._hvdc.alg.launched))
    torch.nn.functional.mse_loss(model(x), y).backward()


def run_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, first: int, end: int, rank: int) -> None:
    """Steps ``first`` to ``end`` - 1, one backward pass each."""
    for step in range(first, end):
        opt.zero_grad()
        backward(model, opt, step, 0, rank)
        opt.step()


def snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer, state: Callable[[object], list]) -> list:
    """The parameters, then ``state(opt)``."""
    return [p.detach().clone() for p in model.parameters()] + state(opt)


def parameter_state(sd: dict) -> list[torch.Tensor]:
    """Copies of every per-parameter state tensor of the optimizer ``state_dict()`` ``sd``, by key, parameter by
    parameter."""
    out = []
    for st in sd["state"].values():
        out += [v.clone() for _, v in sorted(st.items()) if isinstance(v, torch.Tensor)]
    return out


def nan_step(make_opt: Callable[[torch.nn.Module], torch.optim.Optimizer], state: Callable[[object], list],
             taken: int, layer: int, rank: int, size: int) -> tuple[dict, torch.optim.Optimizer]:
    """After ``taken`` steps, step ``taken`` + 1 with a NaN on the last rank in ``model[layer].weight``'s gradient,
    then one more step. Returns the error, the indices of the ``snapshot`` tensors the refused step changed (and how
    many there are), the buckets started during its backward, the bucket count, the parameters after the next step;
    and the optimizer."""
    model = make_model()
    opt = make_opt(model)
    run_steps(model, opt, 0, taken, rank)
    before = snapshot(model, opt, state)
    opt.zero_grad()
    weight = model[layer].weight
    poison = rank == size - 1
    handle = weight.register_hook(lambda g: g.index_fill(0, torch.tensor([0]), float("nan"))) if poison else None
    launched: list[int] = []
    backward(model, opt, taken, 0, rank, launched)
    if handle is not None:
        handle.remove()
    error = outcome(opt.step)
    changed = [i for i, (a, b) in enumerate(zip(before, snapshot(model, opt, state), strict=True))
               if not torch.equal(a, b)]
    run_steps(model, opt, taken + 1, taken + 2, rank)  # the next step works again on every rank
    return {"error": error, "changed": changed, "tensors": len(before), "launched": launched,
            "buckets": opt.bucket_count, "after_recovery": [p.detach().clone() for p in model.parameters()]}, opt


def train(make_opt: Callable[[torch.nn.Module], torch.optim.Optimizer], state: Callable[[object], list],
          steps: int, passes: int, rank: int, abandon_at: int | None = None) -> dict:
    """``steps`` steps of ``passes`` backward passes each; at step ``abandon_at`` one backward pass is given up
    (``zero_grad()`` before ``step()``: its started buckets are undone). Returns the parameters after every step,
    the buckets started during backward and by its end, the bucket count, the mode and ``state(opt)``."""
    model = make_model()
    opt = make_opt(model)
    params, during, after = [], [], []
    for step in range(steps):
        if step == abandon_at:
            opt.zero_grad()
            backward(model, opt, step + 77, 0, rank)
        opt.zero_grad()
        seen: list[int] = []
        for micro in range(passes):
            backward(model, opt, step, micro, rank, seen)
        during.append(seen[-1])
        after.append(opt._hvdc.alg.launched)
        opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    return {"params": params, "during": during, "after": after, "buckets": opt.bucket_count,
            "overlap": opt.overlap, "state": state(opt)}


def checkpoint_layouts(make_opt: Callable[..., torch.optim.Optimizer], state: Callable[[object], list], steps: int,
                       rank: int, layout_free: bool = False) -> dict[str, str]:
    """After ``steps`` steps: a checkpoint of another bucket layout (64-byte buckets vs one bucket) is refused with
    nothing changed, or with ``layout_free`` (SLAMB: state over all D) loads into a fresh optimizer as saved; one
    with its parameter sizes reordered is refused with nothing changed; one of the pre-bucket schema (one bucket
    per param group and dtype, no layout keys) loads where that bucket is one bucket; overlap on and off load each
    other's. ``make_opt(model, **options)``; the outcomes as ``common.outcome`` strings."""
    def trained(**options: object) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = make_model()
        opt = make_opt(model, **options)
        run_steps(model, opt, 0, steps, rank)
        return model, opt

    out = {}
    _, small = trained()
    sd_small = small.state_dict()
    model_b, whole = trained(bucket_mb=25.0)  # the default: one bucket for this model
    before = snapshot(model_b, whole, state)
    if layout_free:
        for key, source, mb in (("other_layout", small, 25.0), ("other_layout_back", whole, BUCKET_MB)):
            fresh = make_opt(make_model(), bucket_mb=mb)
            out[key] = outcome(lambda fresh=fresh, source=source: fresh.load_state_dict(source.state_dict()))
            out[f"{key}_equal"] = str(all(torch.equal(a, b) for a, b in zip(state(fresh), state(source), strict=True)))
    else:
        out["other_layout"] = outcome(lambda: whole.load_state_dict(sd_small))
        out["other_layout_back"] = outcome(lambda: small.load_state_dict(whole.state_dict()))
    tampered = whole.state_dict()
    tampered["hvd_compress"]["buckets"][0]["sizes"] = list(reversed(tampered["hvd_compress"]["buckets"][0]["sizes"]))
    out["other_sizes"] = outcome(lambda: whole.load_state_dict(tampered))
    out["unchanged"] = str(all(torch.equal(a, b) for a, b in zip(before, snapshot(model_b, whole, state), strict=True)))
    old = copy.deepcopy(whole.state_dict())
    for seg in old["hvd_compress"]["buckets"]:
        del seg["group"], seg["sizes"]
    fresh = make_opt(make_model(), bucket_mb=25.0)
    out["old_schema"] = outcome(lambda: fresh.load_state_dict(old))
    out["old_schema_equal"] = str(all(torch.equal(a, b) for a, b in zip(state(fresh), state(whole), strict=True)))
    off = make_opt(make_model(), overlap=False)
    out["on_into_off"] = outcome(lambda: off.load_state_dict(sd_small))
    return out


def clip_without_overlap(make_opt: Callable[[torch.nn.Module], torch.optim.Optimizer], steps: int, rank: int,
                         halve_loss: bool) -> list[torch.Tensor]:
    """``make_opt(model)`` with overlap=False: ``steps`` steps of synchronize(), ``.grad`` halved, step() inside
    skip_synchronize(); or the loss halved. Returns the parameters (the two must be bit-identical: halving is
    exact)."""
    model = make_model()
    opt = make_opt(model)
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step, rank, 0)
        loss = torch.nn.functional.mse_loss(model(x), y)
        (loss * 0.5 if halve_loss else loss).backward()
        if halve_loss:
            opt.step()
            continue
        opt.synchronize()
        for p in model.parameters():
            p.grad.mul_(0.5)
        with opt.skip_synchronize():
            opt.step()
    return [p.detach().clone() for p in model.parameters()]
