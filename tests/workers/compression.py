"""hc.allreduce(compression=...) and hc.DistributedOptimizer(compression=...) on real ranks; saves what the
test compares against hvd_compress.reference.compression.

argv: out_dir modes (comma list of)
  collective: every compressor x dtype x size x op, STEPS consecutive calls per (compressor, dtype, size, op)
    with one CompressionState; inputs common.rank_input(seed = 100 * step + 7). Saves results, errors, steps and
    (top-k with DGC momentum) velocities.
  optimizer: DistributedOptimizer(SGD(lr=1), compression=...) on one float32 parameter whose gradient is
    common.rank_input(seed = 50 + step); saves the parameter after every step.
  dgc: top-k with all of Deep Gradient Compression (DGC_COMPRESSOR: momentum, local clipping, sparsity warm-up)
    over DGC_STEPS calls of common.rank_input(seed = 200 + step) * (step + 1), float32, Average, on one tensor and
    on SEGMENTS; saves each call's result, error and velocity, and whether the same calls resumed from a
    state_dict() taken after call 2 into a fresh state gave the same bits.
  bytes: bytes this rank sent for one call of 2**16 float32 elements, dense and under every compressor.
"""

import sys

import torch
from common import DTYPES, rank_input, save

import hvd_compress.torch as hc
from hvd_compress.ops import comm_stats

hc.init()
r, n = hc.rank(), hc.size()
modes = sys.argv[2].split(",")
saved = {}
STEPS = 3
COMPRESSORS = {
    "fp16": hc.Compression.fp16,
    "bf16": hc.Compression.bf16,
    "topk": hc.Compression.topk(0.05),
    "randomk": hc.Compression.randomk(0.1, seed=12345678901),
    "topk_dgc": hc.Compression.topk(0.05, momentum=0.9),
    "topk_dgc_nomask": hc.Compression.topk(0.05, momentum=0.9, momentum_masking=False),
}

# (dtype, numel, op): float32 at every size and both ops; the other dtypes at two sizes.
CASES = [("float32", m, op) for m in (1, 13, 1000, 4099) for op in ("Average", "Sum")]
CASES += [(d, m, "Average") for d in ("float64", "float16", "bfloat16") for m in (13, 4099)]
# A fused buffer of several tensors (an empty one too): each sends its own ratio of elements.
SEGMENTS = [5, 0, 1000, 94]
CASES += [("float32", sum(SEGMENTS), "Average")]

if "collective" in modes:
    results = {}
    for cname, comp in COMPRESSORS.items():
        for dname, numel, op in CASES:
            sizes = SEGMENTS if numel == sum(SEGMENTS) else None
            state = hc.CompressionState(numel, comp, sizes=sizes) if comp.stateful else None
            calls = []
            for step in range(STEPS):
                x = rank_input(r, numel, DTYPES[dname], seed=100 * step + 7)
                before = x.clone()
                y = hc.allreduce(x, op=getattr(hc, op), compression=comp, state=state, name=f"{cname}.{numel}")
                assert torch.equal(x, before), "allreduce(compression=) changed its input"
                assert y.dtype == x.dtype and y.shape == x.shape
                velocity = state.velocity.clone() if state is not None and state.velocity is not None else None
                calls.append((y.clone(), state.error.clone() if state else None, state.step if state else 0, velocity))
            results[(cname, dname, numel, op)] = calls
    saved["results"] = results
if "optimizer" in modes:
    numel = 2000
    out = {}
    for cname, comp in COMPRESSORS.items():
        w = torch.nn.Parameter(torch.zeros(numel))
        opt = hc.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)], op=hc.Average,
                                      compression=comp)
        params = []
        for step in range(4):
            opt.zero_grad()
            (w * rank_input(r, numel, torch.float32, seed=50 + step)).sum().backward()
            opt.step()
            params.append(w.detach().clone())
        out[cname] = params
    saved["params"] = out
if "dgc" in modes:
    comp = hc.Compression.topk(0.05, momentum=0.9, momentum_masking=False, clip_norm=80.0, warmup_steps=3,
                               warmup_stages=2, dense_steps=1)
    out = {}
    for numel in (1000, sum(SEGMENTS)):
        sizes = SEGMENTS if numel == sum(SEGMENTS) else None
        state = hc.CompressionState(numel, comp, sizes=sizes)
        calls, checkpoint = [], None
        for step in range(5):
            x = rank_input(r, numel, torch.float32, seed=200 + step) * (step + 1)
            y = hc.allreduce(x, op=hc.Average, compression=comp, state=state, name=f"dgc.{numel}")
            calls.append((y.clone(), state.error.clone(), state.velocity.clone()))
            if step == 1:
                checkpoint = {k: v.clone() if torch.is_tensor(v) else v for k, v in state.state_dict().items()}
        resumed = hc.CompressionState(numel, comp, sizes=sizes)
        resumed.load_state_dict(checkpoint)
        same = []
        for step in (2, 3, 4):
            x = rank_input(r, numel, torch.float32, seed=200 + step) * (step + 1)
            y = hc.allreduce(x, op=hc.Average, compression=comp, state=resumed, name=f"dgc.{numel}")
            want_y, want_error, want_velocity = calls[step]
            same.append(torch.equal(y, want_y) and torch.equal(resumed.error, want_error)
                        and torch.equal(resumed.velocity, want_velocity) and resumed.step == step + 1)
        out[numel] = {"calls": calls, "resumed_same": same, "describe": comp.describe()}
    saved["dgc"] = out
if "bytes" in modes:
    numel = 1 << 16
    stats = {}
    one_percent = {"topk": hc.Compression.topk(0.01), "randomk": hc.Compression.randomk(0.01, seed=1),
                   "topk_0.2": hc.Compression.topk(0.2), "topk_0.25": hc.Compression.topk(0.25)}
    for cname, comp in {"none": hc.Compression.none, **COMPRESSORS, **one_percent}.items():
        state = hc.CompressionState(numel, comp) if comp.stateful else None
        x = rank_input(r, numel, torch.float32, seed=3)
        comm_stats(reset=True)
        hc.allreduce_(x, compression=comp, state=state, name="bytes")
        stats[cname] = comm_stats(reset=True)
    saved["stats"] = stats
save(r, saved)
