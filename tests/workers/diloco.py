"""hc.DistributedOptimizer(op=hc.DiLoCo) on the task of diloco_task.py: each rank saves its parameters after every
step of every config (the test replays them in the NumPy reference), the bytes each step sent, runs resumed from a
mid-phase state_dict(), the outcome of bad options, the op by name and through hvd.DistributedOptimizer. argv:
out_dir, then "main", "regrow-save" (2 ranks: rank 0 writes the REGROW checkpoint into out_dir) or "regrow-load <path>"
(continue from that checkpoint at this rank count)."""

from __future__ import annotations

import io
import sys

import numpy as np
import torch
from common import outcome, save
from diloco_task import CONFIGS, OUTER, OUTER_RESUME, REGROW, RESUMES, SHAPES, SIZES, STEPS, gradient, initial

import hvd_compress.torch as hc


def model_from(flat: np.ndarray) -> list[torch.nn.Parameter]:
    out, offset = [], 0
    for shape, size in zip(SHAPES, SIZES, strict=True):
        out.append(torch.nn.Parameter(torch.from_numpy(flat[offset : offset + size].copy()).view(shape)))
        offset += size
    return out


def flat_of(params: list[torch.nn.Parameter]) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in params]).numpy().copy()


def make(params: list[torch.nn.Parameter], options: dict, op=None) -> torch.optim.Optimizer:
    return hc.DistributedOptimizer(torch.optim.SGD(params, lr=0.5), op=hc.DiLoCo if op is None else op, **options)


def options_of(name: str) -> dict:
    """The DiLoCo options of a config of CONFIGS or OUTER (with its outer optimizer's factory)."""
    if name in CONFIGS:
        return CONFIGS[name]
    options, cls, kwargs = OUTER[name]
    return {**options, "outer_optimizer": lambda p: getattr(torch.optim, cls)(p, **kwargs)}


def steps(rank: int, params, opt, start: int, stop: int) -> tuple[list[np.ndarray], list[int]]:
    flats, sent = [], []
    for t in range(start, stop):
        g = torch.from_numpy(gradient(rank, t, flat_of(params)))
        offset = 0
        for p, size in zip(params, SIZES, strict=True):
            p.grad = g[offset : offset + size].view_as(p).clone()
            offset += size
        opt.step()
        flats.append(flat_of(params))
        sent.append(opt.comm_stats()["bytes_sent"])
    return flats, sent


def checkpoint(params, opt) -> dict:
    buf = io.BytesIO()
    torch.save({"params": flat_of(params).tolist(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def resumed(rank: int, name: str, at: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(the uninterrupted run's parameters after each step from ``at`` on, the resumed run's)."""
    params = model_from(initial())
    opt = make(params, options_of(name))
    steps(rank, params, opt, 0, at)
    saved = checkpoint(params, opt)
    want, _ = steps(rank, params, opt, at, STEPS)
    params2 = model_from(np.array(saved["params"], dtype=np.float32))
    opt2 = make(params2, options_of(name))
    opt2.load_state_dict(saved["opt"])
    got, _ = steps(rank, params2, opt2, at, STEPS)
    return want, got


def bad_options() -> dict[str, str]:
    def wrap(**kw):
        return make(model_from(initial()), kw)

    cases = {
        "sync_every0": {"sync_every": 0},
        "sync_every_float": {"sync_every": 2.5},
        "outer_lr0": {"outer_lr": 0.0},
        "outer_lr_nan": {"outer_lr": float("nan")},
        "momentum1": {"outer_momentum": 1.0},
        "nesterov_str": {"nesterov": "yes"},
        "fragments_over_h": {"sync_every": 2, "fragments": 3},
        "fragments_over_params": {"sync_every": 8, "fragments": 6},
        "delay_h": {"sync_every": 3, "sync_delay": 3},
        "mix1": {"mix": 1.0},
        "compression": {"outer_compression": "int3"},
        "unknown": {"outer_beta": 0.9},
        "bucket": {"bucket_mb": 1},
        "predivide": {"gradient_predivide_factor": 2.0},
        "outer_instance": {"outer_optimizer": torch.optim.SGD([torch.zeros(2)], lr=0.7)},
        "outer_returns_other": {"outer_optimizer": lambda p: [torch.optim.SGD(p, lr=0.7)]},
        "outer_other_params": {"outer_optimizer": lambda p: torch.optim.SGD([torch.zeros(2)], lr=0.7)},
        "outer_and_outer_lr": {"outer_optimizer": lambda p: torch.optim.SGD(p, lr=0.7), "outer_lr": 0.5},
        "buffers_not_tensors": {"buffers": [torch.zeros(3), 1.5]},
    }
    out = {name: outcome(lambda kw=kw: wrap(**kw)) for name, kw in cases.items()}
    for kind in ("none", "int8"):  # a NaN in rank 1's parameters at a sync: refused on every rank
        params = model_from(initial())
        opt = make(params, {"sync_every": 1, "outer_compression": kind})
        if hc.rank() == 1:
            with torch.no_grad():
                params[2].view(-1)[5] = float("nan")
        out[f"nan_{kind}"] = outcome(lambda opt=opt, params=params: steps(hc.rank(), params, opt, 0, 1))
    params = model_from(initial())  # rank 1's schedule differs: its first sync is not the others'
    opt = make(params, {"sync_every": 3 if hc.rank() == 1 else 2})
    out["schedules_differ"] = outcome(lambda: steps(hc.rank(), params, opt, 0, 3))
    a, b = make(model_from(initial()), {"sync_every": 3}), make(model_from(initial()), {"sync_every": 4})
    out["load_other_options"] = outcome(lambda: b.load_state_dict(a.state_dict()))
    c = make(model_from(initial()), {"sync_every": 3, "outer_optimizer": torch.optim.Adam})
    out["load_other_outer"] = outcome(lambda: c.load_state_dict(a.state_dict()))
    return out


def quantized(rank: int) -> dict:
    """The core's int8/int4 collective alone, at sizes that pad: each (bits, op, numel) -> (inputs, errors,
    result, new errors); and its refusals on every rank (a NaN on rank 1 only, bits that differ by rank)."""
    from hvd_compress.ops.block_quant import block_quant_allreduce_
    from hvd_compress.ops.constants import ReduceOp

    out = {}
    for bits in (8, 4):
        for op in ("Average", "Sum"):
            for numel in (5, 1000):
                gen = np.random.default_rng(100 * bits + numel + 7 * rank)
                x = (gen.standard_normal(numel) * np.exp(gen.standard_normal(numel))).astype(np.float32)
                e = (gen.standard_normal(numel) * 0.01).astype(np.float32)
                result, error = x.copy(), e.copy()
                block_quant_allreduce_(result, bits, error, op=getattr(ReduceOp, op), name=f"q{bits}{op}{numel}")
                out[(bits, op, numel)] = (x, e, result, error)
    x, e = np.ones(70, np.float32), np.zeros(70, np.float32)
    if rank == 1:
        x[3] = np.nan
    before = e.copy()
    refusals = {"nan": outcome(lambda: block_quant_allreduce_(x, 8, e, name="nan")), "nan_error_kept":
                bool(np.array_equal(e, before))}
    refusals["bits"] = outcome(lambda: block_quant_allreduce_(np.ones(70, np.float32), 8 if rank == 0 else 4))
    return {"calls": out, "refusals": refusals}


def via_horovod(rank: int) -> tuple[list[np.ndarray], list[np.ndarray], bool]:
    """hvd.DistributedOptimizer(op=hc.DiLoCo) after hvd.init() runs hc's; the op by name is the same op."""
    import horovod.torch as hvd

    from hvd_compress.torch.wrapping import wrapped_engine

    hvd.init()
    runs, wrapped = [], False
    for wrap, op in ((hvd.DistributedOptimizer, hc.DiLoCo), (hc.DistributedOptimizer, "diloco")):
        params = model_from(initial())
        opt = wrap(torch.optim.SGD(params, lr=0.5), op=op, sync_every=2)
        wrapped = wrapped or (wrap is hvd.DistributedOptimizer and wrapped_engine(opt) is not None)
        runs.append(steps(rank, params, opt, 0, 4)[0])
    return runs[0], runs[1], wrapped


def main() -> None:
    hc.init()
    rank = hc.rank()
    mode = sys.argv[2:]
    if mode and mode[0] == "regrow-save":
        name, at = REGROW
        params = model_from(initial())
        opt = make(params, CONFIGS[name])
        steps(rank, params, opt, 0, at)
        state = opt.state_dict()
        name, at = OUTER_RESUME
        params2 = model_from(initial())
        opt2 = make(params2, options_of(name))
        steps(rank, params2, opt2, 0, at)
        state2 = opt2.state_dict()
        if rank == 0:
            torch.save({"params": flat_of(params).tolist(), "opt": state}, sys.argv[1] + "/regrow.pt")
            torch.save({"params": flat_of(params2).tolist(), "opt": state2}, sys.argv[1] + "/regrow_outer.pt")
        save(rank, {"done": True})
        return
    if mode and mode[0] == "regrow-load":
        name, at = REGROW
        saved = torch.load(mode[1], weights_only=True)  # every rank loads rank 0's file
        params = model_from(np.array(saved["params"], dtype=np.float32))
        opt = make(params, CONFIGS[name])
        opt.load_state_dict(saved["opt"])
        flats, _ = steps(rank, params, opt, at, STEPS)
        name, at = OUTER_RESUME  # the outer optimizer's checkpoint, beside the first one
        saved = torch.load(mode[1].replace("regrow.pt", "regrow_outer.pt"), weights_only=True)
        params = model_from(np.array(saved["params"], dtype=np.float32))
        opt = make(params, options_of(name))
        opt.load_state_dict(saved["opt"])
        save(rank, {"flats": flats, "outer_flats": steps(rank, params, opt, at, STEPS)[0]})
        return
    runs = {}
    for name in [*CONFIGS, *OUTER]:
        params = model_from(initial())
        opt = make(params, options_of(name))
        flats, sent = steps(rank, params, opt, 0, STEPS)
        runs[name] = {"flats": flats, "sent": sent}
    save(rank, {
        "runs": runs,
        "resumed": {f"{name}@{at}": resumed(rank, name, at) for name, at in [*RESUMES, OUTER_RESUME]},
        "bad": bad_options(),
        "quantized": quantized(rank),
        "horovod": via_horovod(rank),
    })


if __name__ == "__main__":
    main()
