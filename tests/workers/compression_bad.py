"""Bad calls of compression= on real ranks: every rank records what it raised, and the state afterwards.

argv: out_dir. Each case is one collective call that must raise on every rank (no hang); a good call after
the cases shows that the ranks still agree.
"""

import torch
from common import outcome, rank_input, save

import hvd_compress.torch as hc

hc.init()
r, n = hc.rank(), hc.size()
numel = 300
res = {}

# Compression on a non-dense op, through the collective: the core rejects it on every rank.
topk = hc.Compression.topk(0.1)
state = hc.CompressionState(numel, topk)
x = rank_input(r, numel, torch.float32, seed=1)
res["adasum"] = outcome(lambda: hc.allreduce(x, op=hc.Adasum, compression=topk, state=state))
res["adasum_step"] = state.step

# Mismatched seed (random-k), ratio (top-k) and kind across ranks: MismatchError on every rank.
rk_state = hc.CompressionState(numel, hc.Compression.randomk(0.1, seed=r))
res["seed"] = outcome(lambda: hc.allreduce(x, compression=hc.Compression.randomk(0.1, seed=r), state=rk_state))
tk = hc.Compression.topk(0.1 if r == 0 else 0.2)
res["ratio"] = outcome(lambda: hc.allreduce(x, compression=tk, state=hc.CompressionState(numel, tk)))
kind = hc.Compression.topk(0.1) if r == 0 else hc.Compression.randomk(0.1)
res["kind"] = outcome(lambda: hc.allreduce(x, compression=kind, state=hc.CompressionState(numel, kind)))
res["fp16_vs_none"] = outcome(lambda: hc.allreduce(x, compression=hc.Compression.fp16 if r == 0 else None))
dgc = hc.Compression.topk(0.1, momentum=0.9 if r == 0 else 0.5)
res["momentum"] = outcome(lambda: hc.allreduce(x, compression=dgc, state=hc.CompressionState(numel, dgc)))
masking = hc.Compression.topk(0.1, momentum=0.9, momentum_masking=r == 0)
res["masking"] = outcome(lambda: hc.allreduce(x, compression=masking, state=hc.CompressionState(numel, masking)))

# NaN / Inf on the last rank only: UsageError on every rank, tensor, error and step untouched.
for bad in ("nan", "inf"):
    cases = (("topk", topk), ("randomk", hc.Compression.randomk(0.1, seed=3)), ("fp16", hc.Compression.fp16),
             ("topk_dgc", hc.Compression.topk(0.1, momentum=0.9)),
             # clipped on the finite ranks before the call is rejected: the tensor must come back as it was
             ("topk_dgc_clip", hc.Compression.topk(0.1, momentum=0.9, clip_norm=1.0, warmup_steps=5)))
    for cname, comp in cases:
        st = hc.CompressionState(numel, comp) if comp.stateful else None
        if st is not None:  # one good call first, so that the error is not zero
            hc.allreduce(rank_input(r, numel, torch.float32, seed=2), compression=comp, state=st)
        before = (st.error.clone(), st.step, None if st.velocity is None else st.velocity.clone()) if st else None
        y = rank_input(r, numel, torch.float32, seed=4)
        if r == n - 1:
            y[17] = float(bad)
        y_before = y.clone()
        res[f"{bad}.{cname}"] = outcome(lambda y=y, comp=comp, st=st: hc.allreduce_(y, compression=comp, state=st))
        res[f"{bad}.{cname}.untouched"] = y.numpy().tobytes() == y_before.numpy().tobytes() and (
            st is None or (torch.equal(st.error, before[0]) and st.step == before[1]
                           and (st.velocity is None or torch.equal(st.velocity, before[2]))))

# A state of another size: rejected on every rank.
res["state_size"] = outcome(lambda: hc.allreduce(x, compression=topk, state=hc.CompressionState(numel + r, topk)))

# The optimizer refuses compression with a non-dense op, and a ratio outside (0, 1].
w = torch.nn.Parameter(torch.zeros(4))
res["optimizer_adasum"] = outcome(lambda: hc.DistributedOptimizer(torch.optim.SGD([w], lr=0.1), op=hc.Adasum,
                                                                  compression=topk))
res["optimizer_onebit"] = outcome(lambda: hc.DistributedOptimizer(torch.optim.Adam([w]), op=hc.OneBitAdam,
                                                                  freeze_step=2, compression=hc.Compression.fp16))

# DGC momentum inside the compression and the wrapped SGD's own momentum: refused (momentum applied twice).
res["optimizer_dgc_twice"] = outcome(lambda: hc.DistributedOptimizer(
    torch.optim.SGD([w], lr=0.1, momentum=0.9), compression=hc.Compression.topk(0.01, momentum=0.9)))

# Still in step: a good call works on every rank.
res["after"] = float(hc.allreduce(torch.ones(10), compression=topk, state=hc.CompressionState(10, topk)).sum())
save(r, res)
